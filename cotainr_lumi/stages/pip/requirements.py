r"""
Requirement files of pip steps: local references, checks and staging.

Host paths do not exist in the container: each requirement/constraint file is
copied, its references rewritten and its line numbers kept (pip's "(line N)"
still points at the user's line), to ``/opt/cotainr-lumi/pip/stepN/``, and each
referenced wheel, sdist or directory is staged into a temporary sandbox
directory. The line format is pip's (``\\`` continues, `` #`` comments, a line
starting with ``-`` holds options); unsupportable references fail up front
with file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import os
from pathlib import Path, PurePosixPath
import re
import shlex
import shutil
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement

from ... import apptainer
from ...engine.rootfs import resolve_in_root, write_file_in_root
from ...errors import InputError, StageError
from .cache import link_or_copy

ARCHIVE_EXTENSIONS = tuple(
    ".whl .tar.gz .tgz .tar.bz2 .tbz .tar.xz .txz .tar .zip".split()
)

_COMMENT_RE = re.compile(r"(^|\s+)#.*$")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_VCS_SCHEMES = ("git+", "hg+", "svn+", "bzr+")
_COMMIT_RE = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})$")
_VERSION_TAG_RE = re.compile(r"^v?\d+(\.\d+)+([.+-].*)?$")
_INCLUDE_OPTIONS = ("-r", "--requirement", "-c", "--constraint")
_FIND_LINKS = ("-f", "--find-links")
_EDITABLE = ("-e", "--editable")
#: How deep ``-r``/``-c`` files may include each other.
MAX_INCLUDE_DEPTH = 100
#: The most a local directory of a requirement may hold to be staged.
MAX_TREE_FILES = 20_000


@dataclass(eq=False)
class ReqLine:
    """One logical line that references something local: ``prefix target suffix``."""

    kind: str  # "include", "path", "file-url" or "image-path"
    target: Path | None
    prefix: str = ""
    suffix: str = ""
    original: str = ""
    include: ReqFile | None = None
    start: int = 0
    end: int = 0


@dataclass(eq=False)
class ReqFile:
    """A scanned requirements or constraints file."""

    path: Path | None
    display: str
    lines: list[str]
    base: Path  # what relative references count from
    refs: list[ReqLine] = field(default_factory=list)

    @property
    def name(self):
        """The file's name (``packages.txt`` for a step's inline packages)."""
        return self.path.name if self.path is not None else "packages.txt"

    def where(self, i, start):
        """The `i`-th logical line, which starts at line `start`."""
        if self.path is None:
            return Where(f"{self.display}[{i + 1}]", self.base)
        return Where(f"{self.display}, line {start + 1}", self.base)


@dataclass(frozen=True)
class Where:
    """What is being scanned: how messages name it, where its paths count from."""

    name: str
    base: Path

    def error(self, message):
        """The InputError of `message` on it."""
        return InputError(f"{self.name}: {message}")


def _logical_lines(lines):
    """Yield (start, end, text) for each logical line (comments removed)."""
    start, parts = 0, []
    for i, line in enumerate(lines):
        line = line.rstrip("\n")
        continued = line.endswith("\\") and not _COMMENT_RE.search(line[:-1])
        parts.append(line[:-1] if continued else line)
        if not continued or i == len(lines) - 1:
            yield start, i, _COMMENT_RE.sub("", "".join(parts)).strip()
            start, parts = i + 1, []


def is_remote_url(value):
    """Whether `value` is a URL pip fetches (any scheme but ``file:``)."""
    return bool(_URL_RE.match(value)) and not value.startswith("file:")


def _looks_like_path(name):
    return "/" in name or name.startswith(".")


def moving_vcs_ref(url):
    """Why a VCS requirement URL does not pin one revision (None if it does)."""
    if not url.lower().startswith(_VCS_SCHEMES):
        return None
    try:
        path = urlsplit(url.split("+", 1)[1]).path
    except ValueError as e:
        return f"not a valid URL ({e})"
    ref = unquote(path.rpartition("@")[2]) if "@" in path else ""
    if not ref:
        return "no revision given: it installs whatever the default branch holds"
    if _COMMIT_RE.match(ref) or _VERSION_TAG_RE.match(ref):
        return None
    return f"{ref!r} is a branch or other moving ref"


def _split_url(url, where):
    """:func:`urllib.parse.urlsplit`, with an InputError for a malformed URL."""
    try:
        # A VCS URL (git+https://...) is split without its scheme prefix.
        return urlsplit(url.split("+", 1)[1] if "+" in url.split(":", 1)[0] else url)
    except ValueError as e:
        raise where.error(
            f"{url} is not a valid URL ({e}); check its brackets and host"
        ) from None


def _file_url_path(url, where):
    parts = _split_url(url, where)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise where.error(
            f"{url}: only absolute file: URLs (file:///path) can be used; "
            "write a relative path without file: instead",
        )
    return unquote(parts.path)


def _split_option(tokens):
    """(option, value, rest) of the first option of an option line."""
    first = tokens[0]
    if first.startswith("--") and "=" in first:
        option, value = first.split("=", 1)
        return option, value, tokens[1:]
    if len(first) > 2 and first[:2] in ("-r", "-c", "-f", "-e", "-i"):
        return first[:2], first[2:], tokens[1:]
    return first, (tokens[1] if len(tokens) > 1 else None), tokens[2:]


def _local_target(value, where):
    """(path, in_image): on this machine, else (absolute) in the image."""
    if "${" in value:
        raise where.error(
            f"{value!r}: local paths with ${{VARIABLES}} cannot be staged "
            "into the container; write the path out",
        )
    path = Path(value)
    if path.is_absolute() and not os.path.lexists(path):
        return Path(os.path.normpath(path)), True
    resolved = Path(os.path.abspath(where.base / path))
    if not os.path.lexists(resolved):
        raise where.error(f"{value}: {resolved} does not exist")
    return resolved, False


def _installable(ref, where):
    """`ref` at its wheel, sdist or project directory (checked)."""
    original = ref.original
    value = original
    if ref.kind == "file-url":
        value = _file_url_path(original, where)
    path, in_image = _local_target(value, where)
    ref.target = path
    if in_image:
        ref.kind = "image-path"
    elif path.is_dir():
        if not ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
            raise where.error(
                f"{original}: the directory {path} is not a Python project "
                "(no pyproject.toml or setup.py)",
            )
    elif not path.is_file():
        raise where.error(f"{original}: {path} is not a file or directory")
    elif not path.name.lower().endswith(ARCHIVE_EXTENSIONS):
        raise where.error(
            f"{original}: {path} is neither a wheel nor an sdist "
            f"(expected one of {', '.join(ARCHIVE_EXTENSIONS)})",
        )
    return ref


def _markers(markers, sep):
    return f" ; {markers.strip()}" if sep else ""


def _requirement(text, where):
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        raise where.error(f"invalid requirement {text!r}: {e}") from e


class StepScan:
    """A step's requirement files, scanned (each once) with what they include."""

    def __init__(self):
        self.files: list[ReqFile] = []
        self.moving_refs: list[str] = []  # VCS references without a fixed revision
        self.local_inputs: list[str] = []  # host paths and image:PATH, for plans
        self.options: list[tuple[str, str]] = []  # (option, where) of every line
        self.cache: dict[Path, ReqFile] = {}
        self.active: list[Path] = []

    def scan_path(self, path, where):
        """Read and scan one file (and what it includes)."""
        path = Path(os.path.abspath(path))
        if path in self.active:
            cycle = " -> ".join(str(p) for p in (*self.active, path))
            raise where.error(
                f"requirement files include each other in a cycle: {cycle}"
            )
        if path in self.cache:
            return self.cache[path]
        if len(self.active) > MAX_INCLUDE_DEPTH:
            raise where.error(
                "requirement files include each other more than "
                f"{MAX_INCLUDE_DEPTH} levels deep (from {self.active[0]}); "
                "flatten the chain of -r/-c files",
            )
        try:
            text = path.read_text()
        except OSError as e:
            raise where.error(f"cannot read {path}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise where.error(
                f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8"
            ) from e
        rf = ReqFile(path, str(path), text.splitlines(keepends=True), path.parent)
        self.active.append(path)
        self.scan_lines(rf)  # the scan stops at the first error
        self.active.pop()
        self.cache[path] = rf
        return rf

    def scan_lines(self, rf):
        """Scan `rf`'s lines."""
        for i, (start, end, text) in enumerate(_logical_lines(rf.lines)):
            if not text:
                continue
            parse = self.option_line if text.startswith("-") else self.requirement_line
            ref = parse(text, rf.where(i, start))
            if ref is None:
                continue
            ref.start = start
            ref.end = end
            rf.refs.append(ref)
            if ref.kind == "image-path":
                self.local_inputs.append(f"image:{ref.target}")
            elif ref.include is None:
                self.local_inputs.append(str(ref.target))

    def note_url(self, url, where):
        """Check a remote URL; note it if it is VCS without a pinned revision."""
        _split_url(url, where)
        reason = moving_vcs_ref(url)
        if reason:
            self.moving_refs.append(
                f"{where.name}: {url}: {reason}; pin a commit (@<sha>) or a tag "
                "for a reproducible image"
            )

    def option_line(self, text, where):
        """An option line (``-r``, ``-c``, ``-f``; editable installs rejected)."""
        try:
            tokens = shlex.split(text)
        except ValueError as e:
            raise where.error(f"cannot split the options ({e})") from e
        option, value, rest = _split_option(tokens)
        self.options.append((option, where.name))
        if option in _EDITABLE:
            raise where.error(
                f"editable installs ({option} {value or ''}) are not supported in "
                "an image build: the source would not be in the image. Drop "
                f"'{option}' to install a copy of the project instead.",
            )
        if option not in _INCLUDE_OPTIONS + _FIND_LINKS:
            return None
        if not value:
            raise where.error(f"{option} needs a value")
        if is_remote_url(value):
            return None  # a remote file or index: pip fetches it
        path, in_image = _local_target(value, where)
        suffix = "".join(f" {shlex.quote(t)}" for t in rest)
        ref = ReqLine("path", path, f"{option} ", suffix, value)
        if option in _FIND_LINKS:
            return _find_links(ref, where, in_image=in_image)
        if in_image:
            raise where.error(
                f"{option} {value}: {path} does not exist on this machine "
                "(included files must be on this machine)",
            )
        return self._include(ref, where)

    def _include(self, ref, where):
        """The line of a ``-r``/``-c`` file here, scanned."""
        if not ref.target.is_file():
            raise where.error(f"{ref.prefix}{ref.original}: {ref.target} is not a file")
        ref.kind = "include"
        ref.include = self.scan_path(ref.target, where)
        return ref

    def requirement_line(self, text, where):
        """A requirement line: a name, a URL, a ``file:`` URL or a local path."""
        req_text, options = _split_requirement(text, where)
        self.options += [
            (t.partition("=")[0], where.name) for t in options if t[0] == "-"
        ]
        if req_text.startswith("file:"):
            url, sep, markers = req_text.partition("; ")
            ref = ReqLine("file-url", None, "", _markers(markers, sep), url.strip())
        elif _URL_RE.match(req_text):
            self.note_url(req_text.partition(";")[0].strip(), where)
            return None  # remote URL (https://..., git+https://...)
        elif "@" in req_text and not _looks_like_path(req_text.split("@")[0].strip()):
            ref = self._direct_url_line(req_text, where)
        else:
            ref = _path_line(req_text, where)
        if ref is None:
            return None
        ref.suffix += "".join(f" {t}" for t in options)
        return _installable(ref, where)

    def _direct_url_line(self, req_text, where):
        """``name @ URL``: a ``file:`` URL's line (a remote URL is only noted)."""
        req = _requirement(req_text, where)
        if req.url and req.url.startswith("file:"):
            prefix, _, suffix = req_text.partition(req.url)
            return ReqLine("file-url", None, prefix, suffix, req.url)
        if req.url:
            self.note_url(req.url, where)
        return None


