"""
The one module that touches cotainr's internals.

Everything cotainr-lumi needs from cotainr goes through here, so a cotainr
release that changes its internals touches this module only. Tested against
the cotainr range :data:`SUPPORTED_COTAINR`.

Classes
-------
Sandbox
    A cotainr ``SingularitySandbox`` with the helpers our stages use.
CommandError
    A command run in the sandbox failed.

Functions
---------
cotainr_version()
    The installed cotainr version.
check_cotainr_version()
    Raise unless the installed cotainr is in the supported range.
stock_systems()
    The systems cotainr itself defines (its ``systems.json``).
make_log_settings(*, verbosity=0, log_to_file=False, no_color=False)
    Build cotainr log settings.
setup_cli_logging(*, log_settings)
    Attach cotainr's console/file handlers to the ``cotainr`` logger.
install_conda_env(*, sandbox, conda_env, accept_licenses, log_settings)
    Run cotainr's conda step exactly as ``cotainr build`` does.
console_spinner()
    cotainr's console spinner, only when stdout is a terminal.
"""

import contextlib
import json
import logging
from pathlib import Path
import shlex
import shutil
import subprocess
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# cotainr-lumi drives cotainr itself here: the start-up hook (which would
# load cotainr-lumi into cotainr.cli while this module is half imported) is
# not needed, so it is switched off before cotainr.cli is imported.
_hook = sys.modules.get("_cotainr_plugins_hook")
if _hook is not None:
    _hook.uninstall()

import cotainr  # noqa: E402
from cotainr import cli as _cli  # noqa: E402
from cotainr import container as _container  # noqa: E402
from cotainr import pack as _pack  # noqa: E402
from cotainr import tracing as _tracing  # noqa: E402
from cotainr import util as _util  # noqa: E402

from ..errors import UnsupportedCotainrError  # noqa: E402

logger = logging.getLogger(f"cotainr.{__name__}")

#: The cotainr releases cotainr-lumi supports: from the oldest release LUMI's
#: cotainr module still ships. Newer releases are accepted when they have the
#: public seam or meet the checked contract (:mod:`.contract`); no upper pin.
SUPPORTED_COTAINR = SpecifierSet(">=2025.3.0")

from . import contract, seam  # noqa: E402

#: The conda environment name cotainr uses.
CONDA_ENV_NAME = "conda_container_env"
#: Where cotainr installs conda in the image (``/opt/conda`` before 2025.7).
CONDA_PREFIX = contract.conda_prefix()
#: The env file cotainr appends its activation to.
COTAINR_ENV_FILE = "/.singularity.d/env/92-cotainr-env.sh"

# cotainr classes subclassed by our command line (see cli.py).
StockBuild = _cli.Build
StockInfo = _cli.Info
StockCLI = _cli.CotainrCLI
StockSubcommand = _cli.CotainrSubcommand
extract_help_from_docstring = _cli._extract_help_from_docstring


def _ask_yes_no(input_text):
    """Ask until the answer is yes or no (cotainr before 2025.7 has no helper)."""
    prompt = input_text + " [yes/no]\n>>> "
    while True:
        answer = input(prompt).strip().lower()
        if answer in ("yes", "no"):
            return answer == "yes"
        prompt = f'You answered "{answer}". Please answer yes or no.\n>>> '


#: cotainr's yes/no question (``cotainr.util.answer_is_yes`` from 2025.7).
answer_is_yes = getattr(_util, "answer_is_yes", _ask_yes_no)


def cotainr_version():
    """
    The installed cotainr version.

    Returns
    -------
    version : str
        As cotainr reports it.
    """
    return cotainr.__version__


def check_cotainr_version():
    """
    Raise unless the installed cotainr can run cotainr-lumi.

    A cotainr with the public seam (``docs/upstream/``) is used through it.
    Otherwise the release must be supported (:data:`SUPPORTED_COTAINR`) and
    meet every assumption of the fallback path (:mod:`.contract`).

    Returns
    -------
    path : str
        ``"seam"`` or ``"fallback"``.

    Raises
    ------
    :class:`cotainr_lumi.errors.UnsupportedCotainrError`
        Naming the release, or the assumptions it breaks; stock ``cotainr``
        keeps working then.
    """
    if seam.has_build_stage_seam():
        return "seam"
    found = cotainr_version()
    try:
        ok = Version(found) in SUPPORTED_COTAINR
    except InvalidVersion:
        ok = False
    if not ok:
        raise UnsupportedCotainrError(
            f"cotainr-lumi is disabled: cotainr {found} is installed but "
            f"cotainr-lumi needs cotainr{SUPPORTED_COTAINR}. Stock cotainr "
            f"works unchanged; install 'cotainr{SUPPORTED_COTAINR}' to use "
            "cotainr-lumi."
        )
    broken = contract.broken_assumptions()
    if broken:
        reasons = "; ".join(f"{a.name} ({reason})" for a, reason in broken)
        raise UnsupportedCotainrError(
            f"cotainr-lumi is disabled: cotainr {found} changed internals "
            f"cotainr-lumi relies on: {reasons}. Stock cotainr works "
            "unchanged; install a cotainr-lumi release that supports cotainr "
            f"{found}, or a cotainr with the plugin seam."
        )
    return "fallback"


