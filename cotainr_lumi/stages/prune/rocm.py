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
import shutil

from ...engine import rocmwindow
from ...engine.elfinfo import read_elf_info, scan_elf_files
from ...engine.rootfs import (
    image_path_of,
    is_inside,
    resolve_in_root,
    resolve_or_none,
    walk_in_root,
)
from ...errors import StageError
from ...processes import CommandError
from .manifest import ManifestEntry, format_bytes

logger = logging.getLogger(f"cotainr.{__name__}")

#: Where AMD's user-space graphics libraries live in ROCm images.
AMDGPU_LIB_DIR = "/opt/amdgpu/lib64"
#: Prefix of backup names (in the bundle directory, until commit/rollback).
BACKUP_PREFIX = ".cotainr-lumi-prune-backup."
#: Prefix of the package directories of the newer ROCm wheel layout.
ROCM_SDK_PREFIX = "_rocm_sdk"


def major_minor(*, version):
    """``"6.1"`` from ``"6.1.40091-a8dbc0c19"`` or ``"6.1.3-122"``."""
    found = rocmwindow.major_minor(version)
    return found and f"{found[0]}.{found[1]}"


@dataclass
class RocmDir:
    """A ROCm library directory of the base image."""

    real_image_path: str
    names: frozenset


def rocm_dirs_of(*, root, rocm_path):
    """The ROCm library directories that exist in the image."""
    found = []
    for image_path in (f"{rocm_path.rstrip('/')}/lib", AMDGPU_LIB_DIR):
        try:
            host = resolve_in_root(root=root, path=image_path)
            if not host.is_dir() or host == Path(os.path.abspath(root)):
                continue
            names = frozenset(os.listdir(host))
        except OSError:
            continue
        real = str(image_path_of(root=root, host_path=host))
        found.append(RocmDir(real_image_path=real, names=names))
    return found


@dataclass
class BundleDir:
    """A package directory that bundles ROCm libraries."""

    package: str
    package_dir: Path
    host_path: Path
    image_path: str
    overlap: list


