"""cotainr's sandbox: the view :func:`layered` holds, mounted (issue 30)."""

import contextlib
import logging
from pathlib import Path
import types

logger = logging.getLogger(f"cotainr.{__name__}")

_state = types.SimpleNamespace(view=None, write_sif=None)


@contextlib.contextmanager
def layered(view):
    """Meanwhile cotainr's sandboxes are `view` (unmounted at the end)."""
    _state.view = view
    try:
        yield view
    finally:
        _state.view = None
        view.unmount()


@contextlib.contextmanager
def whole_images(write_sif):
    """Meanwhile ``write_sif(sandbox_dir=, path=, architecture=)`` writes whole images."""
    _state.write_sif = write_sif
    try:
        yield
    finally:
        _state.write_sif = None


def _write_sif(sandbox, path):
    """Whether :func:`whole_images`' writer wrote the image (else Apptainer builds it)."""
    if _state.write_sif is None:
        return False
    written = _state.write_sif(
        sandbox_dir=Path(sandbox.sandbox_dir),
        path=Path(path),
        architecture=sandbox.architecture,
    )
    return written is not None


def install(sandbox):
    """Wrap ``__enter__``, ``__exit__`` and ``build_image`` of `sandbox` (once)."""
    if getattr(sandbox, "_cotainr_lumi_layering", False):
        return
    enter, exit_, build_image = sandbox.__enter__, sandbox.__exit__, sandbox.build_image

    def mounted_enter(self):
        view, runner = _state.view, getattr(self, "_subprocess_runner", None)
        if view is None or runner is None:
            return enter(self)

        def mount_instead_of_unpacking(*, args, **kwargs):
            if "--sandbox" not in map(str, args):
                return runner(args=args, **kwargs)
            try:
                return view.mount(at=Path(self.sandbox_dir))
            except Exception as e:  # noqa: BLE001 - unpacked as without layers
                logger.warning("The base image is unpacked (not mounted): %s", e)
                return runner(args=args, **kwargs)

        self._subprocess_runner = mount_instead_of_unpacking
        try:
            return enter(self)
        except BaseException:
            view.unmount()
            raise
        finally:
            del self._subprocess_runner

    def unmounted_exit(self, *args):
        if _state.view is not None:  # before cotainr removes the sandbox dir
            _state.view.unmount()
        return exit_(self, *args)

    def layer_or_build_image(self, *args, **kwargs):
        view, path = _state.view, kwargs.get("path", args[0] if args else None)
        mounted = view is not None and view.merged == Path(self.sandbox_dir)
        if not (mounted and view.write_image(path=path)) and not _write_sif(self, path):
            return build_image(self, *args, **kwargs)

    sandbox.__enter__, sandbox.__exit__ = mounted_enter, unmounted_exit
    sandbox.build_image = layer_or_build_image
    sandbox._cotainr_lumi_layering = True