def single_conda_env(conda_env):
    """
    The one conda environment file of a build.

    cotainr 2025.7 takes one ``--conda-env`` file; an upstream branch makes it
    a list of files applied in order. cotainr-lumi orders installs with its
    pip steps instead, so it takes one file (a list of one is accepted).

    Parameters
    ----------
    conda_env : os.PathLike or list of os.PathLike or None
        As cotainr's ``Build`` holds it.

    Returns
    -------
    conda_env : os.PathLike or None
        The file.

    Raises
    ------
    :class:`cotainr_lumi.errors.InputError`
        If several files are given.
    """
    if isinstance(conda_env, (list, tuple)):
        if len(conda_env) > 1:
            from ..errors import InputError

            raise InputError(
                "cotainr-lumi builds take one --conda-env file; put the "
                "packages that must be installed after others in pip steps "
                "(--pip-requirements or --pip-steps) instead."
            )
        return conda_env[0] if conda_env else None
    return conda_env


def stock_systems():
    """
    The systems cotainr itself defines (its ``systems.json``).

    Returns
    -------
    systems : dict
        ``{name: {"base-image": ...}}`` as cotainr reads them.
    """
    return _util.get_systems()


def stock_systems_file():
    """
    The path of cotainr's ``systems.json`` (which may not exist).

    Returns
    -------
    path : :class:`pathlib.Path`
        The file cotainr reads its systems from.
    """
    return Path(_util.systems_file)


def make_log_settings(*, verbosity=0, log_to_file=False, no_color=False):
    """
    Build cotainr log settings.

    Parameters
    ----------
    verbosity : int, default=0
        -1 (quiet) to 5 (trace), as cotainr's ``-q``/``-v`` flags.
    log_to_file : bool or os.PathLike, default=False
        True for cotainr's default log file name, or a path prefix.
    no_color : bool, default=False
        Disable colored console output.

    Returns
    -------
    log_settings : :class:`cotainr.tracing.LogSettings`
        The settings.
    """
    from datetime import datetime

    if log_to_file is True:
        log_file_path = (
            Path(".").resolve()
            / f"cotainr_build_{datetime.now().isoformat().replace(':', '.')}"
        )
    elif log_to_file:
        log_file_path = Path(log_to_file).resolve()
    else:
        log_file_path = None
    return _tracing.LogSettings(
        verbosity=verbosity, log_file_path=log_file_path, no_color=no_color
    )


def setup_cli_logging(*, log_settings):
    """
    Attach cotainr's console/file handlers to the ``cotainr`` logger.

    Parameters
    ----------
    log_settings : :class:`cotainr.tracing.LogSettings`
        The settings to use.
    """
    # CotainrCLI._setup_cotainr_cli_logging only uses its argument.
    StockCLI._setup_cotainr_cli_logging(None, log_settings=log_settings)


def console_spinner():
    """
    Cotainr's console spinner, only when stdout is a terminal.

    In a Slurm log (stdout not a terminal) the spinner's escape codes would
    flood the file, so a no-op context is returned instead.

    Returns
    -------
    context : context manager
        The spinner context or a null context.
    """
    try:
        interactive = sys.stdout.isatty()
    except (AttributeError, ValueError):
        interactive = False
    return _tracing.ConsoleSpinner() if interactive else contextlib.nullcontext()


@contextlib.contextmanager
def spinner_only_on_terminal():
    """
    Make cotainr's own build code skip its spinner when stdout is no terminal.

    Used around a stock ``Build.execute()`` so Slurm logs of stock builds
    are not flooded with spinner escape codes either.

    Yields
    ------
    None
    """
    try:
        interactive = sys.stdout.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if interactive:
        yield
        return
    original = _cli.tracing.ConsoleSpinner
    _cli.tracing.ConsoleSpinner = contextlib.nullcontext
    try:
        yield
    finally:
        _cli.tracing.ConsoleSpinner = original


