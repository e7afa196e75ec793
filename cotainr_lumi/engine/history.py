"""
Building on an image cotainr-lumi built: its records are kept, not mixed in.

Before the stages write this build's records, the base's records and its
``cotainr-lumi.*`` labels move to :data:`cotainr_lumi.imagelayout.HISTORY_DIR`
``/N`` (``1`` the oldest), so that nothing of the earlier build passes for
this one's; the label ``cotainr-lumi.history`` counts them. ``with-conda.sh``
stays: the base's ``$WITH_CONDA`` runs it, and this build chains to it.
"""

import json
import logging
import os
import shutil

from .. import imagelayout
from .rootfs import resolve_in_root

logger = logging.getLogger(f"cotainr.{__name__}")

#: A build's records (everything it writes below RECORDS_DIR but with-conda.sh).
BUILD_RECORDS = (
    imagelayout.TARGET_ENV_FILE,
    imagelayout.PROVENANCE_FILE,
    imagelayout.PRUNE_MANIFEST_FILE,
    imagelayout.PIP_DIR,
    imagelayout.RUNTIME_FILE,
    imagelayout.CYCLONEDX_SBOM_FILE,
    imagelayout.MPI_FILE,
)


def read_labels(*, root):
    """The sandbox's labels (None when unreadable; trailing bytes are ignored)."""
    path = resolve_in_root(root=root, path=imagelayout.LABELS_FILE)
    text = path.read_text().strip() if path.is_file() else ""
    try:
        labels = json.JSONDecoder().raw_decode(text)[0] if text else {}
    except ValueError:
        return None
    return labels if isinstance(labels, dict) else None


def keep_earlier_build(*, root):
    """Move the records of the build the base image comes from into the history."""
    if not resolve_in_root(root=root, path=imagelayout.PROVENANCE_FILE).is_file():
        return None
    history = resolve_in_root(root=root, path=imagelayout.HISTORY_DIR)
    numbers = [int(e.name) for e in history.glob("*") if e.name.isdigit()]
    number = max(numbers, default=0) + 1
    entry = history / str(number)
    entry.mkdir(parents=True)
    for record in BUILD_RECORDS:
        source = resolve_in_root(root=root, path=record, follow_final=False)
        if source.exists() or source.is_symlink():
            shutil.move(source, entry / os.path.basename(record))  # EXDEV: copies
    _move_labels(root=root, entry=entry)
    logger.info(
        "The base image was built by cotainr-lumi: its records are kept in %s/%d.",
        imagelayout.HISTORY_DIR,
        number,
    )
    return number


def _move_labels(*, root, entry):
    """The base's ``cotainr-lumi.*`` labels go to ``history/N/labels.json``."""
    path = resolve_in_root(root=root, path=imagelayout.LABELS_FILE)
    labels = read_labels(root=root)
    if labels is None:
        logger.warning("Cannot read %s; its labels stay.", imagelayout.LABELS_FILE)
    elif path.is_file():
        ours = {
            k: v for k, v in labels.items() if k.startswith(imagelayout.LABEL_PREFIX)
        }
        (entry / "labels.json").write_text(json.dumps(ours, indent=2, sort_keys=True))
        path.write_text(json.dumps({k: v for k, v in labels.items() if k not in ours}))
