"""
cotainr-lumi as one build stage on cotainr's public build stage seam.

On a cotainr with the upstream seam (see ``docs/upstream/``), cotainr creates
the sandbox, installs the conda environment, adds the metadata and builds the
image (atomically, with ``--force``/``--dry-run`` of its own). cotainr-lumi
adds one build stage, "cotainr-lumi", that runs the plan's stages (pip,
prune, lumi-env, provenance, ...) in between, and a systems source that adds
the systems of its profiles. The stages, profiles and options are the same
code as on the fallback path (:class:`cotainr_lumi.cli.Build`).

Classes
-------
LumiStage
    The cotainr-lumi build stage (combined with cotainr's ``BuildStage``).

Functions
---------
lumi_systems()
    The cotainr-lumi systems, in cotainr's ``systems.json`` format.
register()
    Register the stage and the systems source with cotainr.
"""

import contextlib
import logging
import sys

from . import _cotainr, buildoptions
from ._cotainr import seam
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
from .errors import CotainrLumiError

logger = logging.getLogger(f"cotainr.{__name__}")

_listing_systems = False


def lumi_systems():
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
    if _listing_systems:  # load_systems() asks cotainr for its own systems
        return {}
    _listing_systems = True
    try:
        systems = load_systems()
    except CotainrLumiError as e:
        logger.warning("cotainr-lumi systems are not available: %s", e)
        return {}
    finally:
        _listing_systems = False
    return {
        name: {"base-image": system.base_image, "description": system.description}
        for name, system in systems.items()
        if not system.stock
    }


def _stop(error, *, image_path):
    """Report one clear error and stop the build (no image is written)."""
    logger.error("%s", error)
    logger.error("No image was written to %s.", image_path)
    raise SystemExit(getattr(error, "exit_code", 1))


class LumiStage:
    """
    Run the cotainr-lumi stages of the build plan.

    Parameters
    ----------
    plan : :class:`cotainr_lumi.engine.plan.BuildPlan`
        The plan (an extended build).
    log_settings : :class:`cotainr.tracing.LogSettings`
        The build's log settings.
    """

    name = "cotainr-lumi"

    def __init__(self, *, plan, log_settings=None):
        self.plan = plan
        self.log_settings = log_settings
        self.outputs = {}
        self.reports = []
        self._restore = contextlib.ExitStack()

    @classmethod
    def add_arguments(cls, *, parser):
        """
        Add the cotainr-lumi options (without cotainr's own ``--force``/``--dry-run``).

        Parameters
        ----------
        parser : argument group
            The stage's group of the ``build`` parser.
        """
        buildoptions.add_options(parser=parser, generic=False)

    @classmethod
    def from_build(cls, *, build, options):
        """
        The stage for an extended build, None for a stock one.

        Parameters
        ----------
        build : :class:`cotainr.cli.Build`
            cotainr's build (system, base image, conda env already resolved).
        options : dict
            The cotainr-lumi options by destination name.

        Returns
        -------
        stage : LumiStage or None
            None when the build is a stock cotainr build (it then runs
            exactly as without cotainr-lumi).
        """
        system = getattr(build, "system_name", None)
        try:
            request = buildoptions.request_from_options(
                image_path=build.image_path,
                system=system,
                base_image=None if system is not None else build.base_image,
                conda_env=_cotainr.single_conda_env(build.conda_env),
                accept_licenses=build.accept_licenses,
                force=False,
                dry_run=bool(getattr(build, "dry_run", False)),
                options=options,
            )
            plan = make_plan(request=request)
        except CotainrLumiError as e:
            sys.stderr.write(f"cotainr: error: {e}\n")
            raise SystemExit(getattr(e, "exit_code", 1)) from None
        if not plan.extended:
            return None
        stage = cls(plan=plan, log_settings=build.log_settings)
        base = plan.base_image
        # Build from the resolved base image so that the provenance labels
        # record the image really used.
        build.base_image = base.resolved
        if not plan.request.dry_run:
            log_resolved_base_image(base)
            stage._restore.enter_context(without_bind_variables())
        return stage

    def describe(self):
        """
        The plan, for ``cotainr build --dry-run``.

        Returns
        -------
        lines : list of str
            The plan's description.
        """
        return self.plan.describe().splitlines()

    def run(self, *, sandbox):
        """
        Run the plan's stages on cotainr's sandbox.

        Parameters
        ----------
        sandbox : :class:`cotainr.container.SingularitySandbox`
            The sandbox (after cotainr's conda step).

        Returns
        -------
        labels : dict of str to str
            The labels the stages add.
        """
        context = StageContext(
            sandbox=_cotainr.Sandbox.wrap(
                stock=sandbox, log_settings=self.log_settings
            ),
            plan=self.plan,
        )
        current = "cotainr-lumi"
        try:
            for stage in self.plan.stages:
                current = stage.name
                run_stage(stage=stage, context=context)
            current = "outputs"
            self.outputs = check_outputs(context.reports)
        except Exception as e:
            self._restore.close()
            _stop(as_stage_error(e, stage=current), image_path=self.plan.image_path)
        self.reports = list(context.reports)
        return dict(context.labels)

    def after_build(self, *, image_path):
        """
        Write the stages' host files and print how to run the image.

        Parameters
        ----------
        image_path : :class:`pathlib.Path`
            The built image.
        """
        from .engine.pipeline import write_outputs

        self._restore.close()
        try:
            write_outputs(self.outputs)
        except OSError as e:
            logger.error("%s", as_stage_error(e, stage="outputs"))
            logger.error(
                "The image %s was built; the files next to it were not.", image_path
            )
            raise SystemExit(1) from None
        for report in self.reports:
            hint = report.details.get("run-hint") if report.details else None
            if hint:
                logger.info("%s", hint)


def register():
    """
    Register the stage and the systems source with cotainr.

    Returns
    -------
    stage_cls : type
        cotainr's ``BuildStage`` subclass for :class:`LumiStage`.
    """
    return seam.register(stage_logic=LumiStage, systems_source=lumi_systems)
