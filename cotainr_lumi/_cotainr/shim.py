"""
The build hook of ``docs/upstream/seam-api.md`` on a cotainr without it.

:func:`install` checks every cotainr internal it relies on (:data:`RELIED_ON`,
the parameters of ``Build`` and the order of ``Build.execute``) before it
wraps any. When one differs nothing is wrapped: stock cotainr runs unchanged
and a plugin's system is one error naming the cotainr version.
"""

import argparse
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
from pathlib import Path
import sys
import types
from typing import Optional

from ..errors import fail
from ..processes import BuildInterruptedError, stop_cleanly_on_signals

logger = logging.getLogger(f"cotainr.{__name__}")

HOOK_API_VERSION = 1


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a build hook sees of a build (read only)."""

    image_path: Path
    base_image: str
    system: Optional[str]
    conda_env_files: tuple
    conda_prefix: Optional[str]
    conda_env_name: Optional[str]
    dry_run: bool
    options: types.MappingProxyType


class PluginError(Exception):
    """A plugin's one clear error: printed without a traceback, then exit."""

    def __init__(self, message, *, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code
        self.plugin = None  # the plugin whose hook raised it (set by the shim)


#: What the shim needs of cotainr, wrapped or called: (module, attribute path).
RELIED_ON = (
    ("cli", "main"),
    ("cli", "CotainrCLI"),
    ("cli", "Build.add_arguments"),
    ("cli", "Build.__init__"),
    ("cli", "Build.execute"),
    ("container", "SingularitySandbox.__enter__"),
    ("container", "SingularitySandbox.__exit__"),
    ("container", "SingularitySandbox._subprocess_runner"),
    ("container", "SingularitySandbox.add_metadata"),
    ("container", "SingularitySandbox.build_image"),
    ("container", "SingularitySandbox.run_command_in_container"),
    ("util", "get_systems"),
    ("tracing", "LogSettings"),
)
#: The parameters of cotainr's ``Build`` the shim reads.
BUILD_PARAMETERS = ("image_path", "base_image", "system", "conda_env")
#: What ``Build.execute`` calls, in this order: the hook's points lie between.
EXECUTE_ORDER = ("add_environment", "add_metadata", "build_image")
PLUGIN_GROUP = "cotainr.plugins"
#: cotainr's options of the upstream series, added where cotainr lacks them.
BACKPORTED_OPTIONS = {
    "--force": "overwrite an existing image without asking; the old image is "
    "replaced only once the new one is built",
    "--dry-run": "print what the build would do and build nothing",
}

#: `build`: the Build running now with the shim's steps (None: none or stock).
_state = types.SimpleNamespace(build=None, tracing=None, labels={}, off=False)


def _taking_part():
    return getattr(_state.build, "_shim_taking_part", {})


def _order_problem(execute):
    """Why ``Build.execute`` does not call :data:`EXECUTE_ORDER` in order (or None)."""
    try:
        source = inspect.getsource(execute)
    except (OSError, TypeError):
        return "Build.execute (its source cannot be read)"
    places = [source.find(f".{name}(") for name in EXECUTE_ORDER]
    if -1 in places or places != sorted(places):
        return f"Build.execute calling {', then '.join(EXECUTE_ORDER)}"
    return None


def missing_internals(modules):
    """What of :data:`RELIED_ON`, its parameters and its order `modules` lack."""
    missing = []
    for module, path in RELIED_ON:
        obj = modules.get(module)
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if not callable(obj):
            missing.append(f"{module}.{path}")
    if missing:
        return missing
    build = modules["cli"].Build
    parameters = inspect.signature(build.__init__).parameters
    for name in BUILD_PARAMETERS:
        if name not in parameters:
            missing.append(f"cli.Build.__init__({name}=...)")
    problem = _order_problem(build.execute)
    if problem:
        missing.append(problem)
    return missing


@functools.cache
def load_plugins():
    """The plugins of the ``cotainr.plugins`` entry points, by name."""
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=PLUGIN_GROUP)
    except TypeError:  # Python 3.9
        found = entry_points().get(PLUGIN_GROUP, [])
    plugins = {}
    for ep in sorted(found, key=lambda ep: ep.name):
        dist = getattr(ep, "dist", None)
        _state.labels[ep.name] = ep.value
        if dist is not None:
            _state.labels[ep.name] = f"{dist.name} {dist.version}"
        try:
            plugins[ep.name] = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin is left out
            logger.warning("%s not loaded: %s", plugin_label(ep.name), e)
    return plugins


