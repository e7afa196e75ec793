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
    LABEL_PAD,
    LABEL_PROVENANCE,
    LABEL_STAGES,
    LABEL_SYSTEM,
    LABEL_VERSION,
    PROVENANCE_FILE,
)

logger = logging.getLogger(f"cotainr.{__name__}")


def _go_json_size(labels):
    """The size of labels.json as Apptainer writes it (Go: tabs, raw UTF-8, <>& escaped)."""
    text = json.dumps(labels, indent="\t", ensure_ascii=False)
    return len(text.encode()) + 5 * sum(text.count(c) for c in "<>&")


def stock_cotainr_pad(*, labels):
    """
    A label that keeps stock cotainr's rewrite of this labels.json valid.

    cotainr 2025.7.1 and older rewrite labels.json in place, compact and without
    truncating it (fixed by patch 0003 of docs/upstream/series): a build on an
    image whose Apptainer-written labels.json is longer than the rewrite fails.
    Each "\u00b7" is 2 bytes in Apptainer's file and 6 in cotainr's, so enough of
    them make the rewrite the longer one, even with an empty new cotainr.command.
    """
    labels = {k: v for k, v in labels.items() if k != LABEL_PAD}
    short = {k: "" if k == "cotainr.command" else v for k, v in labels.items()}
    # + 8 Apptainer labels (1 byte each in tabs and newlines) and a margin.
    excess = _go_json_size(labels) - len(json.dumps(short)) + 8 + 16
    return {LABEL_PAD: "\u00b7" * max(1, -(-excess // 4))}


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

    def describe(self, *, plan):
        """Describe the labels the stage will add."""
        lines = [
            "labels: cotainr-lumi.{version,cotainr-version,system,stages,"
            "base-image,base-image.resolved,base-image.sha256,provenance}",
            f"record: {PROVENANCE_FILE}",
        ]
        if plan.base_image.is_local_file and self.settings.hash_base_image:
            lines.append(f"sha256 of {plan.base_image.resolved}")
        return lines

    def run(self, *, context):
        """Write the labels and the provenance record (both redacted)."""
        plan = context.plan
        base = plan.base_image
        sha256 = ""
        if base.is_local_file and self.settings.hash_base_image:
            sha256 = remembered_sha256(path=base.resolved, pinned=base.pinned)
        stages = plan.stage_names
        labels = {
            LABEL_VERSION: __version__,
            LABEL_COTAINR_VERSION: _cotainr.cotainr_version(),
            LABEL_SYSTEM: plan.system.name if plan.system else "",
            LABEL_BASE_IMAGE: base.given,
            LABEL_BASE_IMAGE_RESOLVED: base.resolved,
            LABEL_STAGES: ",".join(stages),
            LABEL_PROVENANCE: PROVENANCE_FILE,
        }
        if sha256:
            labels[LABEL_BASE_IMAGE_SHA256] = sha256
        record = {
            "cotainr-lumi": __version__,
            "cotainr": _cotainr.cotainr_version(),
            "built": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "build-host": {
                "machine": platform.machine(),
                "python": platform.python_version(),
            },
            "system": plan.system.name if plan.system else None,
            "profile-sources": list(plan.system.sources) if plan.system else [],
            "base-image": {
                "given": base.given,
                "pattern": base.pattern,
                "resolved": base.resolved,
                "sha256": sha256 or None,
            },
            "conda-env": ", ".join(f.name for f in plan.conda_envs) or None,
            "stages": [
                {"name": stage.name, "settings": stage.settings.to_dict()}
                for stage in plan.stages
            ],
            "reports": [
                {"name": r.name, "summary": r.summary, "labels": r.labels}
                for r in context.reports
            ],
        }
        write_file_in_root(
            root=context.sandbox.root,
            path=PROVENANCE_FILE,
            content=redact(json.dumps(record, indent=2, sort_keys=True, default=str))
            + "\n",
        )
        summary = f"base image {base.resolved}" + (
            f" (sha256 {sha256[:12]}…)" if sha256 else ""
        )
        labels = {key: redact(value) for key, value in labels.items()}
        return StageReport(
            name=self.name, summary=summary, details=record, labels=labels
        )
