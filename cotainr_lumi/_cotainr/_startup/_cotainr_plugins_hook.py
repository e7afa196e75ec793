"""
Generic start-up hook that loads cotainr plugins.

cotainr has no plugin mechanism, so cotainr-lumi installs this module at the
top of site-packages together with a ``.pth`` file that imports it when the
interpreter starts. It only places a tiny import finder in front of
``sys.meta_path``; nothing else happens unless and until ``cotainr.cli`` is
imported. Then, right after ``cotainr.cli`` has executed, every entry point
of the group ``cotainr.plugins`` is loaded and its ``on_stock_cotainr`` (or
the entry point itself, if it is a function) is called with the
``cotainr.cli`` module, provided the installed cotainr satisfies the
``cotainr`` requirement of the plugin's distribution. The plugin decides
what a cotainr without its seam needs (cotainr-lumi: the backport of the
build stage seam). A plugin that does not fit, or fails, is left
out with one warning and cotainr runs unchanged.

Set ``COTAINR_LUMI_DISABLE=1`` (or cotainr's ``COTAINR_DISABLE_PLUGINS=1``)
to turn the hook off entirely.

This module must stay import-cheap: standard library only, nothing imported
at start-up beyond ``os`` and ``sys``.
"""

import os
import sys

DISABLE_ENV_VAR = "COTAINR_LUMI_DISABLE"
#: cotainr's own switch for plugins (with the upstream plugin support); the
#: hook honours it too, so one variable turns plugins off on every cotainr.
COTAINR_DISABLE_ENV_VAR = "COTAINR_DISABLE_PLUGINS"
ENTRY_POINT_GROUP = "cotainr.plugins"
TARGET_MODULE = "cotainr.cli"


def _warn(message):
    """Print one warning line on stderr."""
    sys.stderr.write(f"WARNING (cotainr plugin hook): {message}\n")


def _plugin_fits_cotainr(entry_point):
    """Check the plugin distribution's cotainr requirement; return a reason if not."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        cotainr_version = version("cotainr")
    except PackageNotFoundError:
        return "cotainr is not installed as a distribution"
    for text in dist.requires or []:
        req = Requirement(text)
        if req.name.lower() != "cotainr":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if not req.specifier.contains(Version(cotainr_version), prereleases=True):
            return (
                f"{dist.metadata['Name']} {dist.version} supports cotainr{req.specifier} "
                f"but cotainr {cotainr_version} is installed"
            )
    return None


def native_plugin_support(cli_module):
    """
    Whether cotainr loads its plugins and runs their build stages itself.

    Parameters
    ----------
    cli_module : module
        The freshly imported ``cotainr.cli`` module.

    Returns
    -------
    native : bool
        True when cotainr has ``cotainr.plugins.load_plugins`` and the build
        stage seam (``cotainr.stages``); this hook then does nothing. A
        cotainr with plugin discovery but without the seam still gets the
        plugins' ``on_stock_cotainr``.
    """
    from importlib.util import find_spec

    plugins = getattr(cli_module, "plugins", None)
    try:
        has_stages = find_spec("cotainr.stages") is not None
    except (ImportError, ValueError):  # pragma: no cover - odd installs
        has_stages = False
    return callable(getattr(plugins, "load_plugins", None)) and has_stages


def load_plugins(cli_module):
    """
    Load and activate every ``cotainr.plugins`` entry point.

    Parameters
    ----------
    cli_module : module
        The freshly imported ``cotainr.cli`` module.

    Returns
    -------
    loaded : list of str
        The names of the plugins activated.
    """
    loaded = []
    try:
        from importlib.metadata import entry_points

        try:
            eps = entry_points(group=ENTRY_POINT_GROUP)
        except TypeError:  # Python 3.9
            eps = entry_points().get(ENTRY_POINT_GROUP, [])
    except Exception as e:  # pragma: no cover - broken metadata
        _warn(f"cannot list cotainr plugins ({e}); running stock cotainr")
        return loaded
    for ep in eps:
        try:
            reason = _plugin_fits_cotainr(ep)
            if reason:
                _warn(
                    f"plugin '{ep.name}' not loaded: {reason}; running stock cotainr. "
                    f"Set {DISABLE_ENV_VAR}=1 to silence this."
                )
                continue
            plugin = ep.load()
            activate = getattr(plugin, "on_stock_cotainr", None)
            if activate is None and callable(plugin) and not isinstance(plugin, type):
                activate = plugin
            if activate is not None:
                activate(cli_module)
            loaded.append(ep.name)
        except Exception as e:
            _warn(
                f"plugin '{ep.name}' failed to load ({type(e).__name__}: {e}); "
                "running stock cotainr for it."
            )
    return loaded


def _system_in_argv(argv):
    """The value of ``--system`` in `argv`, or None."""
    for i, arg in enumerate(argv):
        if arg == "--system" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--system="):
            return arg.split("=", 1)[1]
    return None


def _is_known_system(system):
    """Whether cotainr's own systems include `system` (True if unsure)."""
    try:
        from cotainr import util

        return system in util.get_systems()
    except Exception:
        return True