def plugin_label(name):
    """``cotainr plugin 'NAME' (DIST VERSION)``: whom to ask about a message."""
    return f"cotainr plugin {name!r} ({_state.labels.get(name, 'unknown')})"


def _plugins():
    """The plugins, unless ``COTAINR_DISABLE_PLUGINS`` is set (or meanwhile off)."""
    off = os.environ.get("COTAINR_DISABLE_PLUGINS", "") not in ("", "0")
    if off or _state.off:
        return {}
    return load_plugins()


@contextlib.contextmanager
def plugins_off():
    """Meanwhile, cotainr runs as without plugins (``cotainr-lumi info``)."""
    _state.off = True
    try:
        yield
    finally:
        _state.off = False


def hooks():
    """The build hooks of the plugins, by plugin name."""
    found = {}
    for name, plugin in _plugins().items():
        hook = getattr(plugin, "build_hook", None)
        if getattr(hook, "api_version", None) == HOOK_API_VERSION:
            found[name] = hook
    return found


def _call(name, method, **kwargs):
    """Call a hook's `method`; its PluginError names the plugin."""
    try:
        return method(**kwargs)
    except PluginError as e:
        e.plugin = e.plugin or name
        raise


def _systems_with_plugins(get_systems):
    @functools.wraps(get_systems)
    def wrapped():
        systems = get_systems()
        for name, plugin in _plugins().items():
            try:
                extra = plugin.systems() if hasattr(plugin, "systems") else {}
            except Exception as e:  # noqa: BLE001 - one warning, cotainr goes on
                logger.warning("%s: its systems not read: %s", plugin_label(name), e)
                continue
            for system, value in extra.items():
                systems.setdefault(system, value)
        return systems

    return wrapped


class _OptionsParser(argparse.ArgumentParser):
    """A parser of one plugin's options that raises instead of exiting."""

    def error(self, message):
        raise ValueError(message)


def _plugin_options(name, hook, parser):
    """Add the hook's options to `parser`, grouped: {dest: default} (None: left out)."""
    scratch = _OptionsParser(add_help=False)
    try:
        hook.add_arguments(parser=scratch.add_argument_group(f"{name} plugin"))
        defaults = vars(scratch.parse_known_args([])[0])
    except (argparse.ArgumentError, TypeError, ValueError) as e:
        logger.warning("%s left out: %s", plugin_label(name), e)
        return None
    ours = {s for action in scratch._actions for s in action.option_strings}
    clash = sorted(ours & set(parser._option_string_actions))
    clash += sorted(set(defaults) & {action.dest for action in parser._actions})
    if clash:
        logger.warning(
            "%s left out: its options %s clash with cotainr's or another plugin's",
            plugin_label(name),
            ", ".join(clash),
        )
        return None
    hook.add_arguments(parser=parser.add_argument_group(f"{name} plugin"))
    return defaults


def _backport(parser):
    """Add :data:`BACKPORTED_OPTIONS` cotainr lacks: {dest: option}."""
    added = {}
    group = parser.add_argument_group("options of cotainr's upstream series")
    for option, text in BACKPORTED_OPTIONS.items():
        try:
            action = group.add_argument(option, action="store_true", help=text)
        except argparse.ArgumentError:
            continue
        added[action.dest] = option
    return added


def _add_arguments(original):
    @functools.wraps(original)
    def add_arguments(cls, *, parser):
        original(cls, parser=parser)
        cls._shim_own_options = _backport(parser)
        cls._shim_plugin_options = {}
        for name, hook in hooks().items():
            defaults = _plugin_options(name, hook, parser)
            if defaults is not None:
                cls._shim_plugin_options[name] = defaults

    return classmethod(add_arguments)


