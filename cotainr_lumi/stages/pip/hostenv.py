"""
Host pip variables that pass into the container.

Apptainer passes the host environment into the container, ``PIP_*``
variables included. Those holding host paths may point nowhere there:
pip then warns "Location '...' is ignored" for every ``--find-links`` entry
that does not exist, at every package it looks up and in every isolated
build (many times per build), or fails on a missing constraints file or
certificate bundle. This module says so once, and leaves the find-links
entries pip would ignore anyway out of the pip commands.
"""

from dataclasses import dataclass, field
import logging

from ...engine.rootfs import SymlinkLoopError, resolve_in_root

logger = logging.getLogger(f"cotainr.{__name__}")

#: Host pip variables holding paths (which may not exist in the container).
PATH_PIP_VARIABLES = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_CERT")
#: Of those, the ones whose missing entries pip ignores (with a warning each
#: time): they are left out of the pip commands.
IGNORED_WHEN_MISSING = ("PIP_FIND_LINKS",)


@dataclass
class HostPipVariables:
    """What the host's pip variables mean inside the container."""

    warnings: list = field(default_factory=list)
    overrides: dict = field(default_factory=dict)


def _exists_in_root(*, root, path):
    try:
        return resolve_in_root(root=root, path=path).exists()
    except SymlinkLoopError:
        return False


def host_pip_variables(*, root, environ):
    """Check the host's path-valued pip variables against the sandbox."""
    result = HostPipVariables()
    for name in PATH_PIP_VARIABLES:
        value = environ.get(name)
        if not value:
            continue
        entries = value.split()
        missing = list(
            dict.fromkeys(
                p
                for p in entries
                if p.startswith("/") and not _exists_in_root(root=root, path=p)
            )
        )
        if not missing:
            continue
        if name in IGNORED_WHEN_MISSING:
            kept = [p for p in entries if p not in missing]
            result.overrides[name] = " ".join(kept)
            result.warnings.append(
                f"{name}={value} is set on this machine and passes into the "
                f"container, where {', '.join(missing)} does not exist: pip would "
                "ignore it with a warning at every package, so it is left out of "
                f"{name} for the pip steps. Unset {name}, or put the files into "
                "the steps (requirements files can reference local files and "
                "--find-links directories)."
            )
        else:
            result.warnings.append(
                f"{name}={value} is set on this machine and passes into the "
                f"container, where {', '.join(missing)} does not exist (pip fails "
                "on it). Unset it or put the files into the steps (requirements "
                "files can reference local files)."
            )
    return result