def _site_subdirs(*, root, site_dirs):
    """``(name, path)`` of the sub-directories (not links) of each site directory."""
    seen = set()
    for site in site_dirs:
        host = resolve_or_none(root=root, path=site)
        if host is None or not host.is_dir() or host in seen:
            continue
        seen.add(host)
        try:
            with os.scandir(host) as it:
                dirs = [e for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        yield from sorted((e.name, Path(e.path)) for e in dirs)


def find_bundle_dirs(*, root, site_dirs, rocm_dirs):
    """``<package>/lib`` and auditwheel's ``<package>.libs`` holding entries ROCm also has."""
    names = frozenset().union(*(d.names for d in rocm_dirs))
    bundles = []
    for name, pkg_dir in _site_subdirs(root=root, site_dirs=site_dirs):
        if name.startswith(ROCM_SDK_PREFIX):
            continue
        lib_dir = pkg_dir if name.endswith(".libs") else pkg_dir / "lib"
        if not lib_dir.is_dir() or lib_dir.is_symlink():
            continue
        try:
            overlap = sorted(set(os.listdir(lib_dir)) & names)
        except OSError:
            continue
        if overlap:
            bundles.append(
                BundleDir(
                    package=name.removesuffix(".libs"),
                    package_dir=pkg_dir,
                    host_path=lib_dir,
                    image_path=str(image_path_of(root=root, host_path=lib_dir)),
                    overlap=overlap,
                )
            )
    return bundles


def find_rocm_sdk_packages(*, root, site_dirs):
    """``_rocm_sdk_*`` packages (the newer ROCm wheel layout)."""
    return sorted(
        {
            str(image_path_of(root=root, host_path=path))
            for name, path in _site_subdirs(root=root, site_dirs=site_dirs)
            if name.startswith(ROCM_SDK_PREFIX)
        }
    )


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


@dataclass
class DedupPlan:
    """The replacements for one bundle directory, and what is left alone."""

    actions: list = field(default_factory=list)
    left_alone: list = field(default_factory=list)


class _KeptError(Exception):
    """A bundled entry is left alone (the reason)."""


def plan_dedup(*, root, bundle, rocm_dirs):
    """The replacements for one bundle directory (like for like, same SONAME), and what is left alone."""
    plan = DedupPlan()
    for name in bundle.overlap:
        rocm = next(d for d in rocm_dirs if name in d.names)
        theirs_image = f"{rocm.real_image_path}/{name}"
        try:
            plan.actions.append(_plan_entry(root, bundle, name, theirs_image))
        except _KeptError as e:
            plan.left_alone.append((f"{bundle.image_path}/{name}", str(e)))
    return plan


def _plan_entry(root, bundle, name, theirs_image):
    """The action for one overlapping name (a _KeptError to leave it)."""
    ours = bundle.host_path / name
    ours_image = f"{bundle.image_path}/{name}"
    try:
        theirs = resolve_in_root(root=root, path=theirs_image)
    except OSError as e:  # a symlink loop
        raise _KeptError(f"{theirs_image}: {e.strerror or e}") from None
    if ours.is_symlink():
        raise _KeptError("already a link")
    if ours.is_dir():
        if not theirs.is_dir():
            raise _KeptError(f"{theirs_image} is not a directory")
        kind = "dir"
        info = None
        entries = walk_in_root(root=root, path=ours_image)
        size = sum(e.size for e in entries if e.kind == "file")
        why = f"same directory in the base image ({theirs_image})"
    elif ours.is_file():
        kind = "file"
        size = os.lstat(ours).st_size
        info = read_elf_info(path=ours)
        why = _file_verdict(info, theirs, theirs_image)
    else:
        raise _KeptError("not a regular file or directory")
    return DedupAction(
        host_path=ours,
        image_path=ours_image,
        kind=kind,
        size=size,
        target=os.path.relpath(theirs_image, start=bundle.image_path),
        rocm_image_path=theirs_image,
        reason=why,
        is_elf=info is not None,
    )


def _file_verdict(ours_info, theirs, theirs_image):
    """Why a bundled file may become a link to ROCm's `theirs` (a _KeptError if not)."""
    theirs_info = read_elf_info(path=theirs) if theirs.is_file() else None
    if ours_info is None:
        if not theirs.is_file() or theirs_info is not None:
            raise _KeptError(f"{theirs_image} is not a matching data file")
        return f"same data file name in the base image ({theirs_image})"
    if theirs_info is None:
        raise _KeptError(f"{theirs_image} is not an ELF file")
    if not ours_info.compatible_with(theirs_info):
        raise _KeptError(f"{theirs_image} is for another architecture")
    if ours_info.soname != theirs_info.soname:
        raise _KeptError(
            f"SONAME {ours_info.soname} differs from "
            f"{theirs_info.soname} of {theirs_image}"
        )
    return f"same SONAME {ours_info.soname} as {theirs_image}"


def apply_actions(*, actions):
    """Replace entries by links, renaming each original to a backup beside it."""
    done = []
    try:
        for action in actions:
            backup = action.host_path.with_name(BACKUP_PREFIX + action.host_path.name)
            if os.path.lexists(backup):
                _remove(backup)
            shutil.move(action.host_path, backup)  # a layer's dir: EXDEV, copied
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
        shutil.move(action.backup, action.host_path)
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
            failures.add((obj, detail.strip().split(" ", 1)[0]))
    return failures


def link_stays_inside(*, root, action):
    """Whether an action's link resolves to its ROCm entry inside the sandbox."""
    via_link = resolve_in_root(root=root, path=action.image_path)
    direct = resolve_in_root(root=root, path=action.rocm_image_path)
    return via_link == direct and is_inside(parent=root, path=via_link)


#: Verify at most this many objects per container invocation.
VERIFY_BATCH = 2000


def _bundle_kept_reason(bundle, *, hip, base_mm, source, rocm_path):
    """Why a package's bundled ROCm libraries are kept (None: they can go)."""
    wheel_mm = major_minor(version=hip)
    if wheel_mm is None:
        return (
            f"the ROCm version of {bundle.package} is unknown (no hip = '...' "
            f"in {bundle.package}/version.py), so its bundled ROCm libraries "
            f"in {bundle.image_path} are kept"
        )
    if base_mm is None:
        return (
            f"the base image's ROCm version is unknown (no {rocm_path}/.info/version "
            "and no rocm-version in the profile), so the ROCm libraries bundled "
            f"in {bundle.image_path} are kept"
        )
    if wheel_mm != base_mm:
        return (
            f"ROCm version mismatch: {bundle.package} was built for ROCm {hip} "
            f"({wheel_mm}) but the base image has ROCm {base_mm} ({source}); "
            f"the ROCm libraries bundled in {bundle.image_path} are kept. Install "
            f"a {bundle.package} wheel for ROCm {base_mm} or use a ROCm {wheel_mm} "
            "base image to de-duplicate them"
        )
    return None


class RocmDedup:
    """One de-duplication in the build's target env, recorded in `manifest`."""

    def __init__(self, *, context, manifest):
        self.context = context
        self.root = context.sandbox.root
        self.target = context.target_env
        self.manifest = manifest

    def _note_left_alone(self, info):
        """Report what site-packages has that is left alone: symlink loops, ROCm wheels."""
        for site in self.target.site:
            if resolve_or_none(root=self.root, path=site) is None:
                self.manifest.skip_or_fail(
                    "rocm-dedup",
                    site,
                    f"{site} is a symlink loop (too many levels of symbolic "
                    "links), so nothing in it is de-duplicated",
                )
        sdk = find_rocm_sdk_packages(root=self.root, site_dirs=self.target.site)
        if not sdk:
            return
        info["rocm-sdk-packages"] = sdk
        reason = (
            "newer ROCm wheel layout: the ROCm libraries come as separate "
            f"_rocm_sdk_* packages ({', '.join(sdk)}), loaded by the rocm_sdk "
            "package rather than from torch/lib; they are left in place (not "
            "de-duplicated), so torch uses the wheel's ROCm, not the base image's"
        )
        self.manifest.warn("rocm-dedup", ", ".join(sdk), reason)
        logger.warning("Prune: %s.", reason)

    def _base_rocm(self, rocm_path):
        """The base image's ROCm major.minor (or None) and where it comes from."""
        base_text = rocmwindow.base_rocm_version(root=self.root, rocm_path=rocm_path)
        base_mm = major_minor(version=base_text)
        profile = self.context.build.rocm_version
        if base_mm is None and profile:
            return profile, "the profile's rocm-version"
        if base_mm and profile and base_mm != profile:
            logger.warning(
                "Prune: the profile says ROCm %s but the base image has %s; using the image's.",
                profile,
                base_text,
            )
        return base_mm, f"{rocm_path}/.info/version ({base_text})"

    def run(self):
        """De-duplicate what is safe; record it in the manifest."""
        rocm_path = self.target.image.rocm_path or "/opt/rocm"
        rocm_dirs = rocm_dirs_of(root=self.root, rocm_path=rocm_path)
        info = self.manifest.facts["rocm-dedup"] = {
            "rocm-path": rocm_path,
            "rocm-dirs": [d.real_image_path for d in rocm_dirs],
        }
        self._note_left_alone(info)
        if not rocm_dirs:
            logger.info(
                "Prune: ROCm: the base image has no %s/lib or %s",
                rocm_path,
                AMDGPU_LIB_DIR,
            )
            self.manifest.skip(
                "rocm-dedup", rocm_path, "no ROCm library directory in the base image"
            )
            return
        base_mm, source = self._base_rocm(rocm_path)
        info["base-rocm"] = {"major-minor": base_mm, "source": source}
        bundles = find_bundle_dirs(
            root=self.root, site_dirs=self.target.site, rocm_dirs=rocm_dirs
        )
        if not bundles:
            logger.info(
                "Prune: ROCm: no installed package bundles libraries the base image has"
            )
            return
        applied = []
        packages = info["packages"] = {}
        for bundle in bundles:
            package = image_path_of(root=self.root, host_path=bundle.package_dir)
            fields = rocmwindow.version_py_fields(
                root=self.root, path=f"{package}/version.py"
            )
            hip = (fields or {}).get("hip")
            packages[bundle.package] = {"hip": hip, "dir": bundle.image_path}
            reason = _bundle_kept_reason(
                bundle, hip=hip, base_mm=base_mm, source=source, rocm_path=rocm_path
            )
            if reason:
                what = (
                    f"{bundle.image_path} ({len(bundle.overlap)} entries also in ROCm)"
                )
                self.manifest.skip_or_fail("rocm-dedup", what, reason)
                continue
            plan = plan_dedup(root=self.root, bundle=bundle, rocm_dirs=rocm_dirs)
            for image_path, why in plan.left_alone:
                self.manifest.skip("rocm-dedup", image_path, why)
            if plan.actions:
                apply_actions(actions=plan.actions)
                applied.append((bundle, plan.actions))
        if applied:
            self._verify_and_finish(applied)

    def _verify(self, applied):
        """Run the loader check in the container; return the unresolved pairs."""
        objects = []
        for bundle, actions in applied:
            objects += elf_objects_below(root=self.root, bundle=bundle, actions=actions)
        failures = set()
        for start in range(0, len(objects), VERIFY_BATCH):
            batch = objects[start : start + VERIFY_BATCH]
            proc = self.context.sandbox.run(
                ["bash", "-c", VERIFY_SCRIPT, "prune-verify", *batch]
            )
            failures |= parse_verify_output(text=proc.stdout)
        return failures, len(objects)

    def _check_links(self, applied, all_actions):
        """The loader check of the links (rolled back when it cannot run)."""
        try:
            escaped = [
                a.image_path
                for a in all_actions
                if not link_stays_inside(root=self.root, action=a)
            ]
            if escaped:
                raise ValueError(
                    f"links do not resolve to their ROCm entries: {', '.join(escaped)}"
                )
            return self._verify(applied)
        except (CommandError, ValueError, RuntimeError) as e:
            rollback(actions=all_actions)
            details = e.error_lines() if isinstance(e, CommandError) else None
            raise StageError(
                f"checking the de-duplicated ROCm libraries failed ({e}); the "
                "bundled libraries were restored. Use --set prune.rocm-dedup=false to skip this step.",
                stage="prune",
                details=details,
            ) from e

    def _verify_and_finish(self, applied):
        """Check the links resolve; commit and record them, or roll back and skip/fail."""
        all_actions = [a for _bundle, actions in applied for a in actions]
        failures, checked = self._check_links(applied, all_actions)
        if failures:
            rollback(actions=all_actions)
            before, _ = self._verify(applied)
            new = sorted(failures - before)
            if new:
                listing = "\n".join(
                    f"  {obj}: {lib} not found" for obj, lib in new[:20]
                )
                reason = (
                    "after replacing bundled ROCm libraries by links into the base "
                    "image's ROCm, the image's loader could not resolve:\n"
                    f"{listing}\nthe bundled libraries were restored"
                )
                what = ", ".join(b.image_path for b, _a in applied)
                self.manifest.skip_or_fail("rocm-dedup", what, reason)
                return
            logger.warning(
                "Prune: %d unresolved library reference(s) exist with or without "
                "de-duplication (not caused by it), e.g. %s",
                len(before),
                ": ".join(sorted(before)[0]),
            )
            apply_actions(actions=all_actions)
        commit(actions=all_actions)
        self.manifest.entries += [
            ManifestEntry(
                path=a.image_path,
                action="symlinked",
                size=a.size,
                reason=a.reason,
                kind=a.kind,
                target=a.target,
                group="rocm-dedup",
            )
            for a in all_actions
        ]
        logger.info(
            "Prune: replaced %d bundled ROCm entr%s by links into the base image's ROCm "
            "(%s saved); %d ELF object(s) checked with the image's loader",
            len(all_actions),
            "y" if len(all_actions) == 1 else "ies",
            format_bytes(size=sum(a.size for a in all_actions)),
            checked,
        )