def _partial_path(image_path):
    return image_path.with_name(f".{image_path.name}.partial-{os.getpid()}")


def _context(kwargs, *, dry_run, systems):
    from . import CONDA_ENV_NAME, CONDA_PREFIX

    system = kwargs.get("system")
    files = kwargs.get("conda_env") or ()
    if not isinstance(files, (list, tuple)):  # cotainr releases take one file
        files = (files,)
    base_image = kwargs.get("base_image")
    if system:
        base_image = systems[system]["base-image"]
    return BuildContext(
        image_path=Path(os.path.abspath(kwargs["image_path"])),
        base_image=base_image,
        system=system,
        conda_env_files=tuple(Path(os.path.abspath(f)) for f in files),
        conda_prefix=CONDA_PREFIX if files else None,
        conda_env_name=CONDA_ENV_NAME if files else None,
        dry_run=dry_run,
        options=types.MappingProxyType({}),
    )


def _prepare(build, options):
    """Ask each hook whether it takes part: {name: (hook, context, lines)}."""
    taking_part = {}
    for name, hook in hooks().items():
        if name not in options:  # its options clashed: left out
            continue
        context = dataclasses.replace(
            build._shim_context, options=types.MappingProxyType(options[name])
        )
        lines = _call(name, hook.prepare, context=context)
        if lines is not None:
            taking_part[name] = (hook, context, lines)
    return taking_part


def _check_system(system, systems):
    """Refuse an unknown system, in a plugin's words (``system_problem``) if any."""
    if system is None or system in systems:
        return
    for plugin in _plugins().values():
        ask = getattr(plugin, "system_problem", None)
        said = ask(system) if ask is not None else None
        if said:
            raise PluginError(said, exit_code=2)
    raise PluginError(
        f"System does not exist: {system!r}. Available systems: "
        f"{', '.join(sorted(systems)) or 'none'} (see 'cotainr info').",
        exit_code=2,
    )


def _init(original, util):
    @functools.wraps(original)
    def init(self, **kwargs):
        if "_shim_plugin_options" not in vars(type(self)):  # not made by the CLI
            type(self).add_arguments(parser=argparse.ArgumentParser())
        own = type(self)._shim_own_options
        force = bool(kwargs.pop("force", False)) if "force" in own else None
        dry_run = bool(kwargs.pop("dry_run", False)) if "dry_run" in own else None
        options = {
            name: {dest: kwargs.pop(dest, d) for dest, d in defaults.items()}
            for name, defaults in type(self)._shim_plugin_options.items()
        }
        self._shim_own_dry_run = bool(dry_run)
        self._shim_dry_run = bool(dry_run or kwargs.get("dry_run"))
        systems = util.get_systems()
        _check_system(kwargs.get("system"), systems)
        self._shim_context = _context(
            kwargs, dry_run=self._shim_dry_run, systems=systems
        )
        self._shim_taking_part = _prepare(self, options)
        self._shim_target = None
        if dry_run:
            return
        asks = force is not None and (force or self._shim_taking_part)
        if not (asks or self._shim_taking_part):
            return original(self, **kwargs)
        target = Path(kwargs["image_path"]).resolve()
        if asks:  # the shim asked; cotainr sees a path that does not exist
            _confirm_overwrite(target, force=force)
            kwargs["image_path"] = _partial_path(target)
        original(self, **kwargs)
        self.image_path = self._shim_target = target  # see _build_image

    return init


def _confirm_overwrite(image_path, *, force):
    """Ask before replacing `image_path` (as cotainr asks); EOF names --force."""
    if not image_path.exists() or force:
        return
    prompt = f"{image_path} already exists. Would you like to overwrite it?"
    prompt += " [yes/no]\n>>> "
    while True:
        try:
            answer = input(prompt).strip().lower()
        except EOFError:
            raise PluginError(
                f"{image_path} already exists and there is no answer on stdin: "
                "pass --force to replace it, or choose another path."
            ) from None
        if answer in ("yes", "no"):
            break
        prompt = f'You answered "{answer}". Please answer yes or no.\n>>> '
    if answer == "no":
        logger.critical("You have chosen not to overwrite %s. Exiting.", image_path)
        sys.exit(0)


