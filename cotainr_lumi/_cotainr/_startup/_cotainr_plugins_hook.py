"""
Load cotainr plugins into a stock ``cotainr build`` (a cotainr without discovery).

Installed at the top of site-packages with a ``.pth`` file that imports it at
interpreter start. In a ``cotainr build`` process only (``info`` imports no
plugin) it loads the ``cotainr.plugins`` entry points there and then, before
the ``cotainr`` script imports cotainr's ``main``. Nothing happens when
cotainr has the build hook or ``COTAINR_DISABLE_PLUGINS`` /
``COTAINR_LUMI_DISABLE`` is set; a failure is one warning and stock cotainr
runs. Every other process imports only ``os`` and ``sys`` here.
"""

import os
import sys

DISABLE_ENV_VARS = ("COTAINR_DISABLE_PLUGINS", "COTAINR_LUMI_DISABLE")


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


def install():
    """Load the plugins now, in a ``cotainr build`` process: before its ``main`` runs."""
    if wanted(getattr(sys, "argv", None), os.environ):
        load_plugins()


try:
    install()
except Exception:  # noqa: BLE001, S110 - never break a Python process
    pass
