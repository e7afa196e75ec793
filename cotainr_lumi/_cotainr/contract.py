"""
The private cotainr internals the fallback path relies on, as checked data.

On a cotainr without the public seam (see ``docs/upstream/``), cotainr-lumi
works by subclassing cotainr's ``Build``/``Info`` and driving its sandbox and
conda classes directly. Each assumption that makes about cotainr's internals
is listed here with a check; :func:`broken_assumptions` runs them all. When
any fails, cotainr-lumi disables itself (stock ``cotainr`` keeps working)
and says once which assumption broke, instead of pinning cotainr's version.

Classes
-------
Assumption
    One assumption about cotainr's internals.

Functions
---------
broken_assumptions()
    The assumptions the installed cotainr does not meet.

Attributes
----------
ASSUMPTIONS : tuple of Assumption
    All assumptions of the fallback path.
"""

from dataclasses import dataclass
import inspect
import logging
from typing import Callable

from cotainr import cli as _cli
from cotainr import container as _container
from cotainr import pack as _pack
from cotainr import tracing as _tracing
from cotainr import util as _util

logger = logging.getLogger(f"cotainr.{__name__}")


@dataclass(frozen=True)
class Assumption:
    """
    One assumption about cotainr's internals.

    Attributes
    ----------
    name : str
        The cotainr name it is about (e.g. ``cotainr.cli.Info._check_systems``).
    why : str
        What cotainr-lumi uses it for.
    check : callable
        Returns None when the assumption holds, else the reason it does not.
    """

    name: str
    why: str
    check: Callable[[], "str | None"]


def _has(owner, attr):
    """Check that `owner` has `attr`."""
    return None if hasattr(owner, attr) else f"{attr} is missing"


def _keywords(func, *names):
    """Check that `func` accepts the keyword arguments `names`."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError) as e:
        return f"no signature: {e}"
    missing = [n for n in names if n not in params]
    return f"no keyword argument(s) {', '.join(missing)}" if missing else None


def _source_mentions(func, *texts):
    """Check that the source of `func` contains `texts`."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as e:
        return f"source not readable: {e}"
    missing = [t for t in texts if t not in source]
    return f"does not mention {', '.join(missing)}" if missing else None


def _default(func, name):
    """The default value of the parameter `name` of `func` (or None)."""
    param = inspect.signature(func).parameters.get(name)
    return None if param is None else param.default


def conda_prefix():
    """
    Where the installed cotainr installs conda in the image.

    Returns
    -------
    prefix : str
        ``/opt/cotainr/conda`` from 2025.7.0, ``/opt/conda`` before.
    """
    return str(_default(_pack.CondaInstall.__init__, "prefix"))


ASSUMPTIONS = (
    Assumption(
        "cotainr.cli.CotainrCLI._subcommands",
        "the start-up hook replaces Build and Info in this list",
        lambda: _has(_cli.CotainrCLI, "_subcommands"),
    ),
    Assumption(
        "cotainr.cli._extract_help_from_docstring",
        "the help text of the Build subclass' and Verify's options",
        lambda: _keywords(_cli._extract_help_from_docstring, "arg", "docstring"),
    ),
    Assumption(
        "cotainr.cli.CotainrCLI._setup_cotainr_cli_logging",
        "called unbound by the cotainr-lumi command to set up cotainr's logging",
        lambda: _keywords(
            _cli.CotainrCLI._setup_cotainr_cli_logging, "self", "log_settings"
        ),
    ),
    Assumption(
        "cotainr.cli.Info._check_systems",
        "overridden by the Info subclass to list the cotainr-lumi systems",
        lambda: _source_mentions(_cli.Info.execute, "self._check_systems()"),
    ),
    Assumption(
        "cotainr.cli.Build.execute uses image_path, base_image, conda_env, "
        "accept_licenses, log_settings",
        "the Build subclass sets these without calling Build.__init__ and "
        "runs cotainr's own execute() for stock builds",
        lambda: _source_mentions(
            _cli.Build.execute,
            "self.image_path",
            "self.base_image",
            "self.conda_env",
            "self.accept_licenses",
            "self.log_settings",
        ),
    ),
    Assumption(
        "cotainr.cli.tracing.ConsoleSpinner",
        "replaced by a null context around stock builds when stdout is no terminal",
        lambda: _source_mentions(_cli.Build.execute, "tracing.ConsoleSpinner()"),
    ),
    Assumption(
        "cotainr.util.systems_file",
        "shown as the source of cotainr's own systems",
        lambda: _has(_util, "systems_file"),
    ),
    Assumption(
        "cotainr.pack.CondaInstall(sandbox=, license_accepted=, log_settings=, prefix=)",
        "cotainr's conda step, run the same way as cotainr build",
        lambda: (
            _keywords(
                _pack.CondaInstall.__init__,
                "sandbox",
                "license_accepted",
                "log_settings",
                "prefix",
            )
            or _keywords(_pack.CondaInstall.add_environment, "path", "name")
            or _has(_pack.CondaInstall, "cleanup_unused_files")
        ),
    ),
    Assumption(
        "conda environment 'conda_container_env', activated in 92-cotainr-env.sh",
        "the pip stage installs into cotainr's conda environment",
        lambda: (
            _source_mentions(_cli.Build.execute, '"conda_container_env"')
            or _source_mentions(
                _container.SingularitySandbox.add_to_env, "92-cotainr-env.sh"
            )
        ),
    ),
    Assumption(
        "cotainr.container.SingularitySandbox labels in .singularity.d/labels.json",
        "cotainr-lumi's labels are merged into cotainr's",
        lambda: _source_mentions(
            _container.SingularitySandbox.add_metadata, ".singularity.d/labels.json"
        ),
    ),
    Assumption(
        "cotainr.container.SingularitySandbox.run_command_in_container(cmd=, custom_log_dispatcher=)",
        "stages run commands in the sandbox; a failure raises ValueError from "
        "CalledProcessError (2025.7) or CalledProcessError (upstream PR #158)",
        lambda: _keywords(
            _container.SingularitySandbox.run_command_in_container,
            "cmd",
            "custom_log_dispatcher",
        ),
    ),
    Assumption(
        "cotainr.tracing.LogDispatcher(name=, map_log_level_func=, log_settings=)",
        "subprocess output of the stages goes through cotainr's logging",
        lambda: (
            _keywords(
                _tracing.LogDispatcher.__init__,
                "name",
                "map_log_level_func",
                "log_settings",
            )
            or _keywords(_tracing.LogSettings, "verbosity", "log_file_path", "no_color")
        ),
    ),
)


def broken_assumptions():
    """
    The assumptions the installed cotainr does not meet.

    Returns
    -------
    broken : list of (Assumption, str)
        Each broken assumption with the reason.
    """
    broken = []
    for assumption in ASSUMPTIONS:
        try:
            reason = assumption.check()
        except Exception as e:  # noqa: BLE001 - any failure means "broken"
            reason = f"{type(e).__name__}: {e}"
        if reason:
            broken.append((assumption, reason))
    return broken
