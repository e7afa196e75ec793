"""
Host pip settings that pass into the container, or do not.

Apptainer passes ``PIP_*`` variables into the container, where the host paths
in them may not exist: pip then warns at every package for a missing
``--find-links`` entry (so those are left out), or fails on a missing
constraints file or certificate bundle. A host pip config file is not read
there at all.
"""

import logging
import os
from pathlib import Path

from ...engine.rootfs import resolve_or_none

logger = logging.getLogger(f"cotainr.{__name__}")

#: Host pip variables holding paths (which may not exist in the container).
PATH_PIP_VARIABLES = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_CERT")
PIP_CONFIG_FILES = ("~/.config/pip/pip.conf", "~/.pip/pip.conf")


def _missing(*, root, entries):
    """The absolute paths among `entries` that do not exist in the image."""
    missing = []
    for path in dict.fromkeys(entries):
        if path[:1] != "/":
            continue
        host = resolve_or_none(root=root, path=path)
        if host is None or not host.exists():
            missing.append(path)
    return missing


def host_pip_overrides(*, root, environ):
    """The host pip variables to replace in the container; warn about the rest."""
    overrides = {}
    for name in PATH_PIP_VARIABLES:
        entries = environ.get(name, "").split()
        missing = _missing(root=root, entries=entries)
        if not missing:
            continue
        where = (
            f"{name}={environ[name]} is set on this machine and passes into the "
            f"container, where {', '.join(missing)} does not exist"
        )
        if name == "PIP_FIND_LINKS":  # pip ignores a missing entry, warning each time
            overrides[name] = " ".join(p for p in entries if p not in missing)
            logger.warning(
                f"{where}: pip would ignore it with a warning at every package, so "
                f"it is left out of {name} for the pip steps. Unset {name}, or put "
                "the files into the steps (requirements files can reference local "
                "files and --find-links directories)."
            )
        else:
            logger.warning(
                "%s (pip fails on it). Unset it or put the files into the steps "
                "(requirements files can reference local files).",
                where,
            )
    _note_pip_config()
    return overrides


def _note_pip_config():
    """Say that a host pip config file is not read in the container."""
    for config in map(os.path.expanduser, PIP_CONFIG_FILES):
        if Path(config).is_file():
            logger.info(
                "Your pip config %s is not used inside the container (no home "
                "directory there); PIP_* variables are. Put index URLs etc. "
                "into the pip steps.",
                config,
            )
            return
