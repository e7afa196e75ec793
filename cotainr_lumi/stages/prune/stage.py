"""
The prune stage: remove what the base image provides, when provably safe.

Two prunings, each switchable per profile and per build:

``libstdcxx`` (``--set prune.libstdcxx=false`` turns it off)
    Remove the environment's ``lib/libstdc++.so*`` when the base image's
    ``libstdc++.so.6`` defines every symbol version any ELF object of the
    environment needs from it; otherwise stop the build with the list
    (see :mod:`cotainr_lumi.stages.prune.libstdcxx`).
``rocm-dedup`` (``--set prune.rocm-dedup=false`` turns it off)
    Replace the ROCm libraries that torch (or another package) bundles in its
    ``lib`` directory by relative links into the base image's ROCm, when the
    package's ROCm major.minor matches the base image's and the SONAMEs
    match; then check with the image's loader that everything resolves, and
    roll back otherwise (see :mod:`cotainr_lumi.stages.prune.rocm`).
``strict`` (``--set prune.strict=true``)
    Fail instead of warning when a pruning is skipped (ROCm version
    mismatch or unknown, unresolved libraries, unsupported layout).

Everything is recorded in ``/opt/cotainr-lumi/prune-manifest.json`` in the
image, which the label ``cotainr-lumi.prune.manifest`` points at.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging

from ... import _cotainr
from ...engine.settings import StageSettings, setting
from ...engine.stage import Stage, StageReport, register_stage
from ...errors import StageError
from .libstdcxx import (
    LIBSTDCXX_GLOB,
    check_libstdcxx,
    format_missing,
    remove_libstdcxx,
)
from .manifest import (
    MANIFEST_LABEL,
    MANIFEST_PATH,
    ManifestEntry,
    PruneManifest,
    format_bytes,
)
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


@dataclass(frozen=True)
class PruneSettings(StageSettings):
    """The settings of the prune stage."""

    libstdcxx: bool = setting(
        True, doc="remove the env's libstdc++ when the base image's is new enough"
    )
    rocm_dedup: bool = setting(
        True, doc="link bundled copies of the base image's ROCm libraries into it"
    )
    strict: bool = setting(
        False, doc="fail instead of warning when a pruning is skipped"
    )


@register_stage
class PruneStage(Stage):
    """Remove the env's libstdc++ and de-duplicate bundled ROCm libraries, when safe."""

    name = "prune"
    settings_class = PruneSettings

    def enabled(self, *, plan):
        """Run when at least one pruning is on."""
        return bool(self.settings.libstdcxx or self.settings.rocm_dedup)

    def describe(self, *, plan):
        """Describe the checks and actions (the sandbox does not exist yet)."""
        lines = [
            f"environment: {plan.target_environment} (torch/lib in its site-packages; "
            "libstdc++ in <env>/lib)"
        ]
        if self.settings.libstdcxx:
            lines.append(
                f"libstdc++: remove <env>/lib/{LIBSTDCXX_GLOB} only if the base image's "
                "libstdc++.so.6 (found through the image's ld.so.cache, then /usr/lib64, "
                "/usr/lib/x86_64-linux-gnu, ...) defines every GLIBCXX_*/CXXABI_* version "
                "that any ELF object of the env needs; otherwise the build stops with "
                "the list (keep it with --set prune.libstdcxx=false)"
            )
        else:
            lines.append("libstdc++: kept (libstdcxx: false)")
        if self.settings.rocm_dedup:
            rocm = plan.system.rocm_version if plan.system is not None else None
            base = (
                f"the base image's ROCm ($ROCM_PATH/.info/version; profile says {rocm})"
                if rocm
                else "the base image's ROCm ($ROCM_PATH/.info/version)"
            )
            lines.append(
                "ROCm: in <site-packages>/torch/lib (and other packages' lib/ or .libs/), "
                f"replace entries also in $ROCM_PATH/lib or {AMDGPU_LIB_DIR} by relative "
                "links into them, only if torch.version.hip (read from torch/version.py) "
                f"has the major.minor of {base} and SONAMEs match; then every ELF object "
                "there must resolve with the image's loader (ldd), else roll back"
            )
            action = "fail" if self.settings.strict else "skip with a warning"
            lines.append(
                f"ROCm version mismatch or unknown: {action} (strict: {str(self.settings.strict).lower()})"
            )
        else:
            lines.append("ROCm: bundled libraries kept (rocm-dedup: false)")
        lines.append(f"manifest: {MANIFEST_PATH} (label {MANIFEST_LABEL})")
        return lines

    # -- run ---------------------------------------------------------------

    def run(self, *, context):
        """Prune what is safe in the build's target env and write the manifest."""
        # The build's one probe of the image: its env, ROCM_PATH and the
        # loader cache's libstdc++ entries.
        target = context.target_env
        manifest = PruneManifest(
            settings=self.settings.to_dict(),
            facts={
                "env-prefix": target.prefix if target is not None else None,
                "env-source": target.reason if target is not None else None,
                "site-packages": list(target.site) if target is not None else [],
            },
        )
        warnings = []
        if target is None:
            self._skip_or_fail(
                manifest,
                warnings,
                group="all",
                what="environment",
                reason=(
                    "the image has no Python environment (no $WITH_CONDA, venv or "
                    "conda env): there is no environment to prune"
                ),
            )
        else:
            self._prune(context, target, manifest, warnings)
        manifest.write(root=context.sandbox.root)
        summary = manifest.summary()
        logger.info("Prune summary: %s; manifest %s", summary, MANIFEST_PATH)
        details = manifest.to_dict()
        details["warnings"] = warnings
        return StageReport(
            name=self.name,
            summary=summary,
            details=details,
            labels={
                MANIFEST_LABEL: MANIFEST_PATH,
                "cotainr-lumi.prune.bytes-saved": str(manifest.bytes_saved),
            },
        )

    def _prune(self, context, target, manifest, warnings):
        """The prunings the settings ask for, in the target env."""
        if self.settings.libstdcxx:
            ldconfig_text = "\n".join(target.image.libstdcxx_cache)
            for env_prefix in target.env_prefixes:
                self._prune_libstdcxx(
                    context.sandbox.root, env_prefix, ldconfig_text, manifest, warnings
                )
        else:
            manifest.skip(
                group="libstdcxx",
                what=f"{target.prefix}/lib/{LIBSTDCXX_GLOB}",
                reason="kept on request (libstdcxx: false)",
            )
        if self.settings.rocm_dedup:
            self._dedup_rocm(context, target, manifest, warnings)
        else:
            manifest.skip(
                group="rocm-dedup",
                what="bundled ROCm libraries",
                reason="kept on request (rocm-dedup: false)",
            )

    def _skip_or_fail(self, manifest, warnings, *, group, what, reason):
        """Record a skipped pruning: a warning, or a failure in strict mode."""
        if self.settings.strict:
            raise StageError(
                f"{reason}. This build is strict (prune.strict: true); with "
                "--set prune.strict=false it skips this pruning with a warning.",
                stage=self.name,
            )
        manifest.skip(group=group, what=what, reason=reason)
        warnings.append(reason)
        logger.warning("Prune: %s; not pruned.", reason)

    def _prune_libstdcxx(self, root, prefix, ldconfig_text, manifest, warnings):
        """The libstdc++ pruning."""
        check = check_libstdcxx(
            root=root, env_prefix=prefix, ldconfig_text=ldconfig_text
        )
        if check.status == "absent" and "libstdcxx" in manifest.facts:
            # Another prefix of the env (a venv's base) already reported.
            manifest.skip(group="libstdcxx", what=f"{prefix}/lib", reason=check.reason)
            return
        manifest.facts["libstdcxx"] = {
            "status": check.status,
            "reason": check.reason,
            "system-library": check.system.image_path if check.system else None,
            "objects-checked": check.objects_checked,
            "objects-using-libstdcxx": check.requirers,
        }
        if check.status == "absent":
            logger.info("Prune: libstdc++: nothing to do (%s)", check.reason)
            manifest.skip(group="libstdcxx", what=f"{prefix}/lib", reason=check.reason)
            return
        if check.status == "unsupported":
            self._skip_or_fail(
                manifest,
                warnings,
                group="libstdcxx",
                what=f"{prefix}/lib",
                reason=check.reason,
            )
            return
        if check.status == "unsafe":
            system = check.system.image_path if check.system else "libstdc++.so.6"
            raise StageError(
                f"removing the environment's libstdc++ ({prefix}/lib/{LIBSTDCXX_GLOB}) "
                f"is not safe: {check.reason}:\n{format_missing(check=check)}\n"
                "Ways out: keep the environment's libstdc++ (--set prune.libstdcxx=false, "
                "--set prune.libstdcxx=false, or `libstdcxx: false` under "
                "settings: prune: in the system profile), or use a base image whose "
                f"{system} is newer (--base-image IMAGE --lumi-system NAME).",
                stage=self.name,
            )
        freed = remove_libstdcxx(check=check, root=root, manifest=manifest)
        logger.info(
            "Prune: removed %d libstdc++ file(s) from %s/lib (%s): %s",
            len(check.candidates),
            prefix,
            format_bytes(size=freed),
            check.reason,
        )

    def _site_dirs(self, root, target, manifest, warnings):
        """The env's site-packages directories, without symlink loops."""
        site_dirs = list(target.site)
        for site in looping_paths(root=root, paths=site_dirs):
            site_dirs.remove(site)
            self._skip_or_fail(
                manifest,
                warnings,
                group="rocm-dedup",
                what=site,
                reason=f"{site} is a symlink loop (too many levels of symbolic "
                "links), so nothing in it is de-duplicated",
            )
        return site_dirs

    @staticmethod
    def _note_rocm_sdk(root, site_dirs, info, manifest, warnings):
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
        manifest.skip(group="rocm-dedup", what=", ".join(sdk), reason=reason)
        warnings.append(reason)
        logger.warning("Prune: %s.", reason)

    @staticmethod
    def _base_rocm(context, rocm_path):
        """The base image's ROCm major.minor (or None) and where it comes from."""
        base_text = base_rocm_version(root=context.sandbox.root, rocm_path=rocm_path)
        base_mm = major_minor(version=base_text)
        system = context.plan.system
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

    def _dedup_rocm(self, context, target, manifest, warnings):
        """The ROCm de-duplication."""
        root = context.sandbox.root
        rocm_path = target.image.rocm_path or "/opt/rocm"
        site_dirs = self._site_dirs(root, target, manifest, warnings)
        rocm_dirs = rocm_dirs_of(root=root, rocm_path=rocm_path)
        info = {
            "rocm-path": rocm_path,
            "rocm-dirs": [d.real_image_path for d in rocm_dirs],
        }
        manifest.facts["rocm-dedup"] = info
        self._note_rocm_sdk(root, site_dirs, info, manifest, warnings)
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
        base_mm, source = self._base_rocm(context, rocm_path)
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
                self._skip_or_fail(
                    manifest, warnings, group="rocm-dedup", what=what, reason=reason
                )
                continue
            plan = plan_dedup(root=root, bundle=bundle, rocm_dirs=rocm_dirs)
            for image_path, why in plan.left_alone:
                manifest.skip(group="rocm-dedup", what=image_path, reason=why)
            if plan.actions:
                apply_actions(actions=plan.actions)
                applied.append((bundle, plan.actions))
        if applied:
            self._verify_and_finish(context, applied, manifest, warnings)

    def _verify(self, context, applied):
        """Run the loader check in the container; return the unresolved pairs."""
        root = context.sandbox.root
        objects = []
        for bundle, actions in applied:
            objects += elf_objects_below(root=root, bundle=bundle, actions=actions)
        failures = set()
        for start in range(0, len(objects), VERIFY_BATCH):
            batch = objects[start : start + VERIFY_BATCH]
            proc = context.sandbox.run(
                ["bash", "-c", VERIFY_SCRIPT, "prune-verify", *batch]
            )
            failures |= parse_verify_output(text=proc.stdout)
        return failures, len(objects)

    def _check_links(self, context, applied, all_actions):
        """The loader check of the links (rolled back when it cannot run)."""
        root = context.sandbox.root
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
            return self._verify(context, applied)
        except (_cotainr.CommandError, ValueError, RuntimeError) as e:
            rollback(actions=all_actions)
            details = e.error_lines() if isinstance(e, _cotainr.CommandError) else None
            raise StageError(
                f"checking the de-duplicated ROCm libraries failed ({e}); the "
                "bundled libraries were restored. Use --set prune.rocm-dedup=false to skip this step.",
                stage=self.name,
                details=details,
            ) from e

    @staticmethod
    def _record_links(all_actions, manifest, checked):
        """Keep the links and record them in the manifest."""
        commit(actions=all_actions)
        for action in all_actions:
            manifest.add(
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

    def _verify_and_finish(self, context, applied, manifest, warnings):
        """Check the links resolve; commit, or roll back and skip/fail."""
        all_actions = [a for _bundle, actions in applied for a in actions]
        failures, checked = self._check_links(context, applied, all_actions)
        if failures:
            rollback(actions=all_actions)
            before, _ = self._verify(context, applied)
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
                self._skip_or_fail(
                    manifest,
                    warnings,
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
        self._record_links(all_actions, manifest, checked)
