"""
The image's ``labels.json`` before cotainr adds its metadata.

cotainr's ``SingularitySandbox.add_metadata`` (2025.3.0 to 2025.7.1, and the
seam's of ``docs/upstream/``) opens ``/.singularity.d/labels.json``, seeks
to its start and dumps the labels with the new ones over it without
truncating the file. When the base image's file is longer than what is
written (a base built by cotainr with a longer ``cotainr.command``, or labels
written indented), the rest of the old file stays behind the new JSON and the
build fails reading it ("Extra data"). Before the metadata is added, the file
is written the way cotainr writes it, without cotainr's own labels (which
cotainr writes again): what cotainr then writes is longer, so nothing is left
behind.

Functions
---------
prepare_for_cotainr_metadata(*, root)
    Rewrite ``labels.json`` so cotainr's ``add_metadata`` leaves no tail.
load_labels(*, path)
    The labels of a ``labels.json`` (a tail left by cotainr is ignored).
"""

import json
import logging

from ..imagelayout import LABELS_FILE

logger = logging.getLogger(f"cotainr.{__name__}")

#: The labels cotainr's add_metadata writes itself.
COTAINR_LABEL_PREFIX = "cotainr."


def load_labels(*, path):
    """
    The labels of a ``labels.json``.

    Parameters
    ----------
    path : :class:`pathlib.Path`
        The file (host path).

    Returns
    -------
    labels : dict
        The first JSON object in the file (a tail cotainr left behind it is
        ignored); empty when the file does not exist or is empty.
    """
    if not path.exists():
        return {}
    text = path.read_text().strip()
    if not text:
        return {}
    labels, _end = json.JSONDecoder().raw_decode(text)
    return labels if isinstance(labels, dict) else {}


def prepare_for_cotainr_metadata(*, root):
    """
    Rewrite ``labels.json`` so cotainr's ``add_metadata`` leaves no tail.

    Parameters
    ----------
    root : :class:`pathlib.Path`
        The sandbox (host path).
    """
    path = root / LABELS_FILE.lstrip("/")
    if not path.is_file() or path.is_symlink():
        return
    labels = {
        k: v
        for k, v in load_labels(path=path).items()
        if not str(k).startswith(COTAINR_LABEL_PREFIX)
    }
    # json.dump's default separators, as cotainr writes the file.
    path.write_text(json.dumps(labels))
