"""
Path handling confined to a container root file system.

A sandbox is a directory on the host holding the image's root file system.
Its symlinks are meant for the image: ``/opt/rocm -> /opt/rocm-6.2.4`` points
to the image's ``/opt/rocm-6.2.4``, not the host's. Everything here resolves
such links inside the sandbox root, so nothing we read for decisions, write or
delete can be a host file.
"""

import errno
import logging
import os
from pathlib import Path, PurePosixPath
import shutil

from .. import imagelayout
from ..errors import CotainrLumiError

logger = logging.getLogger(f"cotainr.{__name__}")

#: The most symlinks followed while resolving one path (as Linux' MAXSYMLINKS).
MAX_SYMLINKS = 40


class SymlinkLoopError(OSError):
    """Too many symlinks (a loop) while resolving a path inside a root."""


def resolve_in_root(*, root, path, follow_final=True):
    """
    Resolve an image path to a host path inside `root`.

    The path is resolved component by component as the kernel would resolve
    it with `root` as ``/`` (like ``chroot``): absolute symlink targets restart
    at `root`, ``..`` never climbs above `root`, and missing components are
    kept literally. The result therefore always lies inside `root`.
    """
    root = Path(os.path.abspath(root))
    pending = [p for p in PurePosixPath("/", path).parts[1:]]
    pending.reverse()  # a stack: the next component is at the end
    resolved = []
    links_followed = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        is_last = not pending
        if is_last and not follow_final:
            resolved.append(part)
            break
        try:
            is_link = candidate.is_symlink()
        except OSError:
            is_link = False
        if not is_link:
            resolved.append(part)
            continue
        links_followed += 1
        if links_followed > MAX_SYMLINKS:
            raise SymlinkLoopError(
                errno.ELOOP,
                f"Too many levels of symbolic links resolving {path!s} inside {root}",
            )
        target = PurePosixPath(os.readlink(candidate))
        if target.is_absolute():
            resolved = []
            target_parts = list(target.parts[1:])
        else:
            target_parts = list(target.parts)
        pending.extend(reversed(target_parts))
    return root.joinpath(*resolved)


def image_path_of(*, root, host_path):
    """The image path of a host path that lies inside `root`."""
    rel = Path(os.path.abspath(host_path)).relative_to(os.path.abspath(root))
    return PurePosixPath("/", *rel.parts)


def write_file_in_root(*, root, path, content, mode=0o644):
    """
    Write a regular file at an image path, never through a link.

    Parent directories are resolved inside `root` and created (mode 0755) if
    missing. A symlink at the final component is replaced by the file (the
    link is removed, its target is left alone).
    """
    image_path = PurePosixPath("/", path)
    parent = resolve_in_root(root=root, path=image_path.parent)
    parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    target = parent / image_path.name
    if target.is_symlink():
        target.unlink()
    data = content.encode() if isinstance(content, str) else content
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(target, mode)
    return target


class RootEntry:
    """One entry met by :func:`walk_in_root` (never followed through a link)."""

    __slots__ = ("path", "kind", "_size")

    def __init__(self, *, path, kind, size=None):
        self.path = path
        self.kind = kind
        self._size = size

    @property
    def host_path(self):
        """The host path as a :class:`pathlib.Path`."""
        return Path(self.path)

    @property
    def size(self):
        """The size from ``lstat`` (read on first use; 0 if it vanished)."""
        if self._size is None:
            try:
                self._size = os.lstat(self.path).st_size
            except OSError:
                self._size = 0
        return self._size

    def __repr__(self):
        return f"RootEntry({self.path!r}, {self.kind!r}, {self.size})"


def is_inside(*, parent, path):
    """
    Whether a host path lies inside (or is) a host directory, lexically.

    Both paths should already be resolved (e.g. by :func:`resolve_in_root`);
    no symlink is followed here.
    """
    parent = os.path.abspath(parent)
    path = os.path.abspath(path)
    return os.path.commonpath([parent, path]) == parent


def walk_in_root(*, root, path):
    """
    Walk a directory tree inside a root, never following a symlink.

    The start directory is resolved with :func:`resolve_in_root` (so a link
    on the way to it stays inside `root`); below it, symlinks are reported as
    ``"symlink"`` entries and never followed, so the walk cannot leave the
    start directory. Unreadable directories are logged and skipped.
    """
    start = resolve_in_root(root=root, path=path)
    if not start.is_dir() or start.is_symlink():
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
            # The kinds come from the directory entries' d_type (no stat call
            # on file systems that report it): walks meet many files.
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

    The build writes inside `root`, but the container follows links at run
    time, where host directories are mounted (``/tmp``, ``$HOME``): with a
    base image's ``/opt/cotainr-lumi -> /tmp/x``, pip would read another
    user's files in the host's ``/tmp/x`` instead of those the build wrote.
    So each of :data:`BUILD_DIRS` that is a link becomes a real directory
    holding a copy of what the link leads to inside `root` (if anything), and
    the records directory (:data:`cotainr_lumi.imagelayout.RECORDS_DIR`)
    keeps no link at all.
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
            entry.host_path.unlink()
