"""
The command line: ``cotainr build``/``info`` extended, and ``cotainr-lumi``.

:class:`Build` and :class:`Info` subclass cotainr's subcommands. Through the
start-up hook they replace cotainr's own in the stock ``cotainr`` command;
``cotainr-lumi`` (and ``python -m cotainr_lumi``) use them without the hook.
A build of a stock cotainr system, or a ``--base-image`` build without any
cotainr-lumi option, runs cotainr's own build code unchanged.

Classes
-------
Build
    Build a container.
Info
    Obtain info about the dependencies and the available systems.
CotainrLumiCLI
    Build Apptainer/Singularity containers for LUMI with cotainr-lumi.

Functions
---------
main(*args, **kwargs)
    The ``cotainr-lumi`` entry point.
patch_stock_cli(*, cli_module)
    Make cotainr's CLI use :class:`Build` and :class:`Info`.
"""

import argparse
import logging
import sys

from . import _cotainr, buildoptions
from ._cotainr import seam
from .engine.pipeline import run_plan
from .engine.plan import make_plan
from .engine.profiles import load_systems
from .errors import CotainrLumiError, ImageExistsError

logger = logging.getLogger(f"cotainr.{__name__}")


def _fail(error):
    """Print one error message and exit with the error's code."""
    sys.stderr.write(f"cotainr: error: {error}\n")
    raise SystemExit(getattr(error, "exit_code", 1))


class Build(_cotainr.StockBuild):
    """
    Build a container.

    The "build" subcommand.

    Parameters
    ----------
    image_path : :class:`os.PathLike`
        Path to the built container image.
    base_image : str
        Base image to use for the container which may be any valid
        Apptainer/Singularity <BUILD SPEC>.
    conda_env : :class:`os.PathLike`, optional
        Path to a Conda environment.yml file to install and activate in the
        container. When installing a Conda environment, you must accept the
        Miniforge license terms, as specified during the build process.
    system : str
        Which system/partition you will be running the container on. This sets
        base image and other parameters for a simpler container creation.
        Running the info command will tell you more about the system and what
        is available.
    accept_licenses : bool, default=False
        Accept all license terms (if any) needed for completing the container
        build process.
    verbosity : int, optional
        The verbosity of the output from cotainr: -1 for only CRITICAL, 0 (the
        default) for cotainr INFO and subprocess WARNING, 1 for subprocess
        output as well, 2 for subprocess INFO, 3 for DEBUG, and 4 for TRACE.
    log_to_file : bool
        Create files containing all logging information shown on stdout/stderr.
    no_color : bool
        Do not use colored console output.
    force : bool, default=False
        Overwrite an existing image without asking (for batch jobs). The old
        image is replaced only when the new build succeeds.
    dry_run : bool, default=False
        Print the resolved build plan (base image, stages in order, what each
        will do) and build nothing.
    base_image_override : str, optional
        Use this base image instead of the system's (e.g. your own copy of a
        LUMI base image).
    set_settings : list of str, optional
        Override a stage setting of the system profile, as STAGE.KEY=VALUE
        with VALUE in YAML (repeatable); target-env.prefix=PATH names the
        Python environment of the base image to install into.
    skip_stages : list of str, optional
        Do not run this stage of the system (repeatable).
    """

    def __init__(
        self,
        *,
        image_path,
        base_image=None,
        conda_env=None,
        system=None,
        accept_licenses=False,
        verbosity=0,
        log_to_file=False,
        no_color=False,
        force=False,
        dry_run=False,
        base_image_override=None,
        set_settings=None,
        skip_stages=None,
        **stage_args,
    ):
        """Construct the "build" subcommand."""
        self.log_settings = _cotainr.make_log_settings(
            verbosity=verbosity, log_to_file=log_to_file, no_color=no_color
        )
        try:
            self.request = buildoptions.request_from_options(
                image_path=image_path,
                system=system,
                base_image=base_image,
                conda_env=_cotainr.single_conda_env(conda_env),
                accept_licenses=accept_licenses,
                force=force,
                dry_run=dry_run,
                options=dict(
                    stage_args,
                    base_image_override=base_image_override,
                    set_settings=set_settings,
                    skip_stages=skip_stages,
                ),
            )
            self.plan = make_plan(request=self.request)
            if self.plan.image_exists and not force and not dry_run:
                self._confirm_overwrite()
        except CotainrLumiError as e:
            _fail(e)
        # The attributes cotainr's own Build.execute() uses (stock builds).
        self.image_path = self.plan.image_path
        self.accept_licenses = accept_licenses
        self.base_image = self.plan.base_image.given
        self.conda_env = self.plan.conda_env
        if self.plan.system is not None:
            self.system = {"base-image": self.plan.system.base_image}

    def _confirm_overwrite(self):
        """Ask before overwriting; refuse when nobody can answer."""
        if not sys.stdin or not sys.stdin.isatty():
            raise ImageExistsError(
                f"The image {self.plan.image_path} already exists and there is "
                "no terminal to ask whether to overwrite it. Pass --force to "
                "replace it, or choose another path."
            )
        if not _cotainr.answer_is_yes(
            f"{self.plan.image_path} already exists. Would you like to overwrite it?"
        ):
            sys.stderr.write(
                f"You have chosen not to overwrite {self.plan.image_path}. Exiting.\n"
            )
            raise SystemExit(0)
        self.request.force = True

    @classmethod
    def add_arguments(cls, *, parser):
        """Add arguments to the "build" subcommand subparser."""
        super().add_arguments(parser=parser)
        buildoptions.add_options(
            parser=parser.add_argument_group("cotainr-lumi"), generic=True
        )

    def execute(self):
        """Execute the "build" subcommand."""
        if self.request.dry_run:
            self.plan.ask_base_image()
            print(self.plan.describe())
            return
        if not self.plan.extended:
            # A stock build: cotainr's own code, unchanged (but no spinner
            # escape codes when stdout is a log file).
            with _cotainr.spinner_only_on_terminal():
                super().execute()
            return
        try:
            result = run_plan(plan=self.plan, log_settings=self.log_settings)
        except CotainrLumiError as e:
            logger.error("%s", e)
            logger.error("No image was written to %s.", self.plan.image_path)
            raise SystemExit(getattr(e, "exit_code", 1)) from None
        for report in result.reports:
            hint = report.details.get("run-hint") if report.details else None
            if hint:
                logger.info("%s", hint)


