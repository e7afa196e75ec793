"""
The build hook of ``docs/upstream/seam-api.md`` (its types) on a cotainr without it.

:func:`install` wraps the cotainr internals of :data:`RELIED_ON` so that the
plugins' hooks run where a cotainr with the hook calls them. When one is
missing nothing is wrapped: stock cotainr runs unchanged and a plugin's
system is one error naming the cotainr version.
"""

import argparse
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import os
from pathlib import Path
import signal
import sys
import types
from typing import Optional

from ..errors import fail
from ..imagelayout import ENV_SCRIPTS_DIR, LABELS_FILE

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


class BuildInterruptedError(BaseException):
    """The build was stopped by a signal (a ``BaseException``, as Ctrl-C's)."""

    def __init__(self, signum):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(
            f"the build was interrupted by {signal.Signals(signum).name}; no image "
            "was written (an existing image is kept) and the build's sandbox and "
            "partial files were removed"
        )


#: What the shim needs of cotainr: (module, attribute path).
RELIED_ON = (
    ("cli", "main"),
    ("cli", "Build.add_arguments"),
    ("cli", "Build.__init__"),
    ("cli", "Build.execute"),
    ("container", "SingularitySandbox.__enter__"),
    ("container", "SingularitySandbox.__exit__"),
    ("container", "SingularitySandbox.add_metadata"),
    ("container", "SingularitySandbox.build_image"),
    ("container", "SingularitySandbox.add_to_env"),
    ("util", "get_systems"),
)
#: The parameters of cotainr's ``Build`` the shim reads.
BUILD_PARAMETERS = ("image_path", "base_image", "system", "conda_env")
PLUGIN_GROUP = "cotainr.plugins"
#: cotainr's options of the upstream series, added where cotainr lacks them.
BACKPORTED_OPTIONS = {
    "--force": "overwrite an existing image without asking; the old image is "
    "replaced only once the new one is built",
    "--dry-run": "print what the build would do and build nothing",
}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: `build`: the Build running now with the shim's steps (None: none or stock).
_state = types.SimpleNamespace(build=None, tracing=None)


def _taking_part():
    return _state.build._shim_taking_part if _state.build else {}


def missing_internals(modules):
    """The names of :data:`RELIED_ON` that `modules` lack."""
    missing = []
    for module, path in RELIED_ON:
        obj = modules.get(module)
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if not callable(obj):
            missing.append(f"{module}.{path}")
    try:
        parameters = inspect.signature(modules["cli"].Build.__init__).parameters
    except (AttributeError, TypeError, ValueError):
        parameters = {}
    missing += [
        f"cli.Build.__init__({name}=...)"
        for name in BUILD_PARAMETERS
        if name not in parameters
    ]
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
        try:
            plugins[ep.name] = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin is left out
            logger.warning("cotainr plugin %r not loaded: %s", ep.name, e)
    return plugins


def _plugins():
    """The plugins, unless ``COTAINR_DISABLE_PLUGINS`` is set."""
    off = os.environ.get("COTAINR_DISABLE_PLUGINS", "") not in ("", "0")
    return {} if off else load_plugins()


def hooks():
    """The build hooks of the plugins, by plugin name."""
    found = {name: getattr(p, "build_hook", None) for name, p in _plugins().items()}
    return {n: h for n, h in found.items() if getattr(h, "api_version", None) == 1}


def _systems_with_plugins(get_systems):
    @functools.wraps(get_systems)
    def wrapped():
        systems = get_systems()
        for name, plugin in _plugins().items():
            try:
                extra = plugin.systems() if hasattr(plugin, "systems") else {}
            except Exception as e:  # noqa: BLE001 - one warning, cotainr goes on
                logger.warning("systems of cotainr plugin %r not read: %s", name, e)
                continue
            for system, value in extra.items():
                systems.setdefault(system, value)
        return systems

    return wrapped


def _system_problem(system):
    """A plugin's word on a system it does not define (``system_problem``)."""
    none = lambda name: None  # noqa: E731 - a plugin without system_problem
    asked = (getattr(p, "system_problem", none)(system) for p in _plugins().values())
    return next(filter(None, asked), None)


