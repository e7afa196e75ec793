"""
The provenance stage: record how the image was built.

Labels ``cotainr-lumi.*`` (versions, system, stages, the base image as given,
resolved behind symlinks and its sha256) and a JSON record in the image.
"""

from dataclasses import dataclass
import datetime
import json
import logging
import platform

from .. import _cotainr
from .._version import __version__
from ..engine.digest import remembered_sha256
from ..engine.rootfs import write_file_in_root
from ..engine.settings import StageSettings, setting
from ..engine.stage import Stage, StageReport
from ..errors import redact
from ..imagelayout import (
    LABEL_BASE_IMAGE,
    LABEL_BASE_IMAGE_RESOLVED,
    LABEL_BASE_IMAGE_SHA256,
    LABEL_COTAINR_VERSION,
    LABEL_PROVENANCE,
    LABEL_STAGES,
    LABEL_SYSTEM,
    LABEL_VERSION,
    PROVENANCE_FILE,
)

logger = logging.getLogger(f"cotainr.{__name__}")


@dataclass(frozen=True)
class ProvenanceSettings(StageSettings):
    """The settings of the provenance stage."""

    hash_base_image: bool = setting(
        True, doc="record the sha256 of a local base image (read once per file)"
    )


class ProvenanceStage(Stage):
    """Record how the image was built (labels and a JSON record)."""

    name = "provenance"
    settings_class = ProvenanceSettings
    always = True

    def describe(self, *, build):
        """Describe the labels the stage will add."""
        lines = [
            "labels: cotainr-lumi.{version,cotainr-version,system,stages,"
            "base-image,base-image.resolved,base-image.sha256,provenance}",
            f"record: {PROVENANCE_FILE}",
        ]
        if build.base_image.is_local_file and self.settings.hash_base_image:
            lines.append(f"sha256 of {build.base_image.resolved}")
        return lines

    def _record(self, build, sha256, earlier):
        """The provenance record written into the image."""
        base = build.base_image
        conda = ", ".join(f.name for f in build.conda_envs) or None
        return {
            "cotainr-lumi": __version__,
            "cotainr": _cotainr.COTAINR_VERSION,
            "built": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "build-host": {
                "machine": platform.machine(),
                "python": platform.python_version(),
            },
            "system": build.system,
            "profile-sources": list(build.profile_sources),
            "base-image": {
                "given": base.given,
                "pattern": base.pattern,
                "link": base.link,
                "resolved": base.resolved,
                "sha256": sha256 or None,
            },
            "conda-env": conda,
            "stages": [
                {"name": name, "settings": settings} for name, settings in build.stages
            ],
            "reports": [
                {"name": r.name, "summary": r.summary, "labels": dict(r.labels)}
                for r in earlier
            ],
        }

    def run(self, *, context):
        """Write the labels and the provenance record (both redacted)."""
        build = context.build
        base = build.base_image
        sha256 = ""
        if base.is_local_file and self.settings.hash_base_image:
            sha256 = remembered_sha256(path=base.resolved, pinned=base.pinned)
        record = self._record(build, sha256, context.earlier)
        labels = {
            LABEL_VERSION: record["cotainr-lumi"],
            LABEL_COTAINR_VERSION: record["cotainr"],
            LABEL_SYSTEM: build.system or "",
            LABEL_BASE_IMAGE: base.given,
            LABEL_BASE_IMAGE_RESOLVED: base.resolved,
            LABEL_STAGES: ",".join(build.stage_names),
            LABEL_PROVENANCE: PROVENANCE_FILE,
        }
        if sha256:
            labels[LABEL_BASE_IMAGE_SHA256] = sha256
        text = json.dumps(record, indent=2, sort_keys=True, default=str)
        write_file_in_root(
            root=context.sandbox.root, path=PROVENANCE_FILE, content=redact(text) + "\n"
        )
        summary = f"base image {base.resolved}"
        if sha256:
            summary += f" (sha256 {sha256[:12]}…)"
        labels = {key: redact(value) for key, value in labels.items()}
        return StageReport(
            name=self.name, summary=summary, record=record, labels=labels
        )
