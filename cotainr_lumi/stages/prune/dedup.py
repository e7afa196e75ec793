"""The prune stage's ROCm de-duplication: bundled ROCm libraries become links into the base image's."""

from __future__ import annotations

import logging

from ... import _cotainr
from ...errors import StageError
from .manifest import ManifestEntry, format_bytes
from .rocm import (
    AMDGPU_LIB_DIR,
    VERIFY_SCRIPT,
    apply_actions,
    base_rocm_version,
    commit,
    elf_objects_below,
    find_bundle_dirs,
    find_rocm_sdk_packages,
    hip_version_of_package,
    link_stays_inside,
    looping_paths,
    major_minor,
    parse_verify_output,
    plan_dedup,
    rocm_dirs_of,
    rollback,
)

logger = logging.getLogger(f"cotainr.{__name__}")

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
    """
    One de-duplication in the build's target env.

    `skip_or_fail(group=, what=, reason=)` records a skipped step (a warning,
    or the stage's error when it is strict).
    """

    def __init__(self, *, context, target, manifest, warnings, skip_or_fail):
        self.context, self.root = context, context.sandbox.root
        self.target, self.manifest, self.warnings = target, manifest, warnings
        self.skip_or_fail = skip_or_fail

    def _site_dirs(self, root, target):
        """The env's site-packages directories, without symlink loops."""
        site_dirs = list(target.site)
        for site in looping_paths(root=root, paths=site_dirs):
            site_dirs.remove(site)
            self.skip_or_fail(
                group="rocm-dedup",
                what=site,
                reason=f"{site} is a symlink loop (too many levels of symbolic "
                "links), so nothing in it is de-duplicated",
            )
        return site_dirs

    def _note_rocm_sdk(self, root, site_dirs, info):
        """Say so when ROCm comes as separate wheels (left in place)."""
        sdk = find_rocm_sdk_packages(root=root, site_dirs=site_dirs)
        if not sdk:
            return
        info["rocm-sdk-packages"] = sdk
        reason = (
            "newer ROCm wheel layout: the ROCm libraries come as separate "
            f"_rocm_sdk_* packages ({', '.join(sdk)}), loaded by the rocm_sdk "
            "package rather than from torch/lib; they are left in place (not "
            "de-duplicated), so torch uses the wheel's ROCm, not the base image's"
        )
        self.manifest.skip(group="rocm-dedup", what=", ".join(sdk), reason=reason)
        self.warnings.append(reason)
        logger.warning("Prune: %s.", reason)

    def _base_rocm(self, rocm_path):
        """The base image's ROCm major.minor (or None) and where it comes from."""
        base_text = base_rocm_version(root=self.root, rocm_path=rocm_path)
        base_mm = major_minor(version=base_text)
        system = self.context.plan.system
        profile = system.rocm_version if system is not None else None
        source = f"{rocm_path}/.info/version ({base_text})"
        if base_mm is None and profile:
            return profile, "the profile's rocm-version"
        if base_mm and profile and base_mm != profile:
            logger.warning(
                "Prune: the profile says ROCm %s but the base image has %s; using the image's.",
                profile,
                base_text,
            )
        return base_mm, source

    def run(self):
        """De-duplicate what is safe; record it in the manifest."""
        root, target, manifest = self.root, self.target, self.manifest
        rocm_path = target.image.rocm_path or "/opt/rocm"
        site_dirs = self._site_dirs(root, target)
        rocm_dirs = rocm_dirs_of(root=root, rocm_path=rocm_path)
        info = {
            "rocm-path": rocm_path,
            "rocm-dirs": [d.real_image_path for d in rocm_dirs],
        }
        manifest.facts["rocm-dedup"] = info
        self._note_rocm_sdk(root, site_dirs, info)
        if not rocm_dirs:
            logger.info(
                "Prune: ROCm: the base image has no %s/lib or %s",
                rocm_path,
                AMDGPU_LIB_DIR,
            )
            manifest.skip(
                group="rocm-dedup",
                what=rocm_path,
                reason="no ROCm library directory in the base image",
            )
            return
        base_mm, source = self._base_rocm(rocm_path)
        info["base-rocm"] = {"major-minor": base_mm, "source": source}
        bundles = find_bundle_dirs(root=root, site_dirs=site_dirs, rocm_dirs=rocm_dirs)
        if not bundles:
            logger.info(
                "Prune: ROCm: no installed package bundles libraries the base image has"
            )
            return
        applied = []
        for bundle in bundles:
            hip = hip_version_of_package(version_file=bundle.package_dir / "version.py")
            info.setdefault("packages", {})[bundle.package] = {
                "hip": hip,
                "dir": bundle.image_path,
            }
            reason = _bundle_kept_reason(
                bundle, hip=hip, base_mm=base_mm, source=source, rocm_path=rocm_path
            )
            if reason:
                what = (
                    f"{bundle.image_path} ({len(bundle.overlap)} entries also in ROCm)"
                )
                self.skip_or_fail(group="rocm-dedup", what=what, reason=reason)
                continue
            plan = plan_dedup(root=root, bundle=bundle, rocm_dirs=rocm_dirs)
            for image_path, why in plan.left_alone:
                manifest.skip(group="rocm-dedup", what=image_path, reason=why)
            if plan.actions:
                apply_actions(actions=plan.actions)
                applied.append((bundle, plan.actions))
        if applied:
            self._verify_and_finish(applied)

    def _verify(self, applied):
        """Run the loader check in the container; return the unresolved pairs."""
        root = self.root
        objects = []
        for bundle, actions in applied:
            objects += elf_objects_below(root=root, bundle=bundle, actions=actions)
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
        root = self.root
        try:
            escaped = [
                a.image_path
                for a in all_actions
                if not link_stays_inside(root=root, action=a)
            ]
            if escaped:
                raise ValueError(
                    f"links do not resolve to their ROCm entries: {', '.join(escaped)}"
                )
            return self._verify(applied)
        except (_cotainr.CommandError, ValueError, RuntimeError) as e:
            rollback(actions=all_actions)
            details = e.error_lines() if isinstance(e, _cotainr.CommandError) else None
            raise StageError(
                f"checking the de-duplicated ROCm libraries failed ({e}); the "
                "bundled libraries were restored. Use --set prune.rocm-dedup=false to skip this step.",
                stage="prune",
                details=details,
            ) from e

    def _record_links(self, all_actions, checked):
        """Keep the links and record them in the manifest."""
        commit(actions=all_actions)
        for action in all_actions:
            self.manifest.add(
                ManifestEntry(
                    path=action.image_path,
                    action="symlinked",
                    size=action.size,
                    reason=action.reason,
                    kind=action.kind,
                    target=action.target,
                    group="rocm-dedup",
                )
            )
        saved = sum(a.size for a in all_actions)
        logger.info(
            "Prune: replaced %d bundled ROCm entr%s by links into the base image's ROCm "
            "(%s saved); %d ELF object(s) checked with the image's loader",
            len(all_actions),
            "y" if len(all_actions) == 1 else "ies",
            format_bytes(size=saved),
            checked,
        )

    def _verify_and_finish(self, applied):
        """Check the links resolve; commit, or roll back and skip/fail."""
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
                self.skip_or_fail(
                    group="rocm-dedup",
                    what=", ".join(b.image_path for b, _a in applied),
                    reason=reason,
                )
                return
            logger.warning(
                "Prune: %d unresolved library reference(s) exist with or without "
                "de-duplication (not caused by it), e.g. %s",
                len(before),
                ": ".join(sorted(before)[0]),
            )
            apply_actions(actions=all_actions)
        self._record_links(all_actions, checked)