def _add_arguments(original):
    @functools.wraps(original)
    def add_arguments(cls, *, parser):
        original(cls, parser=parser)
        added = {}
        backported = parser.add_argument_group("options of cotainr's upstream series")
        for option, text in BACKPORTED_OPTIONS.items():  # where cotainr lacks them
            try:
                action = backported.add_argument(option, action="store_true", help=text)
            except argparse.ArgumentError:
                continue
            added[action.dest] = option
        cls._shim_own_options = added
        cls._shim_plugin_options = {}
        for name, hook in hooks().items():
            group = parser.add_argument_group(f"{name} plugin")
            recorder = _Recorder(group)
            try:
                hook.add_arguments(parser=recorder)
            except argparse.ArgumentError as e:
                logger.warning("cotainr plugin %r left out: %s", name, e)
                continue
            cls._shim_plugin_options[name] = recorder.defaults

    return classmethod(add_arguments)


class _Recorder:
    """An argument group recording the dest of each option added."""

    def __init__(self, group):
        self._group = group
        self.defaults = {}

    def add_argument(self, *args, **kwargs):
        action = self._group.add_argument(*args, **kwargs)
        self.defaults[action.dest] = action.default
        return action

    def __getattr__(self, name):
        return getattr(self._group, name)


def _partial_path(image_path):
    return image_path.with_name(f".{image_path.name}.partial-{os.getpid()}")


def _context(kwargs, *, dry_run, systems):
    from . import CONDA_ENV_NAME, CONDA_PREFIX

    system = kwargs.get("system")
    files = kwargs.get("conda_env") or ()
    if not isinstance(files, (list, tuple)):  # cotainr releases take one file
        files = (files,)
    base_image = systems[system]["base-image"] if system else kwargs.get("base_image")
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
        self._shim_taking_part = {}
        self._shim_own_dry_run = bool(dry_run)
        self._shim_dry_run = bool(dry_run or kwargs.get("dry_run"))
        system = kwargs.get("system")
        systems = util.get_systems()
        if system is not None and system not in systems:
            raise PluginError(
                _system_problem(system)
                or f"System does not exist: {system!r}. Available systems: "
                f"{', '.join(sorted(systems)) or 'none'} (see 'cotainr info').",
                exit_code=2,
            )
        self._shim_context = _context(
            kwargs, dry_run=self._shim_dry_run, systems=systems
        )
        for name, hook in hooks().items():
            if name not in options:  # its options clashed: left out
                continue
            context = dataclasses.replace(
                self._shim_context, options=types.MappingProxyType(options[name])
            )
            lines = hook.prepare(context=context)
            if lines is not None:
                self._shim_taking_part[name] = (hook, context, lines)
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
        target = getattr(self, "_shim_target", None)
        if getattr(self, "_shim_own_dry_run", False):
            return _print_dry_run(self, cotainr_lines=True)
        if getattr(self, "_shim_dry_run", False):  # cotainr's own --dry-run
            original(self)
            return _print_dry_run(self, cotainr_lines=False)
        if not taking_part and target is None:
            return original(self)
        _state.build = self
        self._shim_customized = False
        try:
            with stop_cleanly_on_signals(), _spinner_only_on_a_terminal():
                original(self)
        except BaseException as error:
            report = error
            for name, (hook, context, _lines) in reversed(taking_part.items()):
                try:
                    hook.finalize(context=context, error=error)
                except PluginError as explained:  # the plugin explains the failure
                    report = explained
                except Exception:  # noqa: BLE001 - the first error is reported
                    logger.exception("finalize of cotainr plugin %r failed", name)
            if report is error:
                raise
            raise report from error
        finally:
            _state.build = None
        for hook, context, _lines in taking_part.values():
            hook.finalize(context=context, error=None)

    return execute


def _add_metadata(original):
    @functools.wraps(original)
    def add_metadata(self, *args, **kwargs):
        if not _taking_part():
            return original(self, *args, **kwargs)
        labels = {}
        for name, (hook, context, _lines) in _taking_part().items():
            added = hook.customize(sandbox=self, context=context) or {}
            for key, value in added.items():
                if str(key).startswith("cotainr."):
                    raise PluginError(
                        f"cotainr plugin {name!r} set the label {key!r}; labels "
                        "starting with 'cotainr.' are cotainr's"
                    )
                labels[str(key)] = str(value)
        _write_labels(Path(self.sandbox_dir), labels)
        result = original(self, *args, **kwargs)
        _state.build._shim_customized = True
        return result

    return add_metadata


def _refuse_links(sandbox_dir, image_path):
    """The sandbox path of `image_path`; stop before writing through a base image's link."""
    link = sandbox_dir
    for part in image_path.strip("/").split("/"):
        link = link / part
        if link.is_symlink():
            raise PluginError(
                f"The base image's /{link.relative_to(sandbox_dir)} is a symbolic "
                "link; the build does not write through it. Use a base image "
                "without it."
            )
    return link