class Info(_cotainr.StockInfo):
    """
    Obtain info about the state of all required dependencies for building a container.

    The "info" subcommand; also lists the cotainr-lumi systems.
    """

    profile_error = None

    def execute(self):
        """Execute the "info" subcommand; exit non-zero if a profile is broken."""
        super().execute()
        if self.profile_error is not None:
            raise SystemExit(getattr(self.profile_error, "exit_code", 1))

    def _check_systems(self):
        """Report the available systems (stock and cotainr-lumi)."""
        try:
            systems = load_systems()
        except CotainrLumiError as e:
            self.profile_error = e
            return f"Cannot read the system profiles: {e}"
        if not systems:
            return "No system configurations available"
        lines = ["Available system configurations:"]
        for name, system in systems.items():
            kind = "stock" if system.stock else "cotainr-lumi"
            lines.append(
                f"\t- {name} [{kind}] base image: {system.base_image}".expandtabs(4)
            )
            if system.description and not system.stock:
                lines.append(f"\t    {system.description}".expandtabs(4))
        return "\n".join(lines)


class _SeamInfo(_cotainr.StockInfo):
    """
    Obtain info about the state of all required dependencies for building a container.

    The "info" subcommand of ``cotainr-lumi`` on a cotainr with the build
    stage seam: cotainr's own report (which lists the cotainr-lumi systems
    through the systems source), then a non-zero exit if a profile is broken.
    """

    def execute(self):
        """Execute the "info" subcommand; exit non-zero if a profile is broken."""
        super().execute()
        try:
            load_systems()
        except CotainrLumiError as e:
            print(f"Cannot read the system profiles: {e}")
            raise SystemExit(getattr(e, "exit_code", 1)) from None


#: The seam path's "info" for ``cotainr-lumi`` (the subcommand name is the
#: class name, lower case).
SeamInfo = type("Info", (_SeamInfo,), {"__doc__": _SeamInfo.__doc__})


