"""The prune manifest: what the prune stage removed or linked, what it kept, and why."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
import json
import logging

from ...engine.rootfs import write_file_in_root
from ...errors import StageError
from ...imagelayout import PRUNE_MANIFEST_FILE

logger = logging.getLogger(f"cotainr.{__name__}")

#: The version of the manifest format.
MANIFEST_FORMAT = 1


def format_bytes(*, size):
    """A byte count for humans."""
    if size < 1024:
        return f"{int(size)} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}"


@dataclass
class ManifestEntry:
    """One pruned path."""

    path: str
    action: str
    size: int
    reason: str
    kind: str = "file"
    target: str | None = None
    group: str = ""


@dataclass
class PruneManifest:
    """All entries and skipped decisions of one build."""

    entries: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    #: Whether a skipped pruning fails the build (``prune.strict``).
    strict: bool = False

    def skip(self, group, what, reason):
        """Record a decision not to prune."""
        self.skipped.append({"group": group, "what": str(what), "reason": reason})

    def warn(self, group, what, reason):
        """Record a decision not to prune that the build log must show."""
        self.skip(group, what, reason)
        self.warnings.append(reason)

    def skip_or_fail(self, group, what, reason):
        """Record a skipped pruning: a warning, or a failure in strict mode."""
        if self.strict:
            raise StageError(
                f"{reason}. This build is strict (prune.strict: true); with "
                "--set prune.strict=false it skips this pruning with a warning.",
                stage="prune",
            )
        self.warn(group, what, reason)
        logger.warning("Prune: %s; not pruned.", reason)

    @property
    def bytes_saved(self):
        """The bytes freed by all entries."""
        return sum(entry.size for entry in self.entries)

    def summary(self):
        """One line for the build log."""
        removed = sum(e.action == "removed" for e in self.entries)
        linked = sum(e.action == "symlinked" for e in self.entries)
        parts = [f"removed {removed}"] if removed else []
        parts += [f"replaced {linked} by links into ROCm"] if linked else []
        text = ", ".join(parts) or "nothing pruned"
        text += f" ({format_bytes(size=self.bytes_saved)} saved)"
        if self.skipped:
            text += f"; {len(self.skipped)} decision(s) not to prune (see manifest)"
        return text

    def to_dict(self):
        """The JSON-serialisable manifest."""
        return {
            "format": MANIFEST_FORMAT,
            "bytes-saved": self.bytes_saved,
            "entries": [
                asdict(e) for e in sorted(self.entries, key=lambda e: (e.group, e.path))
            ],
            "skipped": self.skipped,
            "settings": self.settings,
            "facts": self.facts,
        }

    def write(self, *, root):
        """Write the manifest into the image at ``PRUNE_MANIFEST_FILE``."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)
        return write_file_in_root(
            root=root, path=PRUNE_MANIFEST_FILE, content=text + "\n"
        )
