"""The host files of a build (module file, shell snippet, ...): checked, then written."""

from dataclasses import dataclass
import logging
import os
from pathlib import Path

from ..engine.stage import OUTPUT_MARKER, HostFiles
from ..errors import StageError

logger = logging.getLogger(f"cotainr.{__name__}")


@dataclass(frozen=True)
class Choice:
    """The host files for the image, and for its layer alone (``--layer-only``)."""

    image: HostFiles
    layer: HostFiles


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


def checked(reports):
    """
    The host files the stages asked for, checked before the image is built.

    Returns
    -------
    choice : Choice
        All files and run hints of the reports, for the image and for a layer.
    """
    for report in reports:
        for files in filter(None, (report.host_files, report.layer_host_files)):
            for path, content in files.files.items():
                _check(Path(path), content, stage=report.name)
    return Choice(
        image=_joined([report.host_files for report in reports]),
        layer=_joined([r.layer_host_files or r.host_files for r in reports]),
    )


def _joined(host_files):
    """One HostFiles of several: all their files, their run hints in order."""
    files = {
        Path(path): text for each in host_files for path, text in each.files.items()
    }
    hints = [each.run_hint for each in host_files if each.run_hint]
    return HostFiles(files=files, run_hint="\n".join(hints))


def write(files):
    """Write host files atomically, one by one (after :func:`checked`)."""
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
        tmp.write_text(content)
        mode = 0o644
        if content.startswith("#!"):
            mode = 0o755
        tmp.chmod(mode)
        os.replace(tmp, path)
        logger.info("Wrote %s", path)