class Verify(_cotainr.StockSubcommand):
    """
    Check an image against the hand-built LUMI PyTorch image.

    The "verify" subcommand: one row per check (PASS / FAIL / N/A with the
    evidence) and a summary; exits non-zero if any check fails.

    Parameters
    ----------
    image : :class:`os.PathLike`
        The .sif image to check.
    json : bool
        Print the report as JSON.
    """

    def __init__(self, *, image, json=False):
        """Construct the "verify" subcommand."""
        self.image = image
        self.json = json

    @classmethod
    def add_arguments(cls, *, parser):
        """Add arguments to the "verify" subcommand subparser."""
        parser.add_argument(
            "image",
            help=_cotainr.extract_help_from_docstring(
                arg="image", docstring=cls.__doc__
            ),
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help=_cotainr.extract_help_from_docstring(
                arg="json", docstring=cls.__doc__
            ),
        )

    def execute(self):
        """Execute the "verify" subcommand."""
        from .verify.checks import verify_image

        try:
            report = verify_image(image=self.image)
        except CotainrLumiError as e:
            _fail(e)
        print(report.as_json() if self.json else report.as_text())
        if report.failed:
            raise SystemExit(1)


class CotainrLumiCLI(_cotainr.StockCLI):
    """
    Build Apptainer/Singularity containers for LUMI with cotainr-lumi.

    The ``cotainr-lumi`` command: cotainr's CLI with the cotainr-lumi build
    and info subcommands, without relying on the start-up hook.

    Parameters
    ----------
    args : list of str, optional
        The input arguments to the CLI (default: ``sys.argv``).
    """

    def __init__(self, *, args=None):
        """Construct the command line interface."""
        from ._version import __version__

        build, info = activated_subcommands()
        if info is _cotainr.StockInfo:
            info = SeamInfo
        subcommands = [build, info, Verify]

        parser = argparse.ArgumentParser(
            prog="cotainr-lumi", description=self.__doc__.strip().splitlines()[0]
        )
        parser.add_argument(
            "--version",
            action="version",
            version=(f"%(prog)s {__version__} (cotainr {_cotainr.cotainr_version()})"),
        )
        subparsers = parser.add_subparsers(title="subcommands")
        for subcommand_cls in subcommands:
            summary = subcommand_cls.__doc__.strip().splitlines()[0]
            sub_parser = subparsers.add_parser(
                name=subcommand_cls.__name__.lower(), help=summary, description=summary
            )
            subcommand_cls.add_arguments(parser=sub_parser)
            sub_parser.set_defaults(subcommand_cls=subcommand_cls)
        self.args = parser.parse_args(args=args)
        subcommand_args = {
            k: v for k, v in vars(self.args).items() if k != "subcommand_cls"
        }
        if not hasattr(self.args, "subcommand_cls"):
            parser.print_help()
            raise SystemExit(0)
        if self.args.subcommand_cls is _cotainr.StockBuild:
            # The seam path: cotainr looks the system up before any stage
            # runs, and reads broken cotainr-lumi profiles as "no systems".
            try:
                load_systems()
            except CotainrLumiError as e:
                _fail(e)
        self.subcommand = self.args.subcommand_cls(**subcommand_args)
        _cotainr.setup_cli_logging(
            log_settings=getattr(
                self.subcommand, "log_settings", _cotainr.make_log_settings()
            )
        )


def activated_subcommands():
    """
    The ``build`` and ``info`` subcommands with cotainr-lumi active.

    On a cotainr with the public build stage seam these are cotainr's own
    (with the cotainr-lumi stage and systems registered); otherwise the
    :class:`Build` and :class:`Info` subclasses (the fallback path).

    Returns
    -------
    subcommands : list of type
        The build and info subcommand classes.
    """
    if seam.has_build_stage_seam():
        from .seamstage import register

        register()
        return [_cotainr.StockBuild, _cotainr.StockInfo]
    return [Build, Info]


def patch_stock_cli(*, cli_module):
    """
    Make cotainr's CLI use :class:`Build` and :class:`Info`.

    Parameters
    ----------
    cli_module : module
        The ``cotainr.cli`` module.
    """
    replacements = {cli_module.Build: Build, cli_module.Info: Info}
    cli_module.CotainrCLI._subcommands = [
        replacements.get(cls, cls) for cls in cli_module.CotainrCLI._subcommands
    ]


def main(*args, **kwargs):
    """The ``cotainr-lumi`` entry point."""
    try:
        _cotainr.check_cotainr_version()
    except CotainrLumiError as e:
        _fail(e)
    cli = CotainrLumiCLI()
    cli.subcommand.execute()


__all__ = [
    "Build",
    "Info",
    "Verify",
    "CotainrLumiCLI",
    "activated_subcommands",
    "main",
    "patch_stock_cli",
]
