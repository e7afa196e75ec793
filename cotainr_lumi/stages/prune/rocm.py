"""
De-duplicate the ROCm libraries packages bundle (``torch/lib``).

Bundled entries become relative links into the base image's
``$ROCM_PATH/lib`` or ``/opt/amdgpu/lib64``; originals are renamed to backups
beside them, deleted on :func:`commit` and restored by :func:`rollback`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
import os
from pathlib import Path
import re
import shutil
import stat

from ...engine.elfinfo import read_elf_info, scan_elf_files
from ...engine.rootfs import (
    SymlinkLoopError,
    image_path_of,
    is_inside,
    resolve_in_root,
)

logger = logging.getLogger(f"cotainr.{__name__}")

#: Where AMD's user-space graphics libraries live in ROCm images.
AMDGPU_LIB_DIR = "/opt/amdgpu/lib64"
#: Prefix of backup names (in the bundle directory, until commit/rollback).
BACKUP_PREFIX = ".cotainr-lumi-prune-backup."
#: Prefix of the package directories of the newer ROCm wheel layout.
ROCM_SDK_PREFIX = "_rocm_sdk"

_MAJOR_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")
_HIP = re.compile(r"^hip\s*(?::[^=\n]*)?=\s*['\"]([^'\"\n]*)['\"]", re.M)


def major_minor(*, version):
    """``"6.1"`` from ``"6.1.40091-a8dbc0c19"`` or ``"6.1.3-122"``."""
    if not version:
        return None
    match = _MAJOR_MINOR.match(str(version))
    return f"{int(match[1])}.{int(match[2])}" if match else None


def base_rocm_version(*, root, rocm_path):
    """The base image's ROCm version from ``$ROCM_PATH/.info/version``."""
    try:
        host = resolve_in_root(root=root, path=f"{rocm_path}/.info/version")
        if not host.is_file() or host.is_symlink():
            return None
        with open(host, encoding="utf-8", errors="replace") as f:
            return f.readline(200).strip() or None
    except OSError:
        return None


