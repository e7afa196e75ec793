"""The sha256 of a file, remembered per user while the file is unchanged."""

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
import stat
import tempfile

from .. import safeio
from ..errors import InputError

logger = logging.getLogger(f"cotainr.{__name__}")

#: The most files remembered (the newest).
KEEP = 64


def sha256_of_file(*, path, chunk_size=4 * 1024 * 1024):
    """Stream a file through SHA-256."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp(info):
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


class Pinned:
    """
    A file held open for a whole build (a base image on a shared file system).

    Read it through :attr:`path` (the held descriptor: the same inode and bytes
    whatever is renamed over its name); :meth:`check` stops with one error when
    its name now leads to another file, or the file was written to.
    """

    def __init__(self, name):
        self.name = os.path.realpath(name)
        try:
            self.file = safeio.open_regular(self.name)
        except OSError as e:
            raise InputError(f"Cannot read the base image {name}: {e}") from None
        self.stamp = _stamp(os.fstat(self.file.fileno()))
        self.path = f"/proc/{os.getpid()}/fd/{self.file.fileno()}"

    def check(self):
        """Raise InputError unless the name still leads to the unchanged file."""
        with contextlib.suppress(OSError):
            now = [_stamp(os.stat(self.name)), _stamp(os.fstat(self.file.fileno()))]
            if now == [self.stamp, self.stamp]:
                return
        raise InputError(
            f"The base image {self.name} changed during the build (another file was "
            "put at its path, or it was written to); no image was written. Build "
            "again once it is left alone, or from a copy of it."
        )


def _trusted(cache_file):
    """The digests the user's own cache file holds ({} when not trusted)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        own = cache_file.lstat()
        if own.st_uid == os.getuid() and stat.S_ISREG(own.st_mode):
            if not own.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return dict(json.loads(safeio.read_bounded(cache_file)))
    return {}


def remembered_sha256(*, path, cache_file=None, pinned=None):
    """
    The sha256 of `path` (of the `pinned` file), read again only when it may have changed.

    A digest is reused while the file's device, inode, size, mtime and ctime
    are those it was computed at (a write changes the ctime, which no user can
    set back). Only a `cache_file` (``$XDG_CACHE_HOME/cotainr-lumi/sha256.json``)
    that is the user's own, not a link and not writable by others is trusted.
    """
    if pinned is None:
        pinned = Pinned(path)
        with pinned.file:
            return remembered_sha256(path=path, cache_file=cache_file, pinned=pinned)
    pinned.check()
    real = pinned.name
    if cache_file is None:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        cache_file = Path(cache) / "cotainr-lumi" / "sha256.json"
    known = _trusted(cache_file)
    entry = known.pop(real, None)
    if (
        isinstance(entry, list)
        and entry[:-1] == pinned.stamp
        and isinstance(entry[-1], str)
    ):
        logger.info("The sha256 of %s is remembered (the file is unchanged)", real)
        return entry[-1]
    logger.info("Computing the sha256 of %s", real)
    known[real] = [*pinned.stamp, sha256_of_file(path=pinned.path)]
    try:
        cache_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = tempfile.NamedTemporaryFile(
            "w", dir=cache_file.parent, suffix=".partial", delete=False
        )
        with partial:
            json.dump(dict(list(known.items())[-KEEP:]), partial)
        os.replace(partial.name, cache_file)
    except OSError as e:
        logger.debug("Could not remember the sha256 in %s: %s", cache_file, e)
    return known[real][-1]
