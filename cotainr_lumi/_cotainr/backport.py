"""
The build stage seam of ``docs/upstream/seam-api.md``, on a stock cotainr.

A cotainr with the upstream series loads plugins, gives them systems and
build stages, and runs the stages between its conda step and its metadata.
This module gives a cotainr without that series the same API, so that
cotainr-lumi has one driver: its stage is written against the seam, and
here cotainr's own ``Build.execute`` runs the build (sandbox, conda, metadata,
image) while the stages run at the one point the seam defines (right before
the metadata). Nothing of cotainr's pipeline is copied.

What this relies on beyond cotainr's public behaviour is checked by
:mod:`.contract` (by running cotainr's ``Build.execute`` with recording
fakes, not by reading its source).

Classes
-------
StageError
    A stage's one clear error.
BuildContext
    What a build stage sees of a build.
BuildStage
    Abstract base class of build stages.
Build
    cotainr's ``build`` subcommand with build stages, ``--force`` and ``--dry-run``.

Functions
---------
load_plugins()
    The plugin objects of the ``cotainr.plugins`` entry points.
plugin_systems()
    The systems the plugins define.
install(*, cli_module)
    Make the stock ``cotainr`` command use this seam.
"""

from abc import ABC, abstractmethod
import argparse
import contextlib
import copy
import functools
import json
import logging
import os
from pathlib import Path
import signal
import sys
import time

from cotainr import cli as _cli
from cotainr import container as _container
from cotainr import tracing as _tracing
from cotainr import util as _util

from ..imagelayout import LABELS_FILE
from .labels import load_labels

logger = logging.getLogger(f"cotainr.{__name__}")

#: The entry point group of cotainr plugins.
PLUGIN_GROUP = "cotainr.plugins"
#: Set (not "0") to run stock cotainr without plugins.
DISABLE_ENV_VAR = "COTAINR_DISABLE_PLUGINS"