def _add_to_env(original):
    @functools.wraps(original)
    def add_to_env(self, *args, **kwargs):
        if _taking_part():
            _refuse_links(Path(self.sandbox_dir), ENV_SCRIPTS_DIR)
        return original(self, *args, **kwargs)

    return add_to_env


def _write_labels(sandbox_dir, labels):
    """Add `labels` to the sandbox's labels.json, before cotainr adds its own."""
    path = _refuse_links(sandbox_dir, LABELS_FILE)
    metadata = {}
    with contextlib.suppress(ValueError):  # also an empty file
        text = path.read_text().strip() if path.is_file() else ""
        metadata = json.JSONDecoder().raw_decode(text)[0]
    kept = metadata.items() if isinstance(metadata, dict) else ()
    metadata = {k: v for k, v in kept if not k.startswith("cotainr.")}
    path.write_text(json.dumps({**metadata, **labels}))


def _ask_hooks(method, **kwargs):
    """The first answer of the taking-part hooks' `method` that is not None/False."""
    for _name, (hook, context, _lines) in _taking_part().items():
        ask = getattr(hook, method, None)
        answer = ask(context=context, **kwargs) if ask is not None else None
        if answer:
            return answer
    return None


def _enter(original):
    @functools.wraps(original)
    def enter(self):
        runner = getattr(self, "_subprocess_runner", None)
        if not _taking_part() or runner is None:
            return original(self)

        def provided_or_unpacked(*, args, **kwargs):
            if "--sandbox" not in map(str, args):
                return runner(args=args, **kwargs)
            release = _ask_hooks("sandbox", sandbox_dir=Path(self.sandbox_dir))
            if release is None:
                return runner(args=args, **kwargs)
            release.__enter__()
            self._shim_release = release
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
    """Exit the sandbox a plugin provided (before cotainr removes its directory)."""
    release = vars(sandbox).pop("_shim_release", None)
    if release is not None:
        release.__exit__(None, None, None)


def _exit(original):
    @functools.wraps(original)
    def exit_(self, *args):
        _release(self)
        return original(self, *args)

    return exit_


def _build_image(original, version):
    def write(sandbox, path):
        if not _ask_hooks("write_image", sandbox=sandbox, path=Path(path)):
            original(sandbox, path=path)

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
            return write(self, path)  # e.g. cotainr's own partial
        # cotainr writes the image itself: build it aside, replace when complete.
        partial = _partial_path(target)
        try:
            write(self, partial)
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


def process_tree(pid):
    """`pid` and the process ids below it (Linux /proc)."""
    found, todo = [pid], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


@contextlib.contextmanager
def stop_cleanly_on_signals():
    """Turn SIGTERM/SIGHUP/SIGINT into :class:`BuildInterruptedError`."""

    def handler(signum, frame):
        for sig in STOP_SIGNALS:  # once: the clean-up must not be interrupted
            signal.signal(sig, signal.SIG_IGN)
        for pid in process_tree(os.getpid())[1:]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        raise BuildInterruptedError(signum)

    try:
        saved = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread
        saved = {}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def _plugin_system_asked():
    """Whether the command line's ``--system`` is a plugin's."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
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
            fail(e)

    return main


@functools.cache
def install(*, cli, container, util, tracing, version):
    """Wrap cotainr's methods so that plugins' build hooks run; or why they cannot."""
    _state.tracing = tracing
    missing = missing_internals({"cli": cli, "container": container, "util": util})
    if missing:
        problem = (
            f"cotainr-lumi cannot run on cotainr {version}: it lacks "
            f"{', '.join(missing)}. {support_hint(version)}"
        )
        if callable(getattr(cli, "main", None)):
            cli.main = _main(cli.main, problem=problem)
        return problem
    build, sandbox = cli.Build, container.SingularitySandbox
    util.get_systems = _systems_with_plugins(util.get_systems)
    build.add_arguments = _add_arguments(build.add_arguments.__func__)
    build.__init__ = _init(build.__init__, util)
    build.execute = _execute(build.execute)
    sandbox.add_metadata = _add_metadata(sandbox.add_metadata)
    sandbox.add_to_env = _add_to_env(sandbox.add_to_env)
    sandbox.build_image = _build_image(sandbox.build_image, version)
    sandbox.__enter__ = _enter(sandbox.__enter__)
    sandbox.__exit__ = _exit(sandbox.__exit__)
    cli.main = _main(cli.main)
    return None