def hip_version_of_package(*, version_file):
    """``hip`` from a package's ``version.py`` (``hip: str = '6.1...'`` too), never imported."""
    try:
        fd = os.open(version_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            text = f.read(1024 * 1024).decode("utf-8", "replace")
    except OSError:
        return None
    match = _HIP.search(text)
    return match[1] if match else None


@dataclass
class RocmDir:
    """A ROCm library directory of the base image."""

    image_path: str
    host_path: Path
    real_image_path: str
    names: frozenset


def rocm_dirs_of(*, root, rocm_path):
    """The ROCm library directories that exist in the image."""
    found = []
    for image_path in (f"{rocm_path.rstrip('/')}/lib", AMDGPU_LIB_DIR):
        try:
            host = resolve_in_root(root=root, path=image_path)
        except OSError:
            continue
        if not host.is_dir() or host == Path(os.path.abspath(root)):
            continue
        try:
            names = frozenset(os.listdir(host))
        except OSError:
            continue
        found.append(
            RocmDir(
                image_path=image_path,
                host_path=host,
                real_image_path=str(image_path_of(root=root, host_path=host)),
                names=names,
            )
        )
    return found


@dataclass
class BundleDir:
    """A package directory that bundles ROCm libraries."""

    package: str
    package_dir: Path
    host_path: Path
    image_path: str
    overlap: list


def _resolve_or_none(*, root, path):
    """:func:`resolve_in_root`, or None for a symlink loop."""
    try:
        return resolve_in_root(root=root, path=path)
    except SymlinkLoopError:
        return None


def looping_paths(*, root, paths):
    """The image paths among `paths` that are symlink loops."""
    return [p for p in paths if _resolve_or_none(root=root, path=p) is None]


def _real_subdirs(directory):
    """Sub-directories of `directory` that are not symlinks, by name."""
    try:
        with os.scandir(directory) as it:
            return sorted(
                (e.name, Path(e.path)) for e in it if e.is_dir(follow_symlinks=False)
            )
    except OSError:
        return []


def find_bundle_dirs(*, root, site_dirs, rocm_dirs):
    """``<package>/lib`` and auditwheel's ``<package>.libs`` holding entries ROCm also has."""
    names = frozenset().union(*(d.names for d in rocm_dirs))
    bundles = []
    seen = set()
    for site in site_dirs:
        site_host = _resolve_or_none(root=root, path=site)
        if site_host is None or not site_host.is_dir() or str(site_host) in seen:
            continue
        seen.add(str(site_host))
        for name, pkg_dir in _real_subdirs(site_host):
            if name.startswith(ROCM_SDK_PREFIX):
                continue
            package, lib_dir = (
                (name[: -len(".libs")], pkg_dir)
                if name.endswith(".libs")
                else (name, pkg_dir / "lib")
            )
            if not lib_dir.is_dir() or lib_dir.is_symlink():
                continue
            try:
                overlap = sorted(set(os.listdir(lib_dir)) & names)
            except OSError:
                continue
            if overlap:
                bundles.append(
                    BundleDir(
                        package=package,
                        package_dir=pkg_dir,
                        host_path=lib_dir,
                        image_path=str(image_path_of(root=root, host_path=lib_dir)),
                        overlap=overlap,
                    )
                )
    return bundles


def find_rocm_sdk_packages(*, root, site_dirs):
    """``_rocm_sdk_*`` packages (the newer ROCm wheel layout)."""
    found = []
    for site in site_dirs:
        site_host = _resolve_or_none(root=root, path=site)
        if site_host is None:
            continue
        for name, path in _real_subdirs(site_host):
            if name.startswith(ROCM_SDK_PREFIX):
                found.append(str(image_path_of(root=root, host_path=path)))
    return sorted(set(found))


@dataclass
class DedupAction:
    """One planned replacement of a bundled entry by a link into ROCm."""

    host_path: Path
    image_path: str
    kind: str
    size: int
    target: str
    rocm_image_path: str
    reason: str
    backup: Path | None = None
    is_elf: bool = False


def _tree_size(host_path):
    """The sum of the sizes of the regular files below a directory (no links followed)."""
    total = 0
    for top, _dirs, files in os.walk(host_path):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


@dataclass
class DedupPlan:
    """The replacements for one bundle directory, and what is left alone."""

    actions: list = field(default_factory=list)
    left_alone: list = field(default_factory=list)


def plan_dedup(*, root, bundle, rocm_dirs):
    """The replacements for one bundle directory (like for like, same SONAME), and what is left alone."""
    plan = DedupPlan()
    for name in bundle.overlap:
        found = _plan_entry(root=root, bundle=bundle, name=name, rocm_dirs=rocm_dirs)
        if isinstance(found, DedupAction):
            plan.actions.append(found)
        else:
            plan.left_alone.append(found)
    return plan


def _plan_entry(*, root, bundle, name, rocm_dirs):
    """The action for one overlapping name, or ``(image path, why)`` to leave it."""
    ours = bundle.host_path / name
    ours_image = f"{bundle.image_path}/{name}"
    rocm = next(d for d in rocm_dirs if name in d.names)
    theirs_image = f"{rocm.real_image_path}/{name}"
    try:
        theirs = resolve_in_root(root=root, path=theirs_image)
    except OSError as e:  # a symlink loop
        return ours_image, f"{theirs_image}: {e.strerror or e}"
    if ours.is_symlink():
        return ours_image, "already a link"
    action = {
        "host_path": ours,
        "image_path": ours_image,
        "target": os.path.relpath(theirs_image, start=bundle.image_path),
        "rocm_image_path": theirs_image,
    }
    if ours.is_dir():
        if not theirs.is_dir():
            return ours_image, f"{theirs_image} is not a directory"
        return DedupAction(
            **action,
            kind="dir",
            size=_tree_size(ours),
            reason=f"same directory in the base image ({theirs_image})",
        )
    if not ours.is_file():
        return ours_image, "not a regular file or directory"
    size = os.lstat(ours).st_size
    ours_info = read_elf_info(path=ours)
    ok, why = _file_verdict(
        ours_info=ours_info, theirs=theirs, theirs_image=theirs_image
    )
    if not ok:
        return ours_image, why
    return DedupAction(
        **action, kind="file", size=size, reason=why, is_elf=ours_info is not None
    )


def _file_verdict(*, ours_info, theirs, theirs_image):
    """Whether a bundled file may become a link to ROCm's `theirs`."""
    theirs_info = read_elf_info(path=theirs) if theirs.is_file() else None
    if ours_info is None:
        if not theirs.is_file() or theirs_info is not None:
            return False, f"{theirs_image} is not a matching data file"
        return True, f"same data file name in the base image ({theirs_image})"
    if theirs_info is None:
        return False, f"{theirs_image} is not an ELF file"
    if not ours_info.compatible_with(theirs_info):
        return False, f"{theirs_image} is for another architecture"
    if ours_info.soname != theirs_info.soname:
        return False, (
            f"SONAME {ours_info.soname} differs from "
            f"{theirs_info.soname} of {theirs_image}"
        )
    return True, f"same SONAME {ours_info.soname} as {theirs_image}"


def apply_actions(*, actions):
    """Replace entries by links, renaming each original to a backup beside it."""
    done = []
    try:
        for action in actions:
            backup = action.host_path.with_name(BACKUP_PREFIX + action.host_path.name)
            if os.path.lexists(backup):
                _remove(backup)
            os.rename(action.host_path, backup)
            action.backup = backup
            done.append(action)
            os.symlink(action.target, action.host_path)
    except OSError:
        rollback(actions=done)
        raise


def commit(*, actions):
    """Delete the backups of applied actions."""
    for action in actions:
        if action.backup is not None:
            _remove(action.backup)
            action.backup = None


def rollback(*, actions):
    """Restore the originals of applied actions."""
    for action in reversed(actions):
        if action.backup is None:
            continue
        if os.path.islink(action.host_path):
            os.unlink(action.host_path)
        os.rename(action.backup, action.host_path)
        action.backup = None


def _remove(path):
    """Remove a file, link or directory tree (links are never followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def elf_objects_below(*, root, bundle, actions):
    """Image paths of the ELF objects to check after de-duplication."""
    package_image = str(image_path_of(root=root, host_path=bundle.package_dir))
    paths = {
        str(image_path_of(root=root, host_path=info.path))
        for info in scan_elf_files(root=root, path=package_image)
        if f"/{BACKUP_PREFIX}" not in info.path
    }
    paths.update(a.image_path for a in actions if a.kind == "file" and a.is_elf)
    return sorted(paths)


#: The bash script that lists unresolved libraries with the image's loader.
VERIFY_SCRIPT = r"""
if command -v ldd >/dev/null 2>&1; then list() { ldd "$1"; }
else
    loader=""
    for l in /lib64/ld-linux-x86-64.so.2 /lib/ld-linux-aarch64.so.1; do
        if [ -x "$l" ]; then loader="$l"; break; fi
    done
    if [ -z "$loader" ]; then echo "COTAINR_LUMI_NO_LOADER"; exit 3; fi
    list() { "$loader" --list "$1"; }
fi
for f in "$@"; do
    out="$(list "$f" 2>&1)" || true
    while IFS= read -r line; do
        case "$line" in
        *"not found"*) printf 'COTAINR_LUMI_NOTFOUND\t%s\t%s\n' "$f" "$line" ;;
        esac
    done <<<"$out"
done
echo COTAINR_LUMI_VERIFY_DONE
"""


def parse_verify_output(*, text):
    """Parse the output of :data:`VERIFY_SCRIPT`."""
    if "COTAINR_LUMI_VERIFY_DONE" not in text:
        raise RuntimeError("the library check in the container did not complete")
    failures = set()
    for line in text.splitlines():
        if line.startswith("COTAINR_LUMI_NOTFOUND\t"):
            _tag, obj, detail = line.split("\t", 2)
            missing = detail.strip().split(" ", 1)[0]
            failures.add((obj, missing))
    return failures


def link_stays_inside(*, root, action):
    """Whether an action's link resolves to its ROCm entry inside the sandbox."""
    via_link = resolve_in_root(root=root, path=action.image_path)
    direct = resolve_in_root(root=root, path=action.rocm_image_path)
    return via_link == direct and is_inside(parent=root, path=via_link)
