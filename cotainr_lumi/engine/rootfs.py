"""
Paths of an image's root file system on the host, links resolved inside it.

A sandbox's links are meant for the image (``/opt/rocm -> /opt/rocm-6.2.4``),
so nothing read for decisions, written or deleted here can be a host file.
"""

import errno
import logging
import os
from pathlib import Path, PurePosixPath
import shutil
from typing import NamedTuple

from .. import imagelayout
from ..errors import CotainrLumiError

logger = logging.getLogger(f"cotainr.{__name__}")

#: The most symlinks followed while resolving one path (as Linux' MAXSYMLINKS).
MAX_SYMLINKS = 40


class SymlinkLoopError(OSError):
    """Too many symlinks (a loop) while resolving a path inside a root."""


def _link_target(link, *, followed, path, root):
    """The target of the `followed`-th link met resolving `path` (a loop raises)."""
    if followed > MAX_SYMLINKS:
        raise SymlinkLoopError(
            errno.ELOOP,
            f"Too many levels of symbolic links resolving {path!s} inside {root}",
        )
    return PurePosixPath(os.readlink(link))


def resolve_in_root(*, root, path, follow_final=True, confine=False):
    """The host path of an image path, resolved as under ``chroot root``.

    Absolute link targets restart at `root`, ``..`` never climbs above it (with
    `confine`, a link climbing above it is an error) and missing components
    are kept, so the result always lies inside `root`.
    """
    root = Path(os.path.abspath(root))
    # A stack: the next component is at the end.
    pending = list(reversed(PurePosixPath("/", path).parts[1:]))
    resolved = []
    links_followed = 0
    while pending:
        part = pending.pop()  # never "" or ".": PurePosixPath drops them
        if part == "..":
            if resolved:
                resolved.pop()
            elif confine and links_followed:
                raise OSError(errno.EXDEV, f"{path!s} links to outside {root}")
            continue
        candidate = root.joinpath(*resolved, part)
        if (not pending and not follow_final) or not os.path.islink(candidate):
            resolved.append(part)
            continue
        links_followed += 1
        target = _link_target(candidate, followed=links_followed, path=path, root=root)
        if target.is_absolute():
            resolved = []
        pending.extend(reversed(target.relative_to(target.anchor).parts))
    return root.joinpath(*resolved)


def image_path_of(*, root, host_path):
    """The image path of a host path that lies inside `root`."""
    rel = Path(os.path.abspath(host_path)).relative_to(os.path.abspath(root))
    return PurePosixPath("/", *rel.parts)


def write_file_in_root(*, root, path, content, mode=0o644):
    """Write a regular file at an image path (a link there is replaced)."""
    target = resolve_in_root(root=root, path=path, follow_final=False)
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    os.chmod(target, mode)
    return target


class RootEntry(NamedTuple):
    """One entry met by :func:`walk_in_root` (never followed through a link)."""

    path: str
    kind: str

    @property
    def size(self):
        """The size from ``lstat`` (0 if it vanished)."""
        try:
            return os.lstat(self.path).st_size
        except OSError:
            return 0


def is_inside(*, parent, path):
    """Whether a resolved host path lies inside (or is) a directory, lexically."""
    parent = os.path.abspath(parent)
    return os.path.commonpath([parent, os.path.abspath(path)]) == parent


def walk_in_root(*, root, path):
    """Walk a tree inside `root`; links below the start are reported, never followed."""
    start = resolve_in_root(root=root, path=path)
    if not start.is_dir():
        return
    stack = [str(start)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError as e:
            logger.warning("Cannot read directory %s: %s", directory, e.strerror)
            continue
        for entry in entries:
            try:
                if entry.is_symlink():
                    kind = "symlink"
                elif entry.is_dir(follow_symlinks=False):
                    kind = "dir"
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    kind = "other"
            except OSError:
                continue
            yield RootEntry(path=entry.path, kind=kind)


#: The image directories the build writes into (see :func:`claim_build_dirs`).
BUILD_DIRS = (
    imagelayout.RECORDS_DIR,
    imagelayout.RUNSCRIPTS_DIR,
    imagelayout.ENV_SCRIPTS_DIR,
)


def claim_build_dirs(*, root):
    """
    Make the directories the build writes into real directories, not links.

    At run time the container follows links to mounted host directories
    (``/opt/cotainr-lumi -> /tmp/x``), so each of :data:`BUILD_DIRS` that is
    a link becomes a directory holding a copy of its target inside `root`,
    and the records directory keeps no link at all.
    """
    root = Path(root)
    for path in (*BUILD_DIRS, imagelayout.LABELS_FILE):
        parts = PurePosixPath(path).parts[1:]
        for depth in range(1, len(parts) + 1):
            host = root.joinpath(*parts[:depth])
            if not host.is_symlink():
                continue
            shown = "/" + "/".join(parts[:depth])
            if depth < len(parts) or path == imagelayout.LABELS_FILE:
                raise CotainrLumiError(
                    f"The base image's {shown} is a symbolic link (to "
                    f"{os.readlink(host)}); the build writes {path}, and a link "
                    "can lead out of the image (to a host file or directory). "
                    f"Use a base image where {shown} is not a link."
                )
            logger.warning(
                "The base image's %s is a symbolic link (to %s): replaced by a "
                "directory, so the container reads what the build writes there.",
                path,
                os.readlink(host),
            )
            target = resolve_in_root(root=root, path=path)
            host.unlink()
            if target.is_dir() and not is_inside(parent=target, path=host):
                shutil.copytree(target, host, symlinks=True)
            else:
                host.mkdir(mode=0o755)
    for entry in list(walk_in_root(root=root, path=imagelayout.RECORDS_DIR)):
        if entry.kind == "symlink":
            link = image_path_of(root=root, host_path=entry.path)
            logger.warning("Removing the base image's link %s.", link)
            os.unlink(entry.path)


def resolve_or_none(*, root, path):
    """:func:`resolve_in_root`, or None for a symlink loop."""
    try:
        return resolve_in_root(root=root, path=path)
    except SymlinkLoopError:
        return None
