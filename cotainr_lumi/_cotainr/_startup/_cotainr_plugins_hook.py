"""
Load cotainr plugins into a stock ``cotainr build`` (a cotainr without discovery).

Installed at the top of site-packages with a ``.pth`` file that imports it at
interpreter start: in a ``cotainr build`` process only (``info`` and ``--help``
import no plugin), it loads the ``cotainr.plugins`` entry points once
``cotainr.cli`` is imported. Nothing happens when cotainr has the build hook or
``COTAINR_DISABLE_PLUGINS`` / ``COTAINR_LUMI_DISABLE`` is set; a failure is one
warning and stock cotainr runs. Standard library only (``os`` and ``sys`` at start).
"""

import os
import sys

DISABLE_ENV_VARS = ("COTAINR_DISABLE_PLUGINS", "COTAINR_LUMI_DISABLE")
TARGET_MODULE = "cotainr.cli"


def wanted(argv, environ):
    """Whether this process is ``cotainr build`` with plugins on."""
    if not argv or os.path.basename(str(argv[0])) != "cotainr":
        return False
    if list(argv[1:2]) != ["build"]:  # cotainr's main parser takes no value
        return False
    return all(environ.get(name, "") in ("", "0") for name in DISABLE_ENV_VARS)


def load_plugins():
    """Load every ``cotainr.plugins`` entry point (unless cotainr has the hook)."""
    try:
        from importlib import import_module
        from importlib.metadata import entry_points
        from importlib.util import find_spec

        if find_spec("cotainr.plugins") is not None:
            # A cotainr that discovers plugins but lacks the build hook still
            # needs them loaded (their shim) before its parser is made.
            if hasattr(import_module("cotainr.plugins"), "HOOK_API_VERSION"):
                return
        try:
            found = entry_points(group="cotainr.plugins")
        except TypeError:  # Python 3.9
            found = entry_points().get("cotainr.plugins", [])
        for ep in found:
            try:
                ep.load()
            except Exception as e:  # noqa: BLE001 - one warning, cotainr runs
                sys.stderr.write(
                    f"WARNING: cotainr plugin {ep.name!r} not loaded "
                    f"({type(e).__name__}: {e}); running stock cotainr.\n"
                )
    except Exception as e:  # noqa: BLE001 - never stop cotainr
        sys.stderr.write(f"WARNING: cotainr plugins not loaded ({e}).\n")


class _Finder:
    """A one-shot import finder: load the plugins right after cotainr.cli."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET_MODULE:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        load_plugins()

    def __getattr__(self, name):
        return getattr(self._loader, name)


def install():
    """Place the finder in front of ``sys.meta_path`` in a ``cotainr`` process."""
    if (
        wanted(getattr(sys, "argv", None), os.environ)
        and TARGET_MODULE not in sys.modules
    ):
        sys.meta_path.insert(0, _Finder())


try:
    install()
except Exception:  # noqa: BLE001, S110 - never break a Python process
    pass
