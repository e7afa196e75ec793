"""
cotainr-lumi as a cotainr plugin: its systems and its build stage.

This module is the ``cotainr.plugins`` entry point. A cotainr with the
upstream series (``docs/upstream/``) loads it itself and reads
:func:`systems` and :data:`build_stages`; on a stock cotainr the start-up
hook calls :func:`on_stock_cotainr`, which installs the backport of the same
seam (:mod:`cotainr_lumi._cotainr.backport`). Either way cotainr's own
``Build.execute`` creates the sandbox, installs the conda env, adds the
metadata and builds the image, and :class:`LumiStage` runs the plan's stages
(pip, prune, lumi-env, provenance, ...) in between.

Classes
-------
LumiStage
    The cotainr-lumi build stage.

Functions
---------
systems()
    The cotainr-lumi systems, in cotainr's ``systems.json`` format.
on_stock_cotainr(cli_module)
    Install the backport of the seam on a cotainr without it.
disabled()
    Whether ``COTAINR_LUMI_DISABLE`` turns cotainr-lumi off.

Attributes
----------
build_stages : tuple of type
    The build stages this plugin adds (none when :func:`disabled`).
"""

import atexit
import contextlib
import logging
import os
import sys

from . import _cotainr, buildoptions, imagelayout
from .engine import history, rocmwindow
from .engine.pipeline import (
    as_stage_error,
    check_outputs,
    log_resolved_base_image,
    run_stage,
    without_bind_variables,
)
from .engine.plan import make_plan
from .engine.profiles import load_systems
from .engine.stage import StageContext
from .engine.workdir import work_dir_environment
from .errors import CotainrLumiError, UnsupportedCotainrError

logger = logging.getLogger(f"cotainr.{__name__}")

_listing_systems = False


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
    global _listing_systems
    if _listing_systems or disabled():  # load_systems() asks cotainr for its own
        return {}
    _listing_systems = True
    try:
        loaded = load_systems()
    except CotainrLumiError as e:
        logger.warning("cotainr-lumi systems are not available: %s", e)
        return {}
    finally:
        _listing_systems = False
    return {
        name: {"base-image": system.base_image, "description": system.description}
        for name, system in loaded.items()
        if not system.stock
    }