def _split_requirement(text, where):
    """(requirement, the options after it) of a requirement line."""
    tokens = text.split()
    n = next((i for i, t in enumerate(tokens) if t.startswith("-")), len(tokens))
    if n == 0:
        raise where.error(f"no requirement before the options in {text!r}")
    return " ".join(tokens[:n]), tokens[n:]


def _find_links(ref, where, *, in_image):
    """The line of a local ``--find-links`` directory (in the image or here)."""
    if in_image:
        ref.kind = "image-path"
    elif not ref.target.exists():
        raise where.error(f"{ref.prefix}{ref.original}: {ref.target} does not exist")
    return ref


def _path_line(req_text, where):
    """A local path requirement (``./dir[extra]``, ``x.whl``); None for a name."""
    path_part, sep, markers = req_text.partition(";")
    bare, extras = re.match(r"^(.*?)(\[[^\]]*\])?$", path_part.strip()).groups()
    if not (_looks_like_path(bare) or bare.lower().endswith(ARCHIVE_EXTENSIONS)):
        _requirement(req_text, where)
        return None
    return ReqLine("path", None, "", (extras or "") + _markers(markers, sep), bare)


def scan_step(*, step):
    """Scan a step's requirement files (recursively) and check their references."""
    scan = StepScan()
    for path in step.requirements:
        if not path.is_file():
            raise InputError(
                f"{step.title}: the requirements file {path} does not exist."
            )
        scan.files.append(scan.scan_path(path, Where(step.title, path.parent)))
    if step.packages:
        lines = [p.strip() + "\n" for p in step.packages]
        rf = ReqFile(None, f"{step.title}, packages", lines, step.base_dir)
        scan.scan_lines(rf)
        scan.files.append(rf)
    return scan