class StageError(Exception):
    """
    A stage's one clear error: the build stops, without a traceback.

    Attributes
    ----------
    exit_code : int
        The exit status of the command (1 unless the cause says otherwise).
    """

    def __init__(self, message, *, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class BuildInterruptedError(BaseException):
    """
    The build was stopped by a signal (SIGINT, SIGTERM, SIGHUP).

    A ``BaseException`` (like ``KeyboardInterrupt``) so that no ``except
    Exception`` on the way swallows it: the sandbox is removed, the partial
    image deleted and an existing image kept on the way out.

    Attributes
    ----------
    signum : int
        The signal.
    """

    def __init__(self, signum):
        self.signum = signum
        super().__init__(f"the build was interrupted by {signal.Signals(signum).name}")


#: The signals that stop a build cleanly (Slurm sends SIGTERM at the time limit).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _descendants(pid):
    """The process ids below `pid` (Linux /proc)."""
    from . import _process_tree

    return _process_tree(pid)[1:]


@contextlib.contextmanager
def stop_cleanly_on_signals():
    """
    Turn SIGINT/SIGTERM/SIGHUP into :class:`BuildInterruptedError`.

    The signal also goes to the build's own subprocesses (``singularity
    build``, ``pip``), so that none of them goes on writing after the build
    has cleaned up. Only in the main thread (elsewhere nothing changes).

    Yields
    ------
    None
    """

    def handler(signum, frame):
        for sig in STOP_SIGNALS:  # once: the clean-up must not be interrupted
            signal.signal(sig, signal.SIG_IGN)
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        raise BuildInterruptedError(signum)

    try:
        saved = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


class BuildContext:
    """
    What a build stage sees of a build.

    Parameters
    ----------
    image_path : :class:`pathlib.Path`
        The image being built (absolute).
    base_image : str
        The base image (a stage may replace it in ``from_context`` only).
    system : str or None
        The ``--system`` name.
    conda_env_files : list of :class:`pathlib.Path`
        The ``--conda-env`` file(s).
    conda_prefix : str or None
        Conda's prefix in the container when an env is installed.
    conda_env_name : str or None
        The name of the conda env when one is installed.
    dry_run : bool
        Whether the build only prints its plan.
    log_settings : :class:`cotainr.tracing.LogSettings`
        The build's log settings.
    options : dict, optional
        The stage's own options (dest to value).

    Attributes
    ----------
    sandbox : :class:`cotainr.container.SingularitySandbox` or None
        The sandbox, while it exists.
    """

    def __init__(
        self,
        *,
        image_path,
        base_image,
        system,
        conda_env_files,
        conda_prefix,
        conda_env_name,
        dry_run,
        log_settings,
        options=None,
    ):
        self.image_path = Path(image_path)
        self.base_image = base_image
        self.system = system
        self.conda_env_files = list(conda_env_files)
        self.conda_prefix = conda_prefix
        self.conda_env_name = conda_env_name
        self.dry_run = dry_run
        self.log_settings = log_settings
        self.options = dict(options or {})
        self.sandbox = None
        self._outputs = {}
        self._messages = []

    def for_stage(self, *, options):
        """
        A copy for one stage: its own options, shared outputs and messages.

        Parameters
        ----------
        options : dict
            The stage's options.

        Returns
        -------
        context : BuildContext
            The copy.
        """
        context = copy.copy(self)
        context.options = dict(options)
        return context

    def add_output(self, *, path, content, executable=False):
        """
        Ask for a host file to be written once the image is built.

        Parameters
        ----------
        path : os.PathLike
            The file.
        content : str
            Its content.
        executable : bool, default=False
            Make it executable.

        Raises
        ------
        ValueError
            If `path` is the image or another output.
        """
        path = Path(os.path.abspath(path))
        if path == Path(os.path.abspath(self.image_path)):
            raise ValueError(f"the output {path} is the image being built")
        if path in self._outputs:
            raise ValueError(f"the output {path} is asked for twice")
        self._outputs[path] = (content, executable)

    def add_message(self, *, text):
        """
        Add a message logged once the image and the outputs are written.

        Parameters
        ----------
        text : str
            The message.
        """
        self._messages.append(text)


class BuildStage(ABC):
    """
    Abstract base class of build stages.

    Attributes
    ----------
    name : str
        The stage name (build log, plan, argument group).
    """

    name = ""

    @classmethod  # noqa: B027
    def add_arguments(cls, *, parser):
        """
        Add the stage's options to the "build" subcommand.

        Parameters
        ----------
        parser : argument group
            This stage's group of the "build" parser.
        """

    @classmethod
    def from_context(cls, *, context):
        """
        The stage for a build, or None if it takes no part in it.

        Parameters
        ----------
        context : BuildContext
            The build (options: the stage's own).

        Returns
        -------
        stage : BuildStage or None
            The stage.
        """
        return cls()

    def describe(self):
        """
        What the stage will do, for ``--dry-run``.

        Returns
        -------
        lines : list of str
            The lines.
        """
        return []

    @abstractmethod
    def run(self, *, context):
        """
        Run the stage on ``context.sandbox``.

        Parameters
        ----------
        context : BuildContext
            The build.

        Returns
        -------
        labels : dict of str to str or None
            Labels for the image metadata.
        """

    def on_failure(self, *, context, error):  # noqa: B027
        """
        React to a failed build (the sandbox may still exist).

        Parameters
        ----------
        context : BuildContext
            The build.
        error : BaseException
            What stopped it.
        """


@functools.cache
def _loaded_plugins():
    """The plugin objects, loaded once per process."""
    from importlib.metadata import entry_points

    try:
        eps = entry_points(group=PLUGIN_GROUP)
    except TypeError:  # Python 3.9
        eps = entry_points().get(PLUGIN_GROUP, [])
    plugins = []
    for ep in sorted(eps, key=lambda ep: ep.name):
        try:
            plugins.append(ep.load())
        except Exception as e:  # noqa: BLE001 - a broken plugin is left out
            logger.warning(
                "cotainr plugin %r not loaded (%s: %s)", ep.name, type(e).__name__, e
            )
    return tuple(plugins)


def plugins_disabled():
    """
    Whether ``COTAINR_DISABLE_PLUGINS`` turns plugins off.

    Returns
    -------
    disabled : bool
        True when set to anything but "" or "0".
    """
    return os.environ.get(DISABLE_ENV_VAR, "") not in ("", "0")


def load_plugins():
    """
    The plugin objects of the ``cotainr.plugins`` entry points.

    Returns
    -------
    plugins : list
        The loaded objects (none when plugins are disabled).
    """
    return [] if plugins_disabled() else list(_loaded_plugins())


def plugin_systems():
    """
    The systems the plugins define.

    Returns
    -------
    systems : dict
        In ``systems.json`` format.
    """
    systems = {}
    for plugin in load_plugins():
        source = getattr(plugin, "systems", None)
        if source is None:
            continue
        try:
            systems.update(source())
        except Exception as e:  # noqa: BLE001 - a broken source is left out
            logger.warning("systems of cotainr plugin %r not read: %s", plugin, e)
    return systems


def plugin_build_stages():
    """
    The build stage classes of the plugins, in plugin order.

    Returns
    -------
    stages : list of type
        :class:`BuildStage` subclasses.
    """
    return [
        stage
        for plugin in load_plugins()
        for stage in getattr(plugin, "build_stages", ())
    ]


class _RecordingGroup:
    """An argument group that records the dest of each option added."""

    def __init__(self, group):
        self._group = group
        self.actions = []

    def add_argument(self, *args, **kwargs):
        action = self._group.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action

    def __getattr__(self, name):
        return getattr(self._group, name)


def stage_options(stage_cls, *, parser=None):
    """
    The options a stage adds, as ``{dest: default}``.

    Parameters
    ----------
    stage_cls : type
        A :class:`BuildStage` subclass.
    parser : :class:`argparse.ArgumentParser`, optional
        Where to add them (default: a throwaway parser).

    Returns
    -------
    defaults : dict
        The options' destinations and default values.
    """
    parser = parser or argparse.ArgumentParser(add_help=False)
    # Titled as cotainr's seam (series 0006) titles it: the same help on both.
    group = _RecordingGroup(
        parser.add_argument_group(
            title=f"{stage_cls.name} build stage",
            description=(
                stage_cls.__doc__.strip().splitlines()[0] if stage_cls.__doc__ else None
            ),
        )
    )
    stage_cls.add_arguments(parser=group)
    return {action.dest: action.default for action in group.actions}


def stock_build_options():
    """
    The option strings of cotainr's own "build" subcommand.

    Returns
    -------
    options : set of str
        E.g. ``{"--base-image", "--system", ...}``.
    """
    parser = argparse.ArgumentParser(add_help=False)
    recorder = _RecordingGroup(parser)
    _cli.Build.add_arguments(parser=recorder)
    # cotainr adds mutually exclusive groups to the parser itself; their
    # options are found by parsing.
    found = set()
    for option in ("--force", "--dry-run"):
        try:
            ns, _ = parser.parse_known_args(["x", "--base-image", "y", option])
        except SystemExit:  # pragma: no cover - cotainr's parser rejects it
            continue
        if getattr(ns, option[2:].replace("-", "_"), None):
            found.add(option)
    return found


@contextlib.contextmanager
def _attribute(owner, name, value):
    """Set ``owner.name`` to `value` for the duration of the context."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _stdout_is_terminal():
    """Whether stdout is a terminal."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _merge_labels(sandbox_dir, labels):
    """Add `labels` to the sandbox's ``.singularity.d/labels.json``."""
    if not labels:
        return
    path = Path(sandbox_dir) / LABELS_FILE.lstrip("/")
    metadata = load_labels(path=path)
    metadata.update({str(k): str(v) for k, v in labels.items()})
    path.write_text(json.dumps(metadata, indent=2, sort_keys=True))


def _temporary_image_path(image_path):
    """A temporary name next to `image_path` (same file system)."""
    image_path = Path(image_path)
    return image_path.with_name(f".{image_path.name}.partial-{os.getpid()}")


def write_outputs(outputs):
    """
    Write host files atomically, one by one.

    Parameters
    ----------
    outputs : dict of :class:`pathlib.Path` to (str, bool)
        Content and executable flag by path.
    """
    for path, (content, executable) in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
        tmp.write_text(content)
        tmp.chmod(0o755 if executable else 0o644)
        os.replace(tmp, path)
        logger.info("Wrote %s", path)


def _lookup_system(name):
    """The system `name` (cotainr's or a plugin's), or one clear error."""
    systems = all_systems()
    if name in systems:
        return systems[name]
    off = (
        f" (cotainr plugins are turned off: {DISABLE_ENV_VAR} is set)"
        if plugins_disabled()
        else ""
    )
    raise StageError(
        f"unknown system {name!r}; available: "
        f"{', '.join(sorted(systems)) or 'none'} (see 'cotainr info'){off}",
        exit_code=2,
    )


def _conda_env_files(conda_env):
    """The ``--conda-env`` file(s) as absolute paths, each checked to exist."""
    files = conda_env if isinstance(conda_env, (list, tuple)) else [conda_env]
    try:
        files = [Path(f).resolve() for f in files if f is not None]
    except (RuntimeError, OSError) as e:
        raise StageError(
            f"The Conda env file cannot be resolved ({e}).", exit_code=2
        ) from None
    for file in files:
        if not file.is_file():
            raise StageError(
                f"The provided Conda env file '{file}' does not exist.", exit_code=2
            )
    return files


def _as_cotainr_holds_them(files):
    """The conda env files as cotainr's ``Build.conda_env``: a list or one."""
    if not files:  # no need to ask cotainr's parser
        return None
    from . import cotainr_version, takes_several_conda_envs

    if takes_several_conda_envs():
        return files
    if len(files) > 1:
        raise StageError(
            f"cotainr {cotainr_version()} takes one --conda-env file; "
            f"got {len(files)}. Put the packages that must be installed "
            "after others in pip steps (--pip-requirements or --pip-steps).",
            exit_code=2,
        )
    return files[0]


def _participating_stages(*, context, options):
    """The plugins' stages taking part in a build, with their contexts."""
    options = dict(options)
    stages, contexts = [], []
    for stage_cls in plugin_build_stages():
        defaults = stage_options(stage_cls)
        stage_context = context.for_stage(
            options={dest: options.pop(dest, d) for dest, d in defaults.items()}
        )
        stage = stage_cls.from_context(context=stage_context)
        if stage is not None:
            stages.append(stage)
            contexts.append(stage_context)
            context.base_image = stage_context.base_image
    if options:
        raise TypeError(f"unknown build options: {', '.join(sorted(options))}")
    return stages, contexts


class Build(_cli.Build):
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
        Print the build plan (base image, stages in order, what each will do)
        and build nothing.
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
        **options,
    ):
        """Construct the "build" subcommand."""
        from . import make_log_settings

        self.log_settings = make_log_settings(
            verbosity=verbosity, log_to_file=log_to_file, no_color=no_color
        )
        self.image_path = Path(os.path.abspath(image_path))
        self.accept_licenses = accept_licenses
        self.force = force
        self.dry_run = dry_run
        self.system_name = system
        self.base_image = base_image
        if system is not None:
            self.system = _lookup_system(system)
            self.base_image = self.system["base-image"]
        files = _conda_env_files(conda_env)
        self.conda_env = _as_cotainr_holds_them(files)
        from . import CONDA_ENV_NAME, CONDA_PREFIX

        self.context = BuildContext(
            image_path=self.image_path,
            base_image=self.base_image,
            system=system,
            conda_env_files=files,
            conda_prefix=CONDA_PREFIX if files else None,
            conda_env_name=CONDA_ENV_NAME if files else None,
            dry_run=dry_run,
            log_settings=self.log_settings,
        )
        self.stages, self._contexts = _participating_stages(
            context=self.context, options=options
        )
        self.base_image = self.context.base_image
        if self.image_path.exists() and not force and not dry_run:
            self._confirm_overwrite()

    def _confirm_overwrite(self):
        """Ask before overwriting; refuse when nobody can answer."""
        if not sys.stdin or not sys.stdin.isatty():
            raise StageError(
                f"The image {self.image_path} already exists and there is no "
                "terminal to ask whether to overwrite it. Pass --force to "
                "replace it, or choose another path.",
                exit_code=2,
            )
        from . import answer_is_yes

        if not answer_is_yes(
            f"{self.image_path} already exists. Would you like to overwrite it?"
        ):
            logger.critical(
                "You have chosen not to overwrite %s. Exiting.", self.image_path
            )
            raise SystemExit(0)

    @classmethod
    def add_arguments(cls, *, parser):
        """Add arguments to the "build" subcommand subparser."""
        # cotainr's options with cotainr's own help (taken from its docstring).
        _cli.Build.add_arguments(parser=parser)
        stock = stock_build_options()
        missing = {"--force", "--dry-run"} - stock
        group = (
            parser.add_argument_group(
                "build options (a backport of cotainr's upstream series)"
            )
            if missing
            else parser
        )
        if "--force" not in stock:
            group.add_argument(
                "--force",
                action="store_true",
                help="overwrite an existing image without asking (for batch jobs); "
                "the old image is replaced only when the new build succeeds",
            )
        if "--dry-run" not in stock:
            group.add_argument(
                "--dry-run",
                action="store_true",
                help="print the build plan (base image, stages in order, what "
                "each will do) and build nothing",
            )
        for stage_cls in plugin_build_stages():
            stage_options(stage_cls, parser=parser)

    def describe(self):
        """
        The build plan, for ``--dry-run``.

        Returns
        -------
        lines : list of str
            The lines.
        """
        if not self.stages:
            files = ", ".join(str(f) for f in self.context.conda_env_files)
            return [
                f"Image: {self.image_path}",
                f"Base image: {self.base_image}",
                f"Conda environment: {files or 'none'}",
            ]
        return [line for stage in self.stages for line in stage.describe()]

    def execute(self):
        """Execute the "build" subcommand."""
        if self.dry_run:
            print("\n".join(self.describe()))
            return
        t_start = time.time()
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(stop_cleanly_on_signals())
                if self.stages:  # a stock build runs exactly as without plugins
                    stack.enter_context(
                        _attribute(
                            _container, "SingularitySandbox", self._sandbox_class()
                        )
                    )
                if not _stdout_is_terminal():
                    stack.enter_context(
                        _attribute(_tracing, "ConsoleSpinner", contextlib.nullcontext)
                    )
                super().execute()
        except BaseException as error:
            for stage, context in reversed(list(zip(self.stages, self._contexts))):
                try:
                    stage.on_failure(context=context, error=error)
                except Exception:  # noqa: BLE001 - the first error is reported
                    logger.exception("on_failure of stage %s failed", stage.name)
            if self.stages and isinstance(error, Exception):
                if not isinstance(error, StageError):
                    raise StageError(_cotainr_failure(error)) from error
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                _temporary_image_path(self.image_path).unlink()
        write_outputs(self.context._outputs)
        for text in self.context._messages:
            logger.info("%s", text)
        logger.debug("Build with stages took %.1f s", time.time() - t_start)

    def _run_stages(self, *, sandbox):
        """Run the stages on the sandbox; return their labels."""
        labels = {}
        for stage, context in zip(self.stages, self._contexts):
            context.sandbox = sandbox
            logger.info("Running stage: %s", stage.name)
            for key, value in (stage.run(context=context) or {}).items():
                if str(key).startswith("cotainr."):
                    raise StageError(
                        f"stage {stage.name} set the label {key!r}; labels "
                        "starting with 'cotainr.' are cotainr's"
                    )
                labels[key] = value
        return labels

    def _sandbox_class(self):
        """Cotainr's sandbox class, with the stages run before its metadata."""
        build = self
        stock = _container.SingularitySandbox

        class StagedSandbox(stock):
            def add_metadata(self, *args, **kwargs):
                labels = build._run_stages(sandbox=self)
                result = super().add_metadata(*args, **kwargs)
                _merge_labels(self.sandbox_dir, labels)
                return result

            def build_image(self, *, path):
                tmp = _temporary_image_path(path)
                super().build_image(path=tmp)
                os.replace(tmp, path)

        return StagedSandbox