class LumiStage(_cotainr.BuildStage):
    """
    Run the cotainr-lumi stages of the build plan.

    Parameters
    ----------
    plan : :class:`cotainr_lumi.engine.plan.BuildPlan`
        The plan (an extended build).
    log_settings : :class:`cotainr.tracing.LogSettings`, optional
        The build's log settings.

    Attributes
    ----------
    labels : dict of str to str
        The labels the stages added (after :meth:`run`).
    reports : list of :class:`cotainr_lumi.engine.stage.StageReport`
        One report per stage (after :meth:`run`).
    """

    name = "cotainr-lumi"

    def __init__(self, *, plan, log_settings=None):
        self.plan = plan
        self.log_settings = log_settings
        self.labels = {}
        self.reports = []
        self._restore = contextlib.ExitStack()
        self._work_dir = contextlib.ExitStack()

    @classmethod
    def add_arguments(cls, *, parser):
        """
        Add the cotainr-lumi options.

        Parameters
        ----------
        parser : argument group
            The stage's group of the ``build`` parser.
        """
        buildoptions.add_options(parser=parser, generic=False)

    @classmethod
    def from_context(cls, *, context):
        """
        The stage for an extended build, None for a stock one.

        Parameters
        ----------
        context : BuildContext
            The build (system, base image, conda env, the stage's options).

        Returns
        -------
        stage : LumiStage or None
            None when the build is a stock cotainr build (it then runs
            exactly as without cotainr-lumi).
        """
        try:
            request = buildoptions.request_from_options(
                image_path=context.image_path,
                system=context.system,
                base_image=None if context.system is not None else context.base_image,
                conda_env=list(context.conda_env_files) or None,
                accept_licenses=False,
                force=False,
                dry_run=context.dry_run,
                options=context.options,
            )
            if context.conda_prefix and context.conda_env_name:
                request.conda_env_prefix = (
                    f"{context.conda_prefix}/envs/{context.conda_env_name}"
                )
            plan = make_plan(request=request)
        except CotainrLumiError as e:
            sys.stderr.write(f"cotainr: error: {e}\n")
            raise SystemExit(e.exit_code) from None
        if not plan.extended:
            return None
        stage = cls(plan=plan, log_settings=context.log_settings)
        # Build from the resolved base image so that the provenance labels
        # record the image really used.
        context.base_image = plan.base_image.resolved
        if not context.dry_run:
            try:
                plan.check_space()
            except CotainrLumiError as e:
                sys.stderr.write(f"cotainr: error: {e}\n")
                raise SystemExit(e.exit_code) from None
            log_resolved_base_image(plan.base_image)
            stage._restore.enter_context(without_bind_variables())
            stage._work_dir.enter_context(work_dir_environment(plan.work_dir))
            # The build's directory goes when the process ends, also after a
            # successful build (the seam has no after-build hook); a failed
            # build and the Python API close it at once.
            atexit.register(stage._work_dir.close)
        return stage

    def describe(self):
        """
        The plan, for ``cotainr build --dry-run``.

        Returns
        -------
        lines : list of str
            The plan's description.
        """
        try:
            self.plan.ask_base_image()
        except CotainrLumiError as e:
            sys.stderr.write(f"cotainr: error: {e}\n")
            raise SystemExit(e.exit_code) from None
        return self.plan.describe().splitlines()

    def run(self, *, context):
        """
        Run the plan's stages on the build's sandbox.

        Parameters
        ----------
        context : BuildContext
            The build, with its sandbox (after cotainr's conda step).

        Returns
        -------
        labels : dict of str to str
            The labels the stages add.
        """
        stage_context = StageContext(
            sandbox=_cotainr.Sandbox(
                stock=context.sandbox, log_settings=self.log_settings
            ),
            plan=self.plan,
        )
        current = self.name
        try:
            root = stage_context.sandbox.root
            earlier = history.keep_earlier_build(root=root)
            if earlier is not None:
                stage_context.labels[imagelayout.LABEL_HISTORY] = str(earlier)
            _cotainr.prepare_for_cotainr_metadata(root=root)
            current = rocmwindow.SETTINGS_NAME
            rocmwindow.check_build(context=stage_context, phase="start")
            for stage in self.plan.stages:
                current = stage.name
                run_stage(stage=stage, context=stage_context)
            current = rocmwindow.SETTINGS_NAME
            rocmwindow.check_build(context=stage_context, phase="end")
            current = "outputs"
            outputs = check_outputs(stage_context.reports)
        except Exception as e:
            error = as_stage_error(e, stage=current)
            stage_error = _cotainr.StageError(str(error))
            stage_error.exit_code = error.exit_code
            raise stage_error from error
        for path, content in outputs.items():
            context.add_output(
                path=path, content=content, executable=content.startswith("#!")
            )
        self.reports = list(stage_context.reports)
        self.labels = dict(stage_context.labels)
        for report in self.reports:
            hint = report.details.get("run-hint") if report.details else None
            if hint:
                context.add_message(text=hint)
        self._restore.close()
        return dict(self.labels)

    def on_failure(self, *, context, error):
        """
        Say that no image was written; restore the bind variables.

        Parameters
        ----------
        context : BuildContext
            The build.
        error : BaseException
            What stopped it.
        """
        self._restore.close()
        self._work_dir.close()
        logger.error("No image was written to %s.", context.image_path)

    def close(self):
        """Restore the environment the build changed (for library callers)."""
        self._restore.close()
        self._work_dir.close()


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
    """``build_stages``: the build stages of this plugin (read by cotainr's seam)."""
    if name == "build_stages":
        return () if disabled() else (LumiStage,)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def on_stock_cotainr(cli_module):
    """
    Install the backport of the seam on a cotainr without it.

    Called by the start-up hook right after ``cotainr.cli`` is imported.
    Does nothing on a cotainr with the seam.

    Parameters
    ----------
    cli_module : module
        The ``cotainr.cli`` module.

    Raises
    ------
    :class:`cotainr_lumi.errors.UnsupportedCotainrError`
        If cotainr does not behave as the backport needs (nothing is changed
        then; stock cotainr keeps working).
    """
    if _cotainr.has_build_stage_seam():
        return
    _cotainr.check_cotainr_version()
    from ._cotainr import backport

    backport.install(cli_module=cli_module)


__all__ = [
    "LumiStage",
    "UnsupportedCotainrError",
    "disabled",
    "on_stock_cotainr",
    "systems",
]
