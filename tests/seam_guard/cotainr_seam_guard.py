"""
A guard on what cotainr-lumi touches of cotainr (issue 41).

On a cotainr with the build hook, cotainr-lumi may use only the names that
``docs/upstream/seam-api.md`` lists ("What a plugin may use"), never a
private one. :func:`install` records every other access from cotainr-lumi's
code, with its file and line:

- a module attribute (``cotainr.container.SingularitySandbox``,
  ``util._flush_stdin_buffer``): cotainr's modules get a module class whose
  ``__getattribute__`` and ``__setattr__`` look at the calling frame;
- an attribute of an instance of a cotainr class (``sandbox._x``): those
  classes get such a ``__getattribute__`` and ``__setattr__``;
- an attribute of a cotainr class or module replaced or added (a wrapped
  ``SingularitySandbox.__enter__``): :func:`violations` compares them with
  what they were when the guard was installed.

An access is cotainr-lumi's when the calling frame's module is
``cotainr_lumi`` or below it, or its start-up hook ``_cotainr_plugins_hook``.
Accesses by cotainr itself, or by the standard library on cotainr-lumi's
behalf (``dataclasses.replace``), are not checked.
"""

import functools
import importlib
import inspect
import sys
import types

#: The cotainr names a plugin may use: module attributes, by module.
MODULE_NAMES = {
    "cotainr": {"__version__", "cli", "container", "plugins", "tracing", "util"},
    "cotainr.cli": {"Build", "CotainrCLI", "main"},
    "cotainr.container": {"SandboxLinkError"},
    "cotainr.plugins": {
        "HOOK_API_VERSION",
        "PLUGIN_GROUP",
        "BuildContext",
        "PluginError",
        "installed_plugins",
        "load_plugins",
    },
    "cotainr.tracing": {"LogSettings"},
    "cotainr.util": {"get_systems", "systems_file"},
}
#: The attributes of instances of cotainr classes a plugin may read.
INSTANCE_NAMES = {
    "cotainr.cli.Build": {"execute"},
    "cotainr.cli.CotainrCLI": {"args", "subcommand"},
    "cotainr.container.SandboxLinkError": {"args"},
    "cotainr.container.SingularitySandbox": {
        "add_to_env",
        "architecture",
        "host_path",
        "run_command_in_container",
        "sandbox_dir",
    },
    "cotainr.plugins.BuildContext": {
        "base_image",
        "conda_env_files",
        "conda_env_name",
        "conda_prefix",
        "dry_run",
        "image_path",
        "options",
        "system",
    },
    "cotainr.plugins.PluginError": {"args", "exit_code", "with_traceback"},
    "cotainr.tracing.LogSettings": {"log_file_path", "no_color", "verbosity"},
}
#: The attributes of instances of cotainr classes a plugin may set.
INSTANCE_WRITES = {"cotainr.plugins.PluginError": {"exit_code"}}
#: Python's own attributes of objects and modules (imports read them).
PYTHON_NAMES = {
    "__cause__",
    "__class__",
    "__context__",
    "__doc__",
    "__file__",
    "__loader__",
    "__module__",
    "__name__",
    "__package__",
    "__path__",
    "__qualname__",
    "__spec__",
    "__traceback__",
}
#: The modules of cotainr the guard watches.
MODULES = ("cotainr", "cotainr.cli", "cotainr.container", "cotainr.pack")
MODULES += ("cotainr.plugins", "cotainr.tracing", "cotainr.util")


@functools.cache
def _state():
    """What the guard found, watches, and saw when it was installed."""
    return types.SimpleNamespace(found={}, watched=set(), snapshot={})


def install():
    """Watch cotainr's modules and classes (once per process)."""
    state = _state()
    if state.snapshot:
        return
    modules = {}
    for module_name in MODULES:
        try:
            modules[module_name] = importlib.import_module(module_name)
        except ModuleNotFoundError:  # cotainr.plugins: a cotainr without plugins
            continue
    for module_name, module in modules.items():
        state.snapshot[module_name] = dict(vars(module))
        module.__class__ = _WatchedModule
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module_name:
                state.snapshot[f"{module_name}.{name}"] = dict(vars(value))
                _watch_class(value)


def violations():
    """
    The accesses of cotainr-lumi to names of cotainr it may not use.

    Returns
    -------
    found : list of str
        One line each, e.g. "read cotainr.container.SingularitySandbox
        ._subprocess_runner (cotainr_lumi/_cotainr/layering.py:31)", then one
        line per attribute of a cotainr class or module replaced or added.
    """
    state = _state()
    found = list(state.found)
    for owner, before in state.snapshot.items():
        now = vars(_resolve(owner))
        for name, value in now.items():
            if name in ("__getattribute__", "__setattr__") and owner in state.watched:
                continue
            if name not in before or before[name] is not value:
                found.append(f"replaced {owner}.{name}")
    return found


def _resolve(owner):
    """The module or class named `owner`."""
    if owner in sys.modules:
        return sys.modules[owner]
    module_name, _, class_name = owner.rpartition(".")
    return vars(sys.modules[module_name])[class_name]


def _lumi_frame(frame):
    """Whether `frame` runs cotainr-lumi's code."""
    module = frame.f_globals.get("__name__", "")
    return module.split(".")[0] in ("cotainr_lumi", "_cotainr_plugins_hook")


def _record(kind, owner, name, frame):
    """Record a violation at `frame` (once per place)."""
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    for root in sys.path:
        if root and where.startswith(root.rstrip("/") + "/"):
            where = where[len(root.rstrip("/")) + 1 :]
            break
    _state().found.setdefault(f"{kind} {owner}.{name} ({where})", None)


def _allowed(name, listed):
    """Whether `name` is one of `listed`, or Python's own (not private)."""
    return name in listed or name in PYTHON_NAMES


class _WatchedModule(types.ModuleType):
    """A cotainr module that records cotainr-lumi's accesses to unlisted names."""

    def __getattribute__(self, name):
        frame = sys._getframe(1)
        if _lumi_frame(frame):
            module_name = super().__getattribute__("__name__")
            if not _allowed(name, MODULE_NAMES.get(module_name, ())):
                _record("read", module_name, name, frame)
        return super().__getattribute__(name)

    def __setattr__(self, name, value):
        frame = sys._getframe(1)
        if _lumi_frame(frame):
            _record("set", super().__getattribute__("__name__"), name, frame)
        super().__setattr__(name, value)


def _watch_class(cls):
    """Record cotainr-lumi's accesses to unlisted attributes of `cls` instances."""
    owner = f"{cls.__module__}.{cls.__qualname__}"
    _state().watched.add(owner)
    reads = INSTANCE_NAMES.get(owner, set())
    writes = INSTANCE_WRITES.get(owner, set())

    def watched_getattribute(self, name):
        frame = sys._getframe(1)
        if _lumi_frame(frame) and type(self) is cls and not _allowed(name, reads):
            _record("read", owner, name, frame)
        return super(cls, self).__getattribute__(name)

    def watched_setattr(self, name, value):
        frame = sys._getframe(1)
        if _lumi_frame(frame) and type(self) is cls and name not in writes:
            _record("set", owner, name, frame)
        original_setattr(self, name, value)

    original_setattr = vars(cls).get("__setattr__")
    if original_setattr is None:

        def original_setattr(self, name, value):
            super(cls, self).__setattr__(name, value)

    cls.__getattribute__ = watched_getattribute
    cls.__setattr__ = watched_setattr