def systems_with_plugins(get_systems):
    """
    Wrap cotainr's ``get_systems`` so it adds the plugins' systems.

    Parameters
    ----------
    get_systems : callable
        cotainr's function.

    Returns
    -------
    wrapped : callable
        The systems of cotainr's files, then the plugins' (a file wins).
    """
    if getattr(get_systems, "__wrapped__", None) is not None:
        return get_systems

    @functools.wraps(get_systems)
    def wrapped():
        systems = get_systems()
        for name, system in plugin_systems().items():
            if name in systems:
                logger.warning(
                    "system %r of a plugin is shadowed by cotainr's systems file", name
                )
                continue
            systems[name] = system
        return systems

    return wrapped


def all_systems():
    """
    Cotainr's systems and the plugins' (whether or not :func:`install` ran).

    Returns
    -------
    systems : dict
        In ``systems.json`` format.
    """
    from importlib.util import find_spec

    if find_spec("cotainr.plugins") is not None:  # cotainr adds them itself
        return _util.get_systems()
    return systems_with_plugins(_util.get_systems)()


def _cotainr_failure(error):
    """One message for a failure of cotainr's own steps (sandbox, conda, image)."""
    cause = error.__cause__ if error.__cause__ is not None else error
    lines = (getattr(cause, "stderr", None) or "").strip().splitlines()
    detail = " | ".join(lines[-3:]) if lines else f"{type(error).__name__}: {error}"
    hint = ""
    if (
        "no space left on device" in detail.lower()
        or getattr(cause, "errno", None) == 28
    ):
        hint = (
            " The work directory is full: build with --work-dir on a file "
            "system with more room (on LUMI /flash or /scratch, not /tmp)."
        )
    return f"cotainr's build failed: {detail[-800:]}.{hint}"