def _check_tree_to_stage(src, *, root):
    """Refuse to stage a directory that holds the sandbox or is not a project."""
    real_src = Path(os.path.realpath(src))
    real_root = Path(os.path.realpath(root))
    if real_src == real_root or real_src in real_root.parents:
        raise StageError(
            f"the local directory {src} holds the image being built "
            f"({real_root}); a requirement must name a project directory, "
            "not a parent of the build's work directory",
            stage="pip",
        )
    count = 0
    for _dirpath, dirnames, filenames in os.walk(real_src):
        count += len(dirnames) + len(filenames)
        if count > MAX_TREE_FILES:
            raise StageError(
                f"the local directory {src} holds more than {MAX_TREE_FILES} "
                "files; a requirement must name a project directory (build a "
                "wheel of it, or point at a smaller directory)",
                stage="pip",
            )


class StagedStep:
    """A scanned step staged into the sandbox (paths in the image <- on the host).

    A local file is mounted read-only where the step reads it (:attr:`binds`,
    for the install command), not copied: it keeps its inode and ctime, by which
    uv's cache knows a local wheel it has unpacked before. A file whose path
    cannot be mounted is hard-linked or copied; a directory is copied (builds
    write into those).
    """

    def __init__(self, *, scan, root, keep_dir, staging_dir):
        self.root = Path(root)
        self.keep_dir = PurePosixPath(keep_dir)
        self.staging_dir = PurePosixPath(staging_dir)
        self.kept_files: dict[str, str] = {}
        self.staged: dict[str, str] = {}
        self.binds: list[str] = []
        self._kept: dict[ReqFile, str] = {}
        self._staged: dict[Path, str] = {}
        self.requirement_files = [self._stage_file(rf) for rf in scan.files]

    def _kept_name(self, rf):
        stem = rf.name
        used = {PurePosixPath(p).name for p in self.kept_files}
        name, n = stem, 1
        while name in used:
            n += 1
            base, dot, ext = stem.rpartition(".")
            name = f"{base}-{n}.{ext}" if dot and base else f"{stem}-{n}"
        return str(self.keep_dir / name)

    def _stage_file(self, rf):
        if rf in self._kept:
            return self._kept[rf]
        image_path = self._kept[rf] = self._kept_name(rf)
        self.kept_files[image_path] = rf.display
        lines = list(rf.lines)
        for ref in rf.refs:
            new = self._rewrite(ref)
            if new is None:
                continue
            lines[ref.start] = new + ("\n" if lines[ref.end].endswith("\n") else "")
            lines[ref.start + 1 : ref.end + 1] = ["\n"] * (ref.end - ref.start)
        write_file_in_root(root=self.root, path=image_path, content="".join(lines))
        return image_path

    def _stage_path(self, src):
        """Mount (or hard-link or copy) a file, copy a directory."""
        if src in self._staged:
            return self._staged[src]
        image_path = str(self.staging_dir / str(len(self._staged) + 1) / src.name)
        host = resolve_in_root(root=self.root, path=image_path)
        real = os.path.realpath(src)
        if src.is_dir():
            _check_tree_to_stage(src, root=self.root)
            host.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, host, symlinks=True)
        elif apptainer.can_bind(real) and apptainer.can_bind(image_path):
            host.parent.mkdir(parents=True, exist_ok=True)
            host.touch()  # where the file is mounted
            self.binds.append(f"{real}:{image_path}:ro")
        else:
            link_or_copy(real, host)
        self._staged[src] = image_path
        self.staged[image_path] = str(src)
        return image_path

    def _rewrite(self, ref):
        if ref.kind == "image-path":
            if not resolve_in_root(root=self.root, path=ref.target).exists():
                raise StageError(
                    f"{ref.original} does not exist on this machine nor in the image "
                    f"(looked for {ref.target} in both)",
                    stage="pip",
                )
            return None
        if ref.include is not None:
            staged = shlex.quote(self._stage_file(ref.include))
        else:
            staged = self._stage_path(ref.target)
            if ref.kind == "file-url":
                staged = PurePosixPath(staged).as_uri()
            elif ref.prefix.startswith("-"):
                staged = shlex.quote(staged)
        note = f"  # cotainr-lumi: was {ref.original}"
        return f"{ref.prefix}{staged}{ref.suffix}{note}"