_DISPATCHERS = {}


def new_log_dispatcher(*, name, log_settings):
    """
    A cotainr log dispatcher for subprocess output of a stage.

    cotainr's ``LogDispatcher`` attaches new handlers to the loggers
    ``NAME.out``/``NAME.err`` each time one is made, so dispatchers are made
    once per name and log settings and then reused (otherwise every line
    would be printed once per earlier command).

    Parameters
    ----------
    name : str
        The stage name; the loggers are ``cotainr-lumi.NAME.out/.err``.
    log_settings : :class:`cotainr.tracing.LogSettings` or None
        The build's log settings (None: no dispatcher, output is printed).

    Returns
    -------
    dispatcher : :class:`cotainr.tracing.LogDispatcher` or None
        The dispatcher.
    """
    if log_settings is None:
        return None
    key = (
        name,
        log_settings.verbosity,
        str(log_settings.log_file_path),
        log_settings.no_color,
    )
    if key not in _DISPATCHERS:
        _DISPATCHERS[key] = _tracing.LogDispatcher(
            name=f"cotainr-lumi.{name}",
            map_log_level_func=_map_subprocess_log_level,
            log_settings=log_settings,
        )
    return _DISPATCHERS[key]


def _map_subprocess_log_level(msg):
    """Map a line of subprocess output to a log level."""
    text = msg.lstrip()
    if text.startswith(("ERROR", "error:", "FATAL", "Traceback")):
        return logging.ERROR
    if text.startswith(("WARNING", "warning:", "DEPRECATION")):
        return logging.WARNING
    return logging.INFO


class CommandError(Exception):
    """
    A command run in the sandbox failed.

    Attributes
    ----------
    cmd : list of str
        The command.
    returncode : int
        Its exit status.
    stdout, stderr : str
        Its captured output.
    """

    def __init__(self, *, cmd, returncode, stdout, stderr):
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stdout = stdout or ""
        self.stderr = stderr or ""
        super().__init__(
            f"Command {shlex.join(self.cmd)} exited with status {returncode}"
        )

    def error_lines(self, *, limit=40):
        """
        The lines of output that explain the failure.

        Parameters
        ----------
        limit : int, default=40
            The most lines returned (the last ones).

        Returns
        -------
        text : str
            Lines mentioning errors, or the tail of stderr.
        """
        lines = (self.stderr or self.stdout).splitlines()
        keep = [
            ln
            for ln in lines
            if any(
                tag in ln
                for tag in ("ERROR", "error", "Error", "FATAL", "No module named")
            )
        ]
        chosen = keep or lines
        return "\n".join(chosen[-limit:])


def command_error_from(error, *, cmd=None):
    """
    The :class:`CommandError` a failed sandbox command raised, if it was one.

    cotainr 2025.7 raises a ``ValueError`` from the
    ``subprocess.CalledProcessError`` of a failed command; later releases
    (upstream PR #158) re-raise the ``CalledProcessError`` itself. Both mean
    "the command failed", not "cotainr-lumi has a bug".

    Parameters
    ----------
    error : BaseException
        What was raised.
    cmd : sequence of str, optional
        The command as we gave it (default: as the error records it).

    Returns
    -------
    command_error : CommandError or None
        None when `error` is not a failed command.
    """
    if isinstance(error, CommandError):
        return error
    cause = error
    if isinstance(error, ValueError) and isinstance(
        error.__cause__, subprocess.CalledProcessError
    ):
        cause = error.__cause__
    if not isinstance(cause, subprocess.CalledProcessError):
        return None
    if cmd is None:
        cmd = cause.cmd if isinstance(cause.cmd, (list, tuple)) else [str(cause.cmd)]
    return CommandError(
        cmd=[str(c) for c in cmd],
        returncode=cause.returncode,
        stdout=cause.stdout,
        stderr=cause.stderr,
    )


