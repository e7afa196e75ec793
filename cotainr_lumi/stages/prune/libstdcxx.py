"""
Remove an environment's own libstdc++ when that is safe.

Safe: the base image's (found as the loader would, inside the sandbox)
defines every symbol version the environment's ELF objects need from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
import os
from pathlib import PurePosixPath
import re

from ...engine.elfinfo import DEFAULT_LOADER_DIRS, read_elf_info, scan_elf_files
from ...engine.rootfs import image_path_of, is_inside, resolve_in_root, resolve_or_none
from ...engine.targetenv import SYSTEM_PREFIXES
from .manifest import ManifestEntry

logger = logging.getLogger(f"cotainr.{__name__}")

#: The SONAME the loader looks for.
LIBSTDCXX_SONAME = "libstdc++.so.6"
#: The file names removed from ``<env>/lib`` (as the hand-built images do).
LIBSTDCXX_GLOB = "libstdc++.so*"

_LDCONFIG_LINE = re.compile(
    r"^\s*(?P<name>\S+)\s+\((?P<flags>[^)]*)\).*=>\s*(?P<path>/.*?)\s*$"
)


def version_sort_key(version):
    """Sort ``GLIBCXX_3.4.9`` before ``GLIBCXX_3.4.30``."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", version)
        if part
    )


def parse_ldconfig(*, text):
    """Parse ``ldconfig -p`` output."""
    matches = (_LDCONFIG_LINE.match(line) for line in text.splitlines())
    return [(m["name"], m["flags"], m["path"]) for m in matches if m]


@dataclass
class SystemLib:
    """A library of the base image."""

    image_path: str
    info: object
    how: str


def _candidates(ldconfig_text):
    """(image path, how found) of each place the loader would look, in order."""
    found = [
        (path, "ld.so.cache")
        for name, _flags, path in parse_ldconfig(text=ldconfig_text)
        if name == LIBSTDCXX_SONAME
    ]
    dirs = [
        (f"{d}/{LIBSTDCXX_SONAME}", "standard directory") for d in DEFAULT_LOADER_DIRS
    ]
    return found + dirs


def _regular_file(*, root, image_path):
    """The host path of `image_path` if it is a regular file (not a link), else None."""
    try:
        host = resolve_in_root(root=root, path=image_path)
    except OSError as e:  # a symlink loop
        logger.debug("Skipping %s: %s", image_path, e)
        return None
    if host.is_file() and not host.is_symlink():
        return host
    return None


def find_system_libstdcxx(*, root, ldconfig_text="", exclude=None, like=None):
    """The base image's ``libstdc++.so.6``: its loader cache first, then the standard directories."""
    seen = set()
    for image_path, how in _candidates(ldconfig_text):
        host = _regular_file(root=root, image_path=image_path)
        if host is None or host in seen:
            continue
        seen.add(host)
        if exclude is not None and is_inside(parent=exclude, path=host):
            continue
        info = read_elf_info(path=host)
        if info is None or info.soname != LIBSTDCXX_SONAME:
            continue
        if like is None or info.compatible_with(like):
            return SystemLib(image_path=image_path, info=info, how=how)
    return None


@dataclass
class LibstdcxxCheck:
    """The outcome of the safety check."""

    env_prefix: str
    status: str
    reason: str
    candidates: list = field(default_factory=list)
    system: SystemLib | None = None
    missing: dict = field(default_factory=dict)
    objects_checked: int = 0
    requirers: int = 0


_LOOP = "is a symlink loop (too many levels of symbolic links), so its libstdc++ is left alone"


class _LeftAloneError(Exception):
    """The env's libstdc++ is not looked at: (status, reason) of its check."""


def _env_dir(*, root, env_prefix):
    """The env's host directory (a separate env's, existing)."""
    env_host = resolve_or_none(root=root, path=env_prefix)
    if env_host is None:
        raise _LeftAloneError("unsupported", f"{env_prefix} {_LOOP}")
    real_prefix = str(image_path_of(root=root, host_path=env_host))
    if real_prefix in SYSTEM_PREFIXES:
        raise _LeftAloneError(
            "unsupported",
            f"the active Python's prefix is {real_prefix}, the system itself "
            "rather than a separate environment; the system's libstdc++ is "
            "never removed",
        )
    if not env_host.is_dir():
        raise _LeftAloneError(
            "absent", f"the environment {env_prefix} does not exist in the image"
        )
    return env_host


