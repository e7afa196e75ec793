"""The prune stage: remove what the base image provides, when provably safe."""

from dataclasses import dataclass
import logging

from ...engine.settings import StageSettings, setting
from ...engine.stage import Stage, StageReport
from ...errors import StageError
from ...imagelayout import (
    LABEL_PRUNE_BYTES_SAVED,
    LABEL_PRUNE_MANIFEST,
    PRUNE_MANIFEST_FILE,
)
from .libstdcxx import LIBSTDCXX_GLOB, check_libstdcxx, format_missing, remove_libstdcxx
from .manifest import PruneManifest, format_bytes
from .rocm import AMDGPU_LIB_DIR, RocmDedup

logger = logging.getLogger(f"cotainr.{__name__}")


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


class PruneStage(Stage):
    """Remove the env's libstdc++ and de-duplicate bundled ROCm libraries, when safe."""

    name = "prune"
    settings_class = PruneSettings

    def enabled(self):
        """Run when at least one pruning is on."""
        return bool(self.settings.libstdcxx or self.settings.rocm_dedup)

    def describe(self, *, build):
        """Describe the checks and actions (the sandbox does not exist yet)."""
        lines = [
            f"environment: {build.target_text} (torch/lib in its site-packages; "
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
            rocm = build.rocm_version
            says = f"; profile says {rocm}" if rocm else ""
            base = f"the base image's ROCm ($ROCM_PATH/.info/version{says})"
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
        lines.append(f"manifest: {PRUNE_MANIFEST_FILE} (label {LABEL_PRUNE_MANIFEST})")
        return lines

    def run(self, *, context):
        """Prune what is safe in the build's target env and write the manifest."""
        target = context.target_env
        manifest = PruneManifest(
            settings=self.settings.to_dict(),
            facts={
                "env-prefix": target.prefix if target is not None else None,
                "env-source": target.reason if target is not None else None,
                "site-packages": list(target.site) if target is not None else [],
            },
            strict=self.settings.strict,
        )
        if target is None:
            manifest.skip_or_fail(
                "all",
                "environment",
                "the image has no Python environment (no $WITH_CONDA, venv or "
                "conda env): there is no environment to prune",
            )
        else:
            self._prune(context, target, manifest)
        manifest.write(root=context.sandbox.root)
        summary = manifest.summary()
        logger.info("Prune summary: %s; manifest %s", summary, PRUNE_MANIFEST_FILE)
        return StageReport(
            name=self.name,
            summary=summary,
            record={**manifest.to_dict(), "warnings": manifest.warnings},
            labels={
                LABEL_PRUNE_MANIFEST: PRUNE_MANIFEST_FILE,
                LABEL_PRUNE_BYTES_SAVED: str(manifest.bytes_saved),
            },
        )

    def _prune(self, context, target, manifest):
        """The prunings the settings ask for, in the target env."""
        if self.settings.libstdcxx:
            ldconfig_text = "\n".join(target.image.libstdcxx_cache)
            for env_prefix in target.env_prefixes:
                self._prune_libstdcxx(
                    context.sandbox.root, env_prefix, ldconfig_text, manifest
                )
        else:
            manifest.skip(
                "libstdcxx",
                f"{target.prefix}/lib/{LIBSTDCXX_GLOB}",
                "kept on request (libstdcxx: false)",
            )
        if self.settings.rocm_dedup:
            RocmDedup(context=context, manifest=manifest).run()
        else:
            manifest.skip(
                "rocm-dedup",
                "bundled ROCm libraries",
                "kept on request (rocm-dedup: false)",
            )

    def _prune_libstdcxx(self, root, prefix, ldconfig_text, manifest):
        """Remove the libstdc++ of one env prefix if that is safe."""
        check = check_libstdcxx(
            root=root, env_prefix=prefix, ldconfig_text=ldconfig_text
        )
        what = f"{prefix}/lib"
        if check.status == "absent" and "libstdcxx" in manifest.facts:
            # Another prefix of the env (a venv's base) already reported.
            manifest.skip("libstdcxx", what, check.reason)
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
            manifest.skip("libstdcxx", what, check.reason)
            return
        if check.status == "unsupported":
            manifest.skip_or_fail("libstdcxx", what, check.reason)
            return
        if check.status == "unsafe":
            system = check.system.image_path if check.system else "libstdc++.so.6"
            raise StageError(
                f"removing the environment's libstdc++ ({what}/{LIBSTDCXX_GLOB}) "
                f"is not safe: {check.reason}:\n{format_missing(check=check)}\n"
                "Ways out: keep the environment's libstdc++ (--set prune.libstdcxx=false, "
                "or `libstdcxx: false` under settings: prune: in the system "
                "profile), or use a base image whose "
                f"{system} is newer (--base-image IMAGE --lumi-system NAME).",
                stage=self.name,
            )
        freed = remove_libstdcxx(check=check, root=root, manifest=manifest)
        logger.info(
            "Prune: removed %d libstdc++ file(s) from %s (%s): %s",
            len(check.candidates),
            what,
            format_bytes(size=freed),
            check.reason,
        )