def interrupted_message(error):
    """
    What to tell the user after :class:`BuildInterruptedError`.

    Parameters
    ----------
    error : BuildInterruptedError
        The interruption.

    Returns
    -------
    message : str
        One line.
    """
    return (
        f"{error}; no image was written (an existing image is kept) and the "
        "build's sandbox and partial files were removed"
    )


def main_with_stage_errors(main):
    """
    Wrap cotainr's ``main`` so a :class:`StageError` is one error line.

    Parameters
    ----------
    main : callable
        cotainr's entry point.

    Returns
    -------
    wrapped : callable
        The entry point.
    """
    if getattr(main, "__wrapped__", None) is not None:
        return main

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except StageError as e:
            sys.stderr.write(f"cotainr: error: {e}\n")
            raise SystemExit(e.exit_code) from None
        except BuildInterruptedError as e:
            sys.stderr.write(f"cotainr: error: {interrupted_message(e)}\n")
            raise SystemExit(128 + e.signum) from None

    return wrapped


def install(*, cli_module):
    """
    Make the stock ``cotainr`` command use this seam.

    Parameters
    ----------
    cli_module : module
        The ``cotainr.cli`` module.
    """
    from importlib.util import find_spec

    if find_spec("cotainr.plugins") is None:  # else cotainr adds them itself
        _util.get_systems = systems_with_plugins(_util.get_systems)
    cli_module.CotainrCLI._subcommands = [
        Build if cls is cli_module.Build else cls
        for cls in cli_module.CotainrCLI._subcommands
    ]
    cli_module.main = main_with_stage_errors(cli_module.main)
