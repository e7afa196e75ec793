"""
The ``cotainr-lumi`` command.

``build`` and ``info`` are cotainr's own subcommands with the cotainr-lumi
plugin active (cotainr's build hook, or the shim of it), ``verify`` checks a
built image, ``check-host`` the host. The command works without the start-up hook.
"""

import argparse
from dataclasses import dataclass
import signal
import sys
from typing import Optional

from . import console, processes
from .errors import CotainrLumiError, InputError, UnsupportedCotainrError, fail

#: Why cotainr cannot be used (None: it can): every command is that one error.
COTAINR_MISSING = None
try:
    from . import _cotainr
except UnsupportedCotainrError as e:
    COTAINR_MISSING = e


class Report:
    """A subcommand printing a report (``report()``): text, or JSON with ``--json``."""

    def execute(self):
        """Print the report; exit 1 when a row failed, 2 on bad input."""
        try:
            report = self.report()
        except CotainrLumiError as e:
            fail(e)
        print(report.as_json() if self.json else report.as_text())
        if report.failed:
            raise SystemExit(1)


@dataclass
class Verify(Report):
    """
    Check an image against the hand-built LUMI PyTorch image.

    The "verify" subcommand: one row per check (PASS / FAIL / N/A with the
    evidence) and a summary; exits non-zero if any check fails.
    """

    image: str
    json: bool = False
    strict: bool = False
    timeout: float = 600

    def report(self):
        """The report (a signal stops the container it started)."""
        from .verify.checks import verify_image

        try:  # a signal is an exception: exec_in_image kills the container
            with processes.stop_cleanly_on_signals():
                return verify_image(
                    image=self.image, strict=self.strict, timeout=self.timeout
                )
        except processes.BuildInterruptedError as e:
            fail(
                f"verify was interrupted by {signal.Signals(e.signum).name}; the "
                "container it started was stopped",
                exit_code=e.exit_code,
            )


@dataclass
class CheckHost(Report):
    """
    Check the host facts the system profiles rely on (after a LUMI update).

    The "check-host" subcommand: one row per fact (binds, base images, ROCm,
    host MPI) with the fix; exits non-zero if a fact is stale.
    """

    json: bool = False
    system: Optional[str] = None
    root: str = "/"

    def report(self):
        """The report of the host under ``--root``."""
        from .verify.hostcheck import check_host

        return check_host(root=self.root, system=self.system)


def _parser():
    """The ``cotainr-lumi`` parser (build/info are handed to cotainr)."""
    from ._version import __version__

    parser = argparse.ArgumentParser(
        prog="cotainr-lumi",
        description=CotainrLumiCLI.__doc__.strip().splitlines()[0],
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__} (cotainr {_cotainr.COTAINR_VERSION})",
    )
    subparsers = parser.add_subparsers(title="subcommands")
    for name, summary in (
        ("build", "Build a container (cotainr's build with cotainr-lumi)."),
        ("info", "Obtain info about the dependencies and the available systems."),
    ):
        subparsers.add_parser(name, help=summary, add_help=False)
    summary = Verify.__doc__.strip().splitlines()[0]
    verify = subparsers.add_parser("verify", help=summary, description=summary)
    verify.set_defaults(command=Verify)
    verify.add_argument("image", help="the .sif image to check")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument(
        "--strict",
        action="store_true",
        help="fail on warnings too (a ROCm outside what LUMI's GPU driver "
        "supports, torch and the base's ROCm disagreeing)",
    )
    verify.add_argument(
        "--timeout",
        type=float,
        default=600,
        metavar="SECONDS",
        help="the most seconds for all runs in the image (default: 600)",
    )
    summary = CheckHost.__doc__.strip().splitlines()[0]
    check = subparsers.add_parser("check-host", help=summary, description=summary)
    check.set_defaults(command=CheckHost)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--system", metavar="NAME", help="check one system only")
    check.add_argument(
        "--root", default="/", metavar="DIR", help="the host tree (default: /)"
    )
    return parser


def _cotainr_subcommand(name, *, args):
    """The ``build`` or ``info`` of cotainr for `args`, with the plugin active."""
    if name == "build" and not {"-h", "--help"} & set(args):
        # cotainr reads a broken profile file as "no such system";
        # the cotainr-lumi command says what is wrong with it.
        from .pipeline.profiles import load_systems

        load_systems()
    try:
        return _cotainr.cotainr_subcommand(args=args)
    except (OSError, RuntimeError) as e:
        # cotainr's Build resolves the paths it is given (a symlink
        # loop, an unreadable directory) before any plugin runs.
        if isinstance(e, RuntimeError) and "Symlink loop" not in str(e):
            raise
        raise InputError(
            f"A path given to build cannot be resolved ({e}); give a "
            "path without a symlink loop, in a directory you can read."
        ) from None


class CotainrLumiCLI:
    """Build Apptainer/Singularity containers for LUMI with cotainr-lumi."""

    def __init__(self, *, args=None):
        args = list(sys.argv[1:] if args is None else args)
        self.name = next((a for a in args if not a.startswith("-")), None)
        if self.name in ("build", "info"):  # cotainr's, with the plugin active
            self.subcommand = _cotainr_subcommand(self.name, args=args)
            return
        parser = _parser()
        options = vars(parser.parse_args(args=args))
        if self.name is None:  # no subcommand
            parser.print_help()
            raise SystemExit(0)
        self.subcommand = options.pop("command")(**options)
        quiet = -int(options.get("json", False))  # --json: the report alone on stdout
        console.setup_logging(verbosity=quiet)

    def execute(self):
        """Run the subcommand; one error line for a failed build stage."""
        if self.name == "info":
            return self._info()
        try:
            self.subcommand.execute()
        except (_cotainr.PluginError, processes.BuildInterruptedError) as e:
            fail(e)

    def _info(self):
        """Cotainr's info, then the cotainr-lumi systems (a broken profile: an error)."""
        from .pipeline.profiles import load_systems

        if _cotainr.NATIVE:  # its info lists the plugins, not their systems
            self.subcommand.execute()
        else:
            with _cotainr.shim.plugins_off():  # as a cotainr with the hook
                self.subcommand.execute()
        try:
            systems = load_systems(include_stock=False)
        except CotainrLumiError as e:
            print(f"Cannot read the system profiles: {e}")
            raise SystemExit(e.exit_code) from None
        print("\ncotainr-lumi systems (cotainr build --system NAME):")
        for name, system in systems.items():
            print(f"    - {name}: {system.description}")
            print(f"      base image: {system.base_image}")


def main(*args, **kwargs):
    """The ``cotainr-lumi`` entry point."""
    if COTAINR_MISSING is not None:
        fail(COTAINR_MISSING)
    try:
        _cotainr.check_cotainr_version()
        cli = CotainrLumiCLI()
    except (_cotainr.PluginError, CotainrLumiError) as e:
        fail(e)
    cli.execute()


__all__ = ["CheckHost", "CotainrLumiCLI", "Verify", "main"]