def explain_unknown_systems(main):
    """
    Wrap cotainr's ``main``: an unknown system while plugins are off is one line.

    A stock cotainr answers an unknown ``--system`` with a ``KeyError``
    traceback; with plugins turned off, a plugin's system (e.g. cotainr-lumi's
    ``lumi-g-ext``) is unknown, and the user gets one line saying why.

    Parameters
    ----------
    main : callable
        cotainr's entry point.

    Returns
    -------
    wrapped : callable
        The entry point.
    """
    why = (
        f"cotainr plugins are turned off ({COTAINR_DISABLE_ENV_VAR} or "
        f"{DISABLE_ENV_VAR} is set), so the systems they add are not available"
    )

    def wrapped(*args, **kwargs):
        system = _system_in_argv(sys.argv[1:])
        try:
            return main(*args, **kwargs)
        except KeyError as e:
            if e.args != ("System does not exist",):
                raise
            sys.stderr.write(
                f"cotainr: error: unknown system {system!r}: {why}. Unset it, or "
                "run 'cotainr info' for the systems available now.\n"
            )
            raise SystemExit(2) from None
        except SystemExit as e:
            # A cotainr that checks --system while parsing (upstream patch
            # 0001) has said the system is unknown: add why.
            if e.code == 2 and system is not None and not _is_known_system(system):
                sys.stderr.write(f"cotainr: note: {why}.\n")
            raise

    wrapped.__wrapped__ = main
    return wrapped


class _CotainrCliFinder:
    """A one-shot meta path finder that wraps the loader of cotainr.cli."""

    def __init__(self, *, plugins=True):
        self.plugins = plugins

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET_MODULE:
            return None
        from importlib.machinery import PathFinder

        try:
            sys.meta_path.remove(self)
        except ValueError:  # pragma: no cover
            pass
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ActivatingLoader(spec.loader, plugins=self.plugins)
        return spec

    def invalidate_caches(self):
        pass


class _ActivatingLoader:
    """Delegate to the real loader, then load the plugins."""

    def __init__(self, loader, *, plugins=True):
        self._loader = loader
        self._plugins = plugins

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        if not self._plugins:
            if callable(getattr(module, "main", None)):
                module.main = explain_unknown_systems(module.main)
            return
        if native_plugin_support(module):
            return
        load_plugins(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def install():
    """
    Place the finder in front of ``sys.meta_path``.

    Returns
    -------
    installed : bool
        Whether plugins will be loaded (False when turned off: then only an
        unknown system is explained in one line instead of a traceback).
    """
    disabled = any(
        os.environ.get(name, "") not in ("", "0")
        for name in (DISABLE_ENV_VAR, COTAINR_DISABLE_ENV_VAR)
    )
    if TARGET_MODULE in sys.modules:
        return False
    if any(isinstance(f, _CotainrCliFinder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _CotainrCliFinder(plugins=not disabled))
    return not disabled


def uninstall():
    """Remove the finder (e.g. when a plugin drives cotainr itself)."""
    for finder in [f for f in sys.meta_path if isinstance(f, _CotainrCliFinder)]:
        sys.meta_path.remove(finder)


install()
