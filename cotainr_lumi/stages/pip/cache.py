"""
A host pip cache reused across builds, never left in the image.

The sandbox has no bind mounts: the host cache's files are hard-linked (or
copied) into the sandbox directory pip uses as ``--cache-dir``, and new or
replaced ones linked back afterwards, also after a failure. pip replaces
cache entries by renaming, so a linked host file is never modified in place
and builds can share the host cache.
"""

import logging
import os
from pathlib import Path
import shutil
import tempfile

logger = logging.getLogger(f"cotainr.{__name__}")


def link_or_copy(src, dst):
    """Put file `src` at `dst` atomically: a hard link if possible, else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".cotainr-lumi-")
    os.close(fd)
    os.unlink(tmp)
    try:
        try:
            os.link(src, tmp)
            linked = True
        except OSError:
            shutil.copy2(src, tmp)
            linked = False
        os.replace(tmp, dst)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return linked


def _files(top):
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            yield path, path.relative_to(top)


def import_cache(*, host_dir, sandbox_dir):
    """Fill the sandbox cache directory (a Path) from the host cache (a Path)."""
    host_dir.mkdir(parents=True, exist_ok=True)
    sandbox_dir.mkdir(parents=True, exist_ok=True)
    stats = {"files": 0, "bytes": 0, "linked": 0}
    for path, rel in _files(host_dir):
        if rel.name.startswith(".cotainr-lumi-"):
            continue
        stats["files"] += 1
        stats["bytes"] += path.stat().st_size
        stats["linked"] += link_or_copy(path, sandbox_dir / rel)
    return stats


def export_cache(*, sandbox_dir, host_dir):
    """Move new cache entries back to the host and remove the sandbox copy (Paths)."""
    stats = {"files": 0, "new": 0}
    if not sandbox_dir.is_dir():
        return stats
    try:
        for path, rel in _files(sandbox_dir):
            stats["files"] += 1
            target = host_dir / rel
            try:
                if target.exists() and os.path.samefile(path, target):
                    continue
            except OSError:
                pass
            try:
                link_or_copy(path, target)
                stats["new"] += 1
            except OSError as e:
                logger.warning("Could not keep pip cache entry %s: %s", rel, e)
    finally:
        shutil.rmtree(sandbox_dir, ignore_errors=True)
    return stats