def _print_dry_run(build, *, cotainr_lines):
    context = build._shim_context
    if cotainr_lines:
        print(f"Container image: {context.image_path}")
        print(f"Base image: {context.base_image}")
        for conda_env in context.conda_env_files or ["none"]:
            print(f"Conda environment: {conda_env}")
    for name, (_hook, _context, lines) in build._shim_taking_part.items():
        print(f"Plugin {name}:")
        for line in lines:
            print(f"    {line}")


def _execute(original):
    @functools.wraps(original)
    def execute(self):
        taking_part = getattr(self, "_shim_taking_part", {})
        if getattr(self, "_shim_own_dry_run", False):
            return _print_dry_run(self, cotainr_lines=True)
        if getattr(self, "_shim_dry_run", False):  # cotainr's own --dry-run
            original(self)
            return _print_dry_run(self, cotainr_lines=False)
        if not taking_part and getattr(self, "_shim_target", None) is None:
            return original(self)
        _state.build = self
        self._shim_customized = False
        error = None
        try:
            with stop_cleanly_on_signals(), _spinner_only_on_a_terminal():
                original(self)
        except BaseException as e:
            error = e
            raise
        finally:  # each hook's finalize: an exception it raises is reported
            _state.build = None
            for name, (hook, context, _lines) in taking_part.items():
                _call(name, hook.finalize, context=context, error=error)

    return execute


def _add_metadata(original):
    @functools.wraps(original)
    def add_metadata(self, *args, **kwargs):
        for name, (hook, context, _lines) in _taking_part().items():
            _call(name, hook.customize, sandbox=self, context=context)
        result = original(self, *args, **kwargs)
        if _state.build is not None:
            _state.build._shim_customized = True
        return result

    return add_metadata


def host_path(sandbox_dir, path):
    """The host path of `path` in a sandbox, refusing a base image's link to it."""
    link = Path(sandbox_dir)
    for part in path.strip("/").split("/"):
        link = link / part
        if link.is_symlink():
            raise PluginError(
                f"The base image's /{link.relative_to(sandbox_dir)} is a symbolic "
                "link; the build does not write through it. Use a base image "
                "without it."
            )
    return link


def _provided_sandbox(sandbox_dir):
    """The release function of the one hook that provides the sandbox (or None)."""
    releases = {}
    for name, (hook, context, _lines) in _taking_part().items():
        provide = getattr(hook, "sandbox", None)
        if provide is not None:
            release = _call(name, provide, context=context, sandbox_dir=sandbox_dir)
            if release is not None:
                releases[name] = release
    if len(releases) > 1:
        for release in releases.values():
            release()
        names = " and ".join(releases)
        raise PluginError(f"The cotainr plugins {names} both provide the sandbox.")
    return next(iter(releases.values()), None)


def _enter(original):
    @functools.wraps(original)
    def enter(self):
        runner = self._subprocess_runner
        if not _taking_part():
            return original(self)

        def provided_or_unpacked(*, args, **kwargs):
            if "--sandbox" not in map(str, args):
                return runner(args=args, **kwargs)
            self._shim_release = _provided_sandbox(Path(self.sandbox_dir))
            if self._shim_release is None:
                return runner(args=args, **kwargs)
            return None

        self._subprocess_runner = provided_or_unpacked
        try:
            return original(self)
        except BaseException:
            _release(self)
            raise
        finally:
            del self._subprocess_runner

    return enter


def _release(sandbox):
    """Release the sandbox a plugin provided (before cotainr removes its directory)."""
    release = vars(sandbox).pop("_shim_release", None)
    if release is not None:
        release()


def _exit(original):
    @functools.wraps(original)
    def exit_(self, *args):
        _release(self)
        return original(self, *args)

    return exit_


