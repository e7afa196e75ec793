"""The host files of a build (module file, shell snippet, ...): checked, then written."""

import logging
import os
from pathlib import Path

from ..engine.stage import OUTPUT_MARKER, HostFiles
from ..errors import StageError

logger = logging.getLogger(f"cotainr.{__name__}")


def _check(path, content, *, stage):
    """Refuse to write `path` over a foreign file, or where it cannot be written."""
    if OUTPUT_MARKER not in content:
        raise StageError(
            f"output {path} lacks the marker {OUTPUT_MARKER!r}", stage=stage
        )
    foreign = path.exists() and OUTPUT_MARKER not in path.read_text(errors="replace")
    if path.is_symlink() or foreign:
        raise StageError(
            f"{path} exists and was not written by cotainr-lumi; it is "
            "left untouched. Move it away, or choose another output "
            "directory for this stage.",
            stage=stage,
        )
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise StageError(
            f"cannot write {path}: {ancestor} is not a writable "
            "directory. Choose another output directory for this stage.",
            stage=stage,
        )


def check(reports):
    """Refuse the host files the stages ask for that cannot be written (before the image)."""
    for report in reports:
        for files in filter(None, (report.host_files, report.layer_host_files)):
            for path, content in files.files.items():
                _check(Path(path), content, stage=report.name)


def joined(reports, *, layer):
    """The host files of all reports in one, of the image or of its `layer` alone."""
    chosen = [report.host_files for report in reports]
    if layer:
        chosen = [r.layer_host_files or r.host_files for r in reports]
    files = {Path(path): text for each in chosen for path, text in each.files.items()}
    hints = [each.run_hint for each in chosen if each.run_hint]
    return HostFiles(files=files, run_hint="\n".join(hints))


def write(host_files):
    """Write host files atomically, one by one (after :func:`check`); log the run hint."""
    for path, content in host_files.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
        tmp.write_text(content)
        mode = 0o644
        if content.startswith("#!"):
            mode = 0o755
        tmp.chmod(mode)
        os.replace(tmp, path)
        logger.info("Wrote %s", path)
    if host_files.run_hint:
        logger.info("%s", host_files.run_hint)
