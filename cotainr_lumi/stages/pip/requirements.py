r"""
Requirement files of pip steps: local references, checks and staging.

A requirements file may reference other files relative to itself: included
requirement (``-r``) and constraint (``-c``) files, local wheels and sdists,
project directories, ``file:`` URLs and ``--find-links`` directories. Inside
the container none of these host paths exist, so before a step runs

- every requirement/constraint file is copied, with its references rewritten,
  to ``/opt/cotainr-lumi/pip/stepN/`` (kept in the image, for provenance);
- every referenced wheel, sdist or directory is staged (hard-linked or copied)
  into a temporary directory inside the sandbox that is removed before the
  image is built.

Line numbers are kept, so pip's "(line N)" messages point at the user's file
too. Unsupportable references are rejected up front with file and line.

The line format follows pip's: ``\\`` continues a line, ``#`` after
whitespace starts a comment, a line starting with ``-`` holds options, other
lines hold one requirement (tokens up to the first ``-``-option) followed by
per-requirement options (``--hash``, ``--config-settings`` ...). Named
requirements are checked with :mod:`packaging`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
import os
from pathlib import Path, PurePosixPath
import re
import shlex
import shutil
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement

from ...engine.rootfs import image_path_of, resolve_in_root, write_file_in_root
from ...errors import InputError, StageError

logger = logging.getLogger(f"cotainr.{__name__}")

ARCHIVE_EXTENSIONS = (
    ".whl",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tar",
    ".zip",
)

_COMMENT_RE = re.compile(r"(^|\s+)#.*$")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_VCS_SCHEMES = ("git+", "hg+", "svn+", "bzr+")
_COMMIT_RE = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})$")
_VERSION_TAG_RE = re.compile(r"^v?\d+(\.\d+)+([.+-].*)?$")
_FILE_OPTIONS = {
    "-r": "requirements",
    "--requirement": "requirements",
    "-c": "constraints",
    "--constraint": "constraints",
    "-f": "find-links",
    "--find-links": "find-links",
}
_EDITABLE = ("-e", "--editable")
#: How deep ``-r``/``-c`` files may include each other (a chain of this many
#: files is already far beyond any real project).
MAX_INCLUDE_DEPTH = 100


@dataclass
class ReqLine:
    """One logical line that references something local."""

    start: int
    end: int
    kind: str
    target: Path
    option: str = ""
    prefix: str = ""
    suffix: str = ""
    original: str = ""
    include: ReqFile | None = None


@dataclass
class ReqFile:
    """A scanned requirements or constraints file."""

    path: Path | None
    display: str
    lines: list[str]
    refs: list[ReqLine] = field(default_factory=list)

    def walk(self):
        """Yield this file and every included file, depth first (each once)."""
        seen = set()
        stack = [self]
        while stack:
            current = stack.pop(0)
            if id(current) in seen:
                continue
            seen.add(id(current))
            yield current
            stack[0:0] = [r.include for r in current.refs if r.include is not None]


@dataclass
class StepScan:
    """The scanned inputs of one step."""

    step: object
    files: list[ReqFile]
    moving_refs: list[str] = field(default_factory=list)


@dataclass
class StagedStep:
    """What :func:`stage_step` put into the sandbox."""

    requirement_files: list[str] = field(default_factory=list)
    kept_files: dict[str, str] = field(default_factory=dict)
    staged: dict[str, str] = field(default_factory=dict)


def _logical_lines(lines):
    """Yield (start, end, text) for each logical line (comments removed)."""
    start = None
    parts = []
    for i, line in enumerate(lines):
        if start is None:
            start = i
        stripped = line.rstrip("\n")
        if stripped.endswith("\\") and not _COMMENT_RE.search(stripped[:-1]):
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        text = _COMMENT_RE.sub("", "".join(parts)).strip()
        yield start, i, text
        start, parts = None, []
    if parts:
        yield start, len(lines) - 1, _COMMENT_RE.sub("", "".join(parts)).strip()


def _is_archive(name):
    return name.lower().endswith(ARCHIVE_EXTENSIONS)


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


def _error(where, message):
    return InputError(f"{where}: {message}")


def _split_url(url, *, where):
    """:func:`urllib.parse.urlsplit`, with an InputError for a malformed URL."""
    try:
        # A VCS URL (git+https://...) is split without its scheme prefix.
        return urlsplit(url.split("+", 1)[1] if "+" in url.split(":", 1)[0] else url)
    except ValueError as e:
        raise _error(
            where, f"{url} is not a valid URL ({e}); check its brackets and host"
        ) from None


def _split_options(tokens):
    """Split option tokens into (option, value, rest) for the first option."""
    first = tokens[0]
    if first.startswith("--") and "=" in first:
        option, value = first.split("=", 1)
        return option, value, tokens[1:]
    for short in ("-r", "-c", "-f", "-e", "-i"):
        if first.startswith(short) and len(first) > 2 and not first.startswith("--"):
            return short, first[2:], tokens[1:]
    value = tokens[1] if len(tokens) > 1 else None
    return first, value, tokens[2:]


class _VcsPins:
    """Collect VCS requirements that do not pin one revision."""

    def __init__(self):
        self.moving_refs: list[str] = []

    def note(self, url, *, where):
        """Record `url` if it does not pin a revision."""
        reason = moving_vcs_ref(url)
        if reason:
            self.moving_refs.append(
                f"{where}: {url}: {reason}; pin a commit (@<sha>) or a tag "
                "for a reproducible image"
            )


@dataclass
class _Target:
    kind: str  # "host" or "image-path"
    path: Path


def _local_target(value, *, base, where):
    """Where a local reference points: on this machine or (absolute) in the image."""
    path = Path(value)
    if path.is_absolute():
        if os.path.lexists(path):
            return _Target("host", Path(os.path.abspath(path)))
        return _Target("image-path", Path(os.path.normpath(path)))
    resolved = Path(os.path.abspath(base / path))
    if not os.path.lexists(resolved):
        raise _error(where, f"{value}: {resolved} does not exist")
    return _Target("host", resolved)


def _check_installable(target, *, where, original):
    """Check that a host target is a wheel, an sdist or a project directory."""
    if target.kind == "image-path":
        return
    path = target.path
    if path.is_dir():
        if not ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
            raise _error(
                where,
                f"{original}: the directory {path} is not a Python project "
                "(no pyproject.toml or setup.py)",
            )
    elif path.is_file():
        if not _is_archive(path.name):
            raise _error(
                where,
                f"{original}: {path} is neither a wheel nor an sdist "
                f"(expected one of {', '.join(ARCHIVE_EXTENSIONS)})",
            )
    else:
        raise _error(where, f"{original}: {path} is not a file or directory")


class _LineParser:
    """Turn one logical line into a :class:`ReqLine` (or None), checking it."""

    def __init__(self, *, include, vcs):
        self.include = include
        self.vcs = vcs

    def parse(self, text, start, end, *, base, where):
        """The reference on one logical line, or None."""
        if text.startswith("-"):
            return self.option_line(text, start, end, base=base, where=where)
        return self.requirement_line(text, start, end, base=base, where=where)

    def option_line(self, text, start, end, *, base, where):
        """An option line (``-r``, ``-c``, ``-f``; editable installs rejected)."""
        try:
            tokens = shlex.split(text)
        except ValueError as e:
            raise _error(where, f"cannot split the options ({e})") from e
        option, value, rest = _split_options(tokens)
        if option in _EDITABLE:
            raise _error(
                where,
                f"editable installs ({option} {value or ''}) are not supported in "
                "an image build: the source would not be in the image. Drop "
                f"'{option}' to install a copy of the project instead.",
            )
        kind = _FILE_OPTIONS.get(option)
        if kind is None:
            return None
        if not value:
            raise _error(where, f"{option} needs a value")
        if _URL_RE.match(value) and not value.startswith("file:"):
            return None  # a remote file or index: pip fetches it
        if "${" in value:
            raise _error(
                where,
                f"{value!r}: local paths with ${{VARIABLES}} cannot be staged "
                "into the container; write the path out",
            )
        target = _local_target(value, base=base, where=where)
        suffix = " ".join(shlex.quote(t) for t in rest)
        if kind == "find-links":
            if target.kind == "image-path":
                return ReqLine(
                    start, end, "image-path", target.path, option, "", suffix, value
                )
            if not target.path.exists():
                raise _error(where, f"{option} {value}: {target.path} does not exist")
            return ReqLine(
                start, end, "find-links", target.path, option, "", suffix, value
            )
        if target.kind == "image-path":
            raise _error(
                where,
                f"{option} {value}: {target.path} does not exist on this machine "
                "(included files must be on this machine)",
            )
        if not target.path.is_file():
            raise _error(where, f"{option} {value}: {target.path} is not a file")
        include = self.include(target.path, where=where)
        return ReqLine(
            start, end, kind, target.path, option, "", suffix, value, include
        )

    def requirement_line(self, text, start, end, *, base, where):
        """A requirement line: a name, a URL, a ``file:`` URL or a local path."""
        tokens = text.split()
        n = next((i for i, t in enumerate(tokens) if t.startswith("-")), len(tokens))
        req_text = " ".join(tokens[:n])
        suffix = " ".join(tokens[n:])
        if not req_text:
            raise _error(where, f"no requirement before the options in {text!r}")
        span = {"start": start, "end": end, "base": base, "where": where}
        if req_text.startswith("file:"):
            return self.file_url_line(req_text, suffix, **span)
        if _URL_RE.match(req_text):
            url = req_text.partition(";")[0].strip()
            _split_url(url, where=where)
            self.vcs.note(url, where=where)
            return None  # remote URL (https://..., git+https://...)
        if "@" in req_text and not _looks_like_path(req_text.split("@", 1)[0].strip()):
            return self.direct_reference_line(req_text, suffix, **span)
        path_part, sep, markers = req_text.partition(";")
        m = re.match(r"^(.*?)(\[[^\]]*\])?$", path_part.strip())
        bare, extras = m.group(1), m.group(2) or ""
        if _looks_like_path(bare) or _is_archive(bare):
            if "${" in bare:
                raise _error(
                    where,
                    f"{bare!r}: local paths with ${{VARIABLES}} cannot be staged "
                    "into the container; write the path out",
                )
            target = _local_target(bare, base=base, where=where)
            _check_installable(target, where=where, original=bare)
            tail = _tail(markers if sep else None, suffix)
            kind = "path" if target.kind != "image-path" else "image-path"
            return ReqLine(start, end, kind, target.path, "", "", extras + tail, bare)
        try:
            Requirement(req_text)
        except InvalidRequirement as e:
            raise _error(where, f"invalid requirement {req_text!r}: {e}") from e
        return None

    def file_url_line(self, req_text, suffix, *, start, end, base, where):
        """A ``file:`` URL requirement (``file:///src/pkg ; markers``)."""
        url, sep, markers = req_text.partition("; ")
        path = _file_url_path(url.strip(), where=where)
        target = _local_target(str(path), base=base, where=where)
        _check_installable(target, where=where, original=url)
        tail = _tail(markers if sep else None, suffix)
        kind = "file-url" if target.kind != "image-path" else "image-path"
        return ReqLine(start, end, kind, target.path, "", "", tail, url.strip())

    def direct_reference_line(self, req_text, suffix, *, start, end, base, where):
        """A PEP 508 direct reference (``name @ URL``); only ``file:`` is staged."""
        try:
            req = Requirement(req_text)
        except InvalidRequirement as e:
            raise _error(where, f"invalid requirement {req_text!r}: {e}") from e
        if req.url and req.url.startswith("file:"):
            path = _file_url_path(req.url, where=where)
            target = _local_target(str(path), base=base, where=where)
            _check_installable(target, where=where, original=req.url)
            head, _, tail = req_text.partition(req.url)
            return ReqLine(
                start,
                end,
                "file-url" if target.kind != "image-path" else "image-path",
                target.path,
                "",
                head,
                tail + (f" {suffix}" if suffix else ""),
                req.url,
            )
        if req.url:
            _split_url(req.url, where=where)
            self.vcs.note(req.url, where=where)
        return None


def _tail(markers, suffix):
    """What follows a staged path: `` ; markers`` (None: none) and the options."""
    return (f" ; {markers.strip()}" if markers is not None else "") + (
        f" {suffix}" if suffix else ""
    )


class _FileScanner:
    """Read requirement files, each once, following includes and detecting cycles."""

    def __init__(self):
        self.cache: dict[Path, ReqFile] = {}
        self.active: list[Path] = []
        self.vcs = _VcsPins()
        self.parser = _LineParser(include=self.scan_path, vcs=self.vcs)

    def scan_path(self, path, *, where):
        """Read and scan one file (and what it includes)."""
        path = Path(os.path.abspath(path))
        if path in self.active:
            cycle = " -> ".join(str(p) for p in (*self.active, path))
            raise _error(
                where, f"requirement files include each other in a cycle: {cycle}"
            )
        if path in self.cache:
            return self.cache[path]
        if len(self.active) > MAX_INCLUDE_DEPTH:
            raise _error(
                where,
                "requirement files include each other more than "
                f"{MAX_INCLUDE_DEPTH} levels deep (from {self.active[0]}); "
                "flatten the chain of -r/-c files",
            )
        try:
            text = path.read_text()
        except OSError as e:
            raise _error(where, f"cannot read {path}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise _error(
                where, f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8"
            ) from e
        rf = ReqFile(path=path, display=str(path), lines=text.splitlines(keepends=True))
        self.active.append(path)
        try:
            self.scan_lines(
                rf, base=path.parent, where=lambda i, s: f"{rf.display}, line {s + 1}"
            )
        finally:
            self.active.pop()
        self.cache[path] = rf
        return rf

    def scan_lines(self, rf, *, base, where):
        """Scan `rf`'s lines; ``where(i, start)`` names the i-th logical line."""
        for i, (start, end, text) in enumerate(_logical_lines(rf.lines)):
            if not text:
                continue
            ref = self.parser.parse(text, start, end, base=base, where=where(i, start))
            if ref is not None:
                rf.refs.append(ref)


def _file_url_path(url, *, where):
    parts = _split_url(url, where=where)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise _error(
            where,
            f"{url}: only absolute file: URLs (file:///path) can be used; "
            "write a relative path without file: instead",
        )
    return Path(unquote(parts.path))


def scan_step(*, step):
    """Scan a step's requirement files (recursively) and check their references."""
    scanner = _FileScanner()
    files = []
    for path in step.requirements:
        if not path.is_file():
            raise InputError(
                f"{step.title}: the requirements file {path} does not exist."
            )
        files.append(scanner.scan_path(path, where=step.title))
    if step.packages:
        rf = ReqFile(
            path=None,
            display=f"{step.title}, packages",
            lines=[p.strip() + "\n" for p in step.packages],
        )
        scanner.scan_lines(
            rf,
            base=step.base_dir,
            where=lambda i, s: f"{step.title}, packages[{i + 1}]",
        )
        files.append(rf)
    return StepScan(step=step, files=files, moving_refs=list(scanner.vcs.moving_refs))


def local_inputs(*, scan):
    """The host files and directories a scanned step stages, for plans."""
    result = []
    for top in scan.files:
        for rf in top.walk():
            for ref in rf.refs:
                if ref.kind == "image-path":
                    result.append(f"image:{ref.target}")
                elif ref.kind not in ("requirements", "constraints"):
                    result.append(str(ref.target))
    return result


def _link_or_copy(src, dst):
    """Hard-link a file (fast, same file system) or copy it."""
    # os.link() does not follow a symlink on Linux: link its target.
    src = os.path.realpath(src)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


#: The most a local directory of a requirement may hold to be staged.
MAX_TREE_FILES = 20_000


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


def _stage_tree(src, dst):
    """Copy a directory (builds write into project directories: no links)."""
    shutil.copytree(src, dst, symlinks=True)


class _Stager:
    def __init__(self, *, root, keep_dir, staging_dir):
        self.root = Path(root)
        self.keep_dir = PurePosixPath(keep_dir)
        self.staging_dir = PurePosixPath(staging_dir)
        self.names: dict[int, str] = {}
        self.used_names = set()
        self.staged: dict[Path, str] = {}
        self.result = StagedStep()
        self.counter = 0

    def kept_name(self, rf):
        if id(rf) in self.names:
            return self.names[id(rf)]
        stem = rf.path.name if rf.path is not None else "packages.txt"
        name, n = stem, 1
        while name in self.used_names:
            n += 1
            base, dot, ext = stem.rpartition(".")
            name = f"{base}-{n}.{ext}" if dot and base else f"{stem}-{n}"
        self.used_names.add(name)
        self.names[id(rf)] = name
        return name

    def stage_file(self, rf):
        name = self.kept_name(rf)
        image_path = str(self.keep_dir / name)
        if image_path in self.result.kept_files:
            return image_path
        self.result.kept_files[image_path] = rf.display
        lines = list(rf.lines)
        for ref in rf.refs:
            new = self.rewrite(ref)
            if new is None:
                continue
            newline = "\n" if lines[ref.end].endswith("\n") else ""
            lines[ref.start] = new + newline
            for i in range(ref.start + 1, ref.end + 1):
                lines[i] = "\n"
        write_file_in_root(root=self.root, path=image_path, content="".join(lines))
        return image_path

    def stage_path(self, src, *, is_dir):
        if src in self.staged:
            return self.staged[src]
        self.counter += 1
        image_path = str(self.staging_dir / str(self.counter) / src.name)
        host = resolve_in_root(root=self.root, path=image_path)
        if is_dir:
            _check_tree_to_stage(src, root=self.root)
        host.parent.mkdir(parents=True, exist_ok=True)
        if is_dir:
            _stage_tree(src, host)
        else:
            _link_or_copy(src, host)
        self.staged[src] = image_path
        self.result.staged[image_path] = str(src)
        return image_path

    def rewrite(self, ref):
        note = f"  # cotainr-lumi: was {ref.original}"
        if ref.kind == "image-path":
            host = resolve_in_root(root=self.root, path=ref.target)
            if not host.exists():
                raise StageError(
                    f"{ref.original} does not exist on this machine nor in the image "
                    f"(looked for {ref.target} in both)",
                    stage="pip",
                )
            return None
        if ref.kind in ("requirements", "constraints"):
            staged = self.stage_file(ref.include)
            text = f"{ref.option} {shlex.quote(staged)}"
        elif ref.kind == "find-links":
            staged = self.stage_path(ref.target, is_dir=ref.target.is_dir())
            text = f"{ref.option} {shlex.quote(staged)}"
        else:
            staged = self.stage_path(ref.target, is_dir=ref.target.is_dir())
            if ref.kind == "file-url":
                staged = PurePosixPath(staged).as_uri()
            text = f"{ref.prefix}{staged}"
        if ref.suffix:
            text += (
                ref.suffix if ref.suffix.startswith((" ", "[")) else f" {ref.suffix}"
            )
        return text + note


def stage_step(*, scan, root, keep_dir, staging_dir):
    """Stage a scanned step into the sandbox."""
    stager = _Stager(root=root, keep_dir=keep_dir, staging_dir=staging_dir)
    for rf in scan.files:
        stager.result.requirement_files.append(stager.stage_file(rf))
    return stager.result


__all__ = [
    "ReqFile",
    "ReqLine",
    "StagedStep",
    "StepScan",
    "image_path_of",
    "local_inputs",
    "scan_step",
    "stage_step",
]
