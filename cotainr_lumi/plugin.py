"""
cotainr-lumi as a cotainr plugin: its systems and its build hook.

This module is the ``cotainr.plugins`` entry point: cotainr (or, on a
cotainr without plugin support, :mod:`cotainr_lumi._cotainr.shim`) reads
:func:`systems` and calls :data:`build_hook` (``docs/upstream/seam-api.md``).
The hook only adapts cotainr's calls to the steps of
:class:`cotainr_lumi.pipeline.build.Build`, where a build happens.
"""

import contextlib
import logging
import os
from pathlib import Path
import sys

from . import _cotainr
from .errors import CotainrLumiError, InputError, UnknownSystemError, redact

logger = logging.getLogger(f"cotainr.{__name__}")


def systems():
    """
    The cotainr-lumi systems, in cotainr's ``systems.json`` format.

    Returns
    -------
    systems : dict
        ``{name: {"base-image": ..., "description": ...}}`` for the systems
        of the cotainr-lumi profiles (not cotainr's own). Empty (with a
        warning) when a profile file is invalid.
    """
    from .pipeline.profiles import load_systems

    if disabled():
        return {}
    try:
        loaded = load_systems(include_stock=False)
    except CotainrLumiError as e:
        logger.warning("cotainr-lumi systems are not available: %s", e)
        return {}
    return {
        name: {"base-image": _base_image(system), "description": system.description}
        for name, system in loaded.items()
    }


def _base_image(system):
    """The file a glob base image matches (the glob when not one: the build says)."""
    from .pipeline.plan import match_base_image

    try:
        return match_base_image(system.base_image, system=system.name)
    except InputError:
        return system.base_image


def system_problem(name):
    """The one line for a ``--system`` the profiles retired (else None)."""
    from .pipeline.profiles import load_systems

    try:
        message = load_systems(include_stock=False).removed.get(name)
    except CotainrLumiError:
        message = None
    if not message:
        return None
    return str(UnknownSystemError(name, available=(), removed=message))


@contextlib.contextmanager
def _reported():
    """Meanwhile, a cotainr-lumi error is a plugin error of cotainr (one line)."""
    try:
        yield
    except CotainrLumiError as e:
        raise _cotainr.plugin_error(e) from e


class LumiHook:
    """
    cotainr-lumi's build hook (API version 1, ``docs/upstream/seam-api.md``).

    It adapts the hook's calls to the steps of
    :class:`cotainr_lumi.pipeline.build.Build`, where a build happens.

    Attributes
    ----------
    build : Build or None
        The build of the last :meth:`prepare` that took part.
    """

    api_version = 1

    def __init__(self):
        self.build = None
        self._handed = None  # a build the Python API made (see :meth:`running`)
        self._base_used = None
        self._argv = None

    @contextlib.contextmanager
    def running(self, build):
        """Meanwhile, :meth:`prepare` takes `build` instead of making one."""
        self._handed = build
        try:
            yield build
        finally:
            self._handed = None

    def add_arguments(self, *, parser):
        """Add the cotainr-lumi options to the plugin's group of ``cotainr build``."""
        from .buildoptions import add_options

        add_options(parser=parser)

    def prepare(self, *, context):
        """
        Make the plan of a build; None for a build cotainr-lumi takes no part in.

        Returns
        -------
        lines : list of str or None
            The plan, for ``--dry-run``.
        """
        from .buildoptions import request_from_options
        from .pipeline.build import Build
        from .pipeline.checks import check_conda_prefix, refuse_base_links
        from .pipeline.describe import dry_run_lines
        from .pipeline.plan import make_plan

        self.build = None
        with _reported():
            check_conda_prefix(context.conda_prefix)
            build = self._handed
            if build is None:
                conda_env = list(context.conda_env_files) or None
                request = request_from_options(context=context, conda_env=conda_env)
                build = Build(plan=make_plan(request=request))
            if not build.plan.extended:
                return None
            refuse_base_links(build.plan)
            if context.dry_run:
                return dry_run_lines(build.plan)
            build.start()
        self.build = build
        self._base_used = os.path.abspath(context.base_image)  # (cotainr chdirs)
        return []

    def sandbox(self, *, context, sandbox_dir):
        """Mount the base image at `sandbox_dir`: its release (None: unpack it)."""
        with _reported():
            return self.build.sandbox(sandbox_dir=sandbox_dir)

    def customize(self, *, sandbox, context):
        """
        Run the stages on the sandbox, after cotainr's conda step.

        The labels of the stages go into the sandbox's ``labels.json``, where
        cotainr's metadata step adds its own.
        """
        from .engine import history

        with _reported():
            labels = self.build.customize(
                sandbox=_cotainr.Sandbox(stock=sandbox),
                base_image_used=self._base_used,
            )
        # cotainr records the command line next (cotainr.command): without
        # credentials; finalize gives the caller its own sys.argv back.
        self._argv = sys.argv
        sys.argv = [redact(arg) for arg in sys.argv]
        if not _cotainr.NATIVE:  # stock cotainr rewrites labels.json in place
            base = history.read_labels(root=Path(sandbox.sandbox_dir)) or {}
            final = {**base, **labels, "cotainr.command": " ".join(sys.argv)}
            labels.update(_cotainr.stock_cotainr_pad(labels=final))
        _cotainr.write_labels(sandbox=sandbox, labels=labels)

    def write_image(self, *, sandbox, context, path):
        """Write the image at `path`: True, or False when cotainr builds it."""
        with _reported():
            return self.build.write_image(
                path=path,
                sandbox_dir=sandbox.sandbox_dir,
                architecture=sandbox.architecture,
            )

    def finalize(self, *, context, error):
        """Write the host files once the image is built; say so when it is not."""
        from .pipeline.checks import cotainr_failure

        build = self.build
        if build is None:
            return
        if self._argv is not None:
            sys.argv = self._argv
            self._argv = None
        build.finish(error=error)
        if isinstance(error, Exception) and not isinstance(error, _cotainr.PluginError):
            failure = cotainr_failure(error, plan=build.plan)
            raise _cotainr.plugin_error(failure) from error


#: Turns cotainr-lumi off (the start-up hook's switch too; the hook is
#: installed at the top of site-packages, outside this package, in a wheel).
DISABLE_ENV_VAR = "COTAINR_LUMI_DISABLE"


def disabled():
    """
    Whether ``COTAINR_LUMI_DISABLE`` turns cotainr-lumi off.

    A cotainr that discovers plugins itself (upstream series) loads this
    module whatever the start-up hook does; the plugin then offers no system
    and no stage, so cotainr runs as if it were not installed.

    Returns
    -------
    off : bool
        True when the variable is set to a value other than "" or "0".
    """
    return os.environ.get(DISABLE_ENV_VAR, "") not in ("", "0")


def __getattr__(name):
    """``build_hook``: the hook cotainr calls (None when :func:`disabled`)."""
    if name == "build_hook":
        return None if disabled() else HOOK
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The one hook object of this plugin.
HOOK = LumiHook()


__all__ = ["HOOK", "LumiHook", "disabled", "systems"]
