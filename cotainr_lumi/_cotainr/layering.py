"""
cotainr's sandbox as a mounted view of its base (layered builds, issue 30).

While :func:`layered` holds a view (``engine/layer.py``'s ``BaseView``), the
sandbox of cotainr's ``SingularitySandbox`` is that view mounted instead of
the base unpacked, and ``build_image`` writes the view's layer when it can.
"""

import contextlib
import functools
import logging
from pathlib import Path
import types

logger = logging.getLogger(f"cotainr.{__name__}")

_state = types.SimpleNamespace(view=None)


@contextlib.contextmanager
def layered(view):
    """Meanwhile cotainr's sandboxes are `view` (unmounted at the end)."""
    _state.view = view
    try:
        yield view
    finally:
        _state.view = None
        view.unmount()


def _enter(original):
    @functools.wraps(original)
    def enter(self):
        view, runner = _state.view, getattr(self, "_subprocess_runner", None)
        if view is None or runner is None:
            return original(self)

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
            return original(self)
        except BaseException:
            view.unmount()
            raise
        finally:
            del self._subprocess_runner

    return enter


def _exit(original):
    @functools.wraps(original)
    def exit_(self, *args):
        if _state.view is not None:  # before cotainr removes the sandbox dir
            _state.view.unmount()
        return original(self, *args)

    return exit_


def _build_image(original):
    @functools.wraps(original)
    def build_image(self, *args, **kwargs):
        view, path = _state.view, kwargs.get("path", args[0] if args else None)
        mounted = view is not None and view.merged == Path(self.sandbox_dir)
        if mounted and view.write_image(path=path):
            return None
        return original(self, *args, **kwargs)

    return build_image


def install(sandbox):
    """Wrap the methods of cotainr's sandbox class `sandbox` (once)."""
    if not getattr(sandbox, "_cotainr_lumi_layering", False):
        sandbox.__enter__ = _enter(sandbox.__enter__)
        sandbox.__exit__ = _exit(sandbox.__exit__)
        sandbox.build_image = _build_image(sandbox.build_image)
        sandbox._cotainr_lumi_layering = True