def _lib_files(*, root, env_prefix, env_host):
    """The ``libstdc++.so*`` of the env's ``lib`` (a directory inside the env)."""
    lib_image = f"{env_prefix}/lib"
    lib_host = resolve_or_none(root=root, path=lib_image)
    if lib_host is None:
        raise _LeftAloneError("unsupported", f"{lib_image} {_LOOP}")
    if not lib_host.is_dir():
        raise _LeftAloneError("absent", f"{lib_image} does not exist")
    if lib_host == env_host or not is_inside(parent=env_host, path=lib_host):
        raise _LeftAloneError(
            "unsupported",
            f"{lib_image} is a link to "
            f"{image_path_of(root=root, host_path=lib_host)}, outside the "
            "environment; nothing there is removed",
        )
    candidates = sorted(
        p for p in lib_host.glob(LIBSTDCXX_GLOB) if p.is_symlink() or p.is_file()
    )
    if not candidates:
        raise _LeftAloneError("absent", f"no {LIBSTDCXX_GLOB} in {lib_image}")
    return candidates


def _libstdcxx_users(*, root, env_prefix, candidates):
    """The env's ELF objects that use libstdc++."""
    like = None
    for path in candidates:
        if not path.is_symlink():
            like = read_elf_info(path=path) or like
    skip = {str(p) for p in candidates}
    needs = {}
    objects = 0
    for info in scan_elf_files(root=root, path=env_prefix, skip=skip):
        objects += 1
        versions = info.needs_from(prefix="libstdc++.so.")
        if versions or any(n.startswith("libstdc++.so.") for n in info.needed):
            like = like or info
            needs[info.path] = (info, versions)
    return needs, objects, like


def _reason(*, system, missing, needs):
    """Why removing the env's libstdc++ is safe or not, once its users are known."""
    if system is None:  # then every user is missing: unsafe
        where = "the image's ld.so.cache and " + ", ".join(DEFAULT_LOADER_DIRS)
        but = (
            f", but {len(needs)} object(s) of the env need it"
            if needs
            else "; no ELF object of the environment uses libstdc++"
        )
        return f"the base image has no {LIBSTDCXX_SONAME} (looked in {where}){but}"
    if missing:
        return (
            f"{len(missing)} ELF object(s) need versions that the base image's "
            f"{system.image_path} does not define"
        )
    versions = {v for _info, vs in needs.values() for v in vs}
    newest = max(versions, key=version_sort_key, default=None)
    return (
        f"the base image's {system.image_path} ({system.how}) defines every "
        f"version the {len(needs)} object(s) using libstdc++ need"
        + (f" (highest: {newest})" if newest else "")
    )


def check_libstdcxx(*, root, env_prefix, ldconfig_text=""):
    """Check whether removing the env's libstdc++ is safe."""
    env_prefix = str(PurePosixPath("/", env_prefix))
    try:
        env_host = _env_dir(root=root, env_prefix=env_prefix)
        candidates = _lib_files(root=root, env_prefix=env_prefix, env_host=env_host)
    except _LeftAloneError as e:
        status, reason = e.args
        return LibstdcxxCheck(env_prefix=env_prefix, status=status, reason=reason)
    needs, objects, like = _libstdcxx_users(
        root=root, env_prefix=env_prefix, candidates=candidates
    )
    system = find_system_libstdcxx(
        root=root, ldconfig_text=ldconfig_text, exclude=env_host, like=like
    )
    missing = {}  # image path of each user -> the versions `system` lacks
    for host_path, (info, versions) in needs.items():
        if system is not None and not info.compatible_with(system.info):
            continue  # another architecture: never loads the system library
        if system is None:
            lacking = set(versions) or {LIBSTDCXX_SONAME}
        else:
            lacking = versions - system.info.version_defs
        if lacking:
            image = str(image_path_of(root=root, host_path=host_path))
            missing[image] = sorted(lacking, key=version_sort_key)
    return LibstdcxxCheck(
        env_prefix=env_prefix,
        status="unsafe" if missing else "safe",
        reason=_reason(system=system, missing=missing, needs=needs),
        candidates=candidates,
        system=system,
        missing=missing,
        objects_checked=objects,
        requirers=len(needs),
    )


def format_missing(*, check, limit=20):
    """The refusal text: objects and the versions they miss."""
    missing = check.missing
    lines = [f"  {p}: needs {', '.join(missing[p])}" for p in sorted(missing)[:limit]]
    if len(missing) > limit:
        lines.append(f"  ... and {len(missing) - limit} more object(s)")
    return "\n".join(lines)


def remove_libstdcxx(*, check, root, manifest):
    """Remove the candidates of a safe check (links themselves, never their targets)."""
    if check.status != "safe":
        raise ValueError(f"refusing to remove libstdc++: check status {check.status}")
    freed = 0
    for path in check.candidates:
        kind = "symlink" if os.path.islink(path) else "file"
        size = 0 if kind == "symlink" else os.lstat(path).st_size
        os.unlink(path)
        freed += size
        manifest.entries.append(
            ManifestEntry(
                path=str(image_path_of(root=root, host_path=path)),
                action="removed",
                size=size,
                reason=check.reason,
                kind=kind,
                group="libstdcxx",
            )
        )
        logger.debug("Removed %s", path)
    return freed