def _write_image(sandbox, path, build_image):
    """The first hook's image writer that writes the image, else cotainr's."""
    for name, (hook, context, _lines) in _taking_part().items():
        write = getattr(hook, "write_image", None)
        if write is not None and _call(
            name, write, sandbox=sandbox, context=context, path=Path(path)
        ):
            return
    build_image(sandbox, path=path)


def _build_image(original, version):
    @functools.wraps(original)
    def build_image(self, *args, **kwargs):
        if _taking_part() and not _state.build._shim_customized:
            raise PluginError(
                f"cotainr {version} built the image without adding its "
                "metadata first, so the cotainr plugins' build steps could "
                f"not run. {support_hint(version)}"
            )
        target = _state.build and _state.build._shim_target
        path = kwargs.get("path", args[0] if args else None)
        if not target or path is None or Path(path) != target:
            return _write_image(self, path, original)  # e.g. cotainr's own partial
        # cotainr writes the image itself: build it aside, replace when complete.
        partial = _partial_path(target)
        try:
            _write_image(self, partial, original)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    return build_image


def support_hint(version):
    """What to do when the shim cannot serve cotainr `version`."""
    return (
        f"Install a cotainr-lumi release that supports cotainr {version}, or "
        "cotainr 2025.7.1 (pip install 'cotainr==2025.7.1'); stock cotainr "
        "builds are not affected."
    )


@contextlib.contextmanager
def _spinner_only_on_a_terminal():
    """No console spinner (escape codes in Slurm logs) when stdout is a file."""
    tracing = _state.tracing
    spinner = getattr(tracing, "ConsoleSpinner", None)
    if spinner is not None and not sys.stdout.isatty():
        tracing.ConsoleSpinner = contextlib.nullcontext
    try:
        yield
    finally:
        if spinner is not None:
            tracing.ConsoleSpinner = spinner


def _plugin_system_asked():
    """Whether the command line's ``--system`` is a plugin's."""
    parser = _OptionsParser(add_help=False)
    parser.add_argument("--system")
    try:
        system = parser.parse_known_args(sys.argv[1:])[0].system
        return any(system in p.systems() for p in load_plugins().values())
    except Exception:  # noqa: BLE001 - cotainr then says what is wrong
        return False


def _main(original, *, problem=None):
    """Cotainr's main: a plugin's error is one line, so is `problem` for its system."""

    @functools.wraps(original)
    def main(*args, **kwargs):
        if problem and _plugin_system_asked():
            fail(problem)
        try:
            return original(*args, **kwargs)
        except (PluginError, BuildInterruptedError) as e:
            prefix = "cotainr: error"  # a plugin's error names the plugin
            if getattr(e, "plugin", None):
                prefix = plugin_label(e.plugin)
            fail(e, prefix=prefix)

    return main


@functools.cache
def install(cotainr, *, version):
    """Wrap the `cotainr` package's methods for plugins' build hooks; or why not."""
    modules = {m: getattr(cotainr, m) for m in ("cli", "container", "util", "tracing")}
    _state.tracing = cotainr.tracing
    missing = missing_internals(modules)
    cli = cotainr.cli
    if missing:
        problem = (
            f"cotainr-lumi cannot run on cotainr {version}: it lacks "
            f"{', '.join(missing)}. {support_hint(version)}"
        )
        if callable(getattr(cli, "main", None)):
            cli.main = _main(cli.main, problem=problem)
        return problem
    build = cli.Build
    sandbox = cotainr.container.SingularitySandbox
    util = cotainr.util
    util.get_systems = _systems_with_plugins(util.get_systems)
    build.add_arguments = _add_arguments(build.add_arguments.__func__)
    build.__init__ = _init(build.__init__, util)
    build.execute = _execute(build.execute)
    sandbox.__enter__ = _enter(sandbox.__enter__)
    sandbox.__exit__ = _exit(sandbox.__exit__)
    sandbox.add_metadata = _add_metadata(sandbox.add_metadata)
    sandbox.build_image = _build_image(sandbox.build_image, version)
    cli.main = _main(cli.main)
    return None