class Sandbox:
    """
    A cotainr ``SingularitySandbox`` with the helpers our stages use.

    Parameters
    ----------
    base_image : str
        The Apptainer/Singularity build spec of the base image.
    log_settings : :class:`cotainr.tracing.LogSettings`, optional
        The build's log settings.

    Attributes
    ----------
    root : :class:`pathlib.Path` or None
        The host path of the sandbox (inside the context).
    stock : :class:`cotainr.container.SingularitySandbox`
        The wrapped cotainr sandbox.
    """

    def __init__(self, *, base_image, log_settings=None):
        self.log_settings = log_settings
        self.stock = _container.SingularitySandbox(
            base_image=base_image, log_settings=log_settings
        )
        self.root = None

    @classmethod
    def wrap(cls, *, stock, log_settings=None):
        """
        Wrap a cotainr sandbox that is already inside its context.

        Used on cotainr's build stage seam, where cotainr creates the sandbox.

        Parameters
        ----------
        stock : :class:`cotainr.container.SingularitySandbox`
            The sandbox cotainr created (inside its context).
        log_settings : :class:`cotainr.tracing.LogSettings`, optional
            The build's log settings.

        Returns
        -------
        sandbox : Sandbox
            The wrapper, with :attr:`root` set.
        """
        sandbox = cls.__new__(cls)
        sandbox.log_settings = log_settings
        sandbox.stock = stock
        sandbox.root = Path(stock.sandbox_dir)
        return sandbox

    def __enter__(self):
        self.stock.__enter__()
        self.root = Path(self.stock.sandbox_dir)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.root = None
        return self.stock.__exit__(exc_type, exc_value, traceback)

    def run(self, args, *, env=None, log_name=None):
        """
        Run a command in the container sandbox (writable, no home).

        Parameters
        ----------
        args : sequence of str
            The command and its arguments (no shell; use
            ``["bash", "-c", script]`` for one).
        env : mapping of str to str, optional
            Extra environment variables, set with ``env`` inside the
            container so they win over the image's env files.
        log_name : str, optional
            Name for a dedicated log dispatcher (e.g. the stage name).

        Returns
        -------
        process : :class:`subprocess.CompletedProcess`
            With captured ``stdout``/``stderr``.

        Raises
        ------
        CommandError
            If the command exits non-zero.
        """
        cmd = [str(a) for a in args]
        if env:
            cmd = ["env"] + [f"{k}={v}" for k, v in env.items()] + cmd
        dispatcher = (
            new_log_dispatcher(name=log_name, log_settings=self.log_settings)
            if log_name
            else None
        )
        try:
            return self.stock.run_command_in_container(
                cmd=shlex.join(cmd), custom_log_dispatcher=dispatcher
            )
        except (ValueError, subprocess.CalledProcessError) as e:
            command_error = command_error_from(e, cmd=cmd)
            if command_error is None:
                raise
            raise command_error from e

    def add_to_env(self, *, shell_script):
        """
        Append to cotainr's env file (``92-cotainr-env.sh``).

        Parameters
        ----------
        shell_script : str
            Shell code sourced at container start.
        """
        self.stock.add_to_env(shell_script=shell_script)

    def add_metadata(self, *, labels=None):
        """
        Add cotainr's metadata labels, then ours.

        Parameters
        ----------
        labels : mapping of str to str, optional
            Extra labels for ``.singularity.d/labels.json``.
        """
        self.stock.add_metadata()
        if labels:
            labels_path = self.root / ".singularity.d/labels.json"
            metadata = json.loads(labels_path.read_text())
            metadata.update({str(k): str(v) for k, v in labels.items()})
            labels_path.write_text(json.dumps(metadata, indent=2, sort_keys=True))

    def build_image(self, *, path):
        """
        Build the SIF image file from the sandbox.

        Parameters
        ----------
        path : os.PathLike
            Where to write the image (overwritten if it exists).
        """
        self.stock.build_image(path=Path(path))


def install_conda_env(*, sandbox, conda_env, accept_licenses, log_settings):
    """
    Run cotainr's conda step exactly as ``cotainr build`` does.

    Parameters
    ----------
    sandbox : Sandbox
        The sandbox (inside its context).
    conda_env : os.PathLike
        The conda environment file.
    accept_licenses : bool
        Whether the Miniforge licence was accepted on the command line.
    log_settings : :class:`cotainr.tracing.LogSettings`
        The build's log settings.
    """
    conda_env = Path(conda_env)
    logger.info("Installing Conda environment: %s", conda_env)
    conda_env_file = sandbox.root / conda_env.name
    shutil.copyfile(conda_env, conda_env_file)
    conda_install = _pack.CondaInstall(
        sandbox=sandbox.stock,
        license_accepted=accept_licenses,
        log_settings=log_settings,
    )
    conda_install.add_environment(path=conda_env_file, name=CONDA_ENV_NAME)
    sandbox.add_to_env(shell_script=f"conda activate {CONDA_ENV_NAME}")
    logger.info("Cleaning up unused Conda files")
    conda_install.cleanup_unused_files()
    logger.info("Finished installing conda environment: %s", conda_env)
