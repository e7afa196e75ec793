"""
Read the dynamic-linking facts of ELF files with pyelftools.

Only the headers, the dynamic section and the GNU version sections are read
(never symbol tables or debug information); a file without the ELF magic
costs a 4-byte read, and a symlink is never read through (``O_NOFOLLOW``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import functools
import io
from itertools import islice
import logging
import os

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection
from elftools.elf.structs import ELFStructs

from .rootfs import walk_in_root

logger = logging.getLogger(f"cotainr.{__name__}")

#: The first four bytes of every ELF file.
ELF_MAGIC = b"\x7fELF"

#: The verdef flag of the entry that names the library itself (not a version).
_VER_FLG_BASE = 0x1
#: Directories the loader searches after its cache and without LD_LIBRARY_PATH
#: (glibc defaults and the multiarch directories of Debian/Ubuntu), in order.
DEFAULT_LOADER_DIRS = (
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib",
    "/usr/lib",
)


@dataclass(frozen=True)
class ElfInfo:
    """The dynamic-linking facts of one ELF file."""

    path: str
    elfclass: int
    machine: str
    soname: str | None = None
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    version_needs: dict[str, frozenset[str]] = field(default_factory=dict)
    version_defs: frozenset[str] = frozenset()

    def needs_from(self, *, prefix):
        """The versions needed from libraries whose file name starts with `prefix`."""
        return frozenset().union(
            *(v for name, v in self.version_needs.items() if name.startswith(prefix))
        )

    def compatible_with(self, other):
        """Whether two ELF files could be loaded into the same process."""
        return (self.elfclass, self.machine) == (other.elfclass, other.machine)


def _open_fd(path):
    """Open a file read-only without following a symlink in its last component."""
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)


def read_elf_info(*, path):
    """Read the dynamic-linking facts of an ELF file."""
    try:
        fd = _open_fd(path)
    except OSError as e:
        logger.debug("Cannot open %s: %s", path, e)
        return None
    try:
        # The magic is checked on the raw descriptor: most files are not ELF,
        # and a buffered stream would read (and allocate) far more.
        is_elf = os.pread(fd, 4, 0) == ELF_MAGIC
    except OSError:
        is_elf = False
    if not is_elf:
        os.close(fd)
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return _read_open_elf(f, path=os.fspath(path))
    except Exception as e:  # noqa: BLE001 - pyelftools and construct raise a mix
        # of errors (ELFError, StreamError, ValueError ...) for damaged files.
        logger.debug("Cannot read ELF file %s: %s: %s", path, type(e).__name__, e)
        return None


@functools.cache
def _structs(little_endian, elfclass, *advanced):
    """The struct definitions of pyelftools, made once per kind of ELF file."""
    structs = ELFStructs(little_endian=little_endian, elfclass=elfclass)
    structs.create_basic_structs()
    if advanced:
        structs.create_advanced_structs(*advanced)
    return structs


class _ScanELFFile(ELFFile):
    """An :class:`ELFFile` that reuses the struct definitions across files."""

    def __init__(self, stream):  # noqa: D107 - see the class docstring
        self.stream = stream
        self.stream.seek(0, io.SEEK_END)
        self.stream_len = self.stream.tell()
        self._identify_file()
        self.structs = _structs(self.little_endian, self.elfclass)
        self.header = self._parse_elf_header()
        self.structs = _structs(
            self.little_endian,
            self.elfclass,
            self["e_type"],
            self["e_machine"],
            self["e_ident"]["EI_OSABI"],
        )
        self.stream.seek(0)
        self.e_ident_raw = self.stream.read(16)
        self.stream_loader = None


def _open_elf(stream):
    try:
        return _ScanELFFile(stream)
    except AttributeError:  # pragma: no cover - pyelftools internals changed
        stream.seek(0)
        return ELFFile(stream)


def _versions(sections):
    """The versions needed ({library: versions}) and defined (not the library's name)."""
    needs = {}
    defs = set()
    for section in sections:
        if isinstance(section, GNUVerNeedSection):
            for verneed, auxiliaries in section.iter_versions():
                needs.setdefault(verneed.name, set()).update(
                    a.name for a in auxiliaries
                )
        elif isinstance(section, GNUVerDefSection):
            for verdef, auxiliaries in section.iter_versions():
                if not verdef["vd_flags"] & _VER_FLG_BASE:
                    defs.update(aux.name for aux in islice(auxiliaries, 1))
    return {name: frozenset(v) for name, v in needs.items()}, frozenset(defs)


def _read_open_elf(stream, *, path):
    """Parse the header, dynamic and version sections of an open ELF file."""
    elf = _open_elf(stream)
    sections = list(_iter_wanted_sections(elf))
    dynamic = [s for s in sections if isinstance(s, DynamicSection)]
    if not dynamic:
        # No section headers (stripped hard): fall back to the PT_DYNAMIC
        # segment, which has the tags but no version information.
        dynamic = elf.iter_segments(type="PT_DYNAMIC")
    strings = {
        name: [] for name in ("DT_SONAME", "DT_NEEDED", "DT_RPATH", "DT_RUNPATH")
    }
    for tag in (tag for tags in dynamic for tag in tags.iter_tags()):
        if tag.entry.d_tag in strings:
            # pyelftools' DynamicTag keeps DT_SONAME's string as .soname (and so on).
            strings[tag.entry.d_tag].append(getattr(tag, tag.entry.d_tag[3:].lower()))
    needs, defs = _versions(sections)
    return ElfInfo(
        path=path,
        elfclass=elf.elfclass,
        machine=elf["e_machine"],
        soname=next(filter(None, reversed(strings["DT_SONAME"])), None),
        needed=tuple(strings["DT_NEEDED"]),
        rpath=_split_paths(strings["DT_RPATH"]),
        runpath=_split_paths(strings["DT_RUNPATH"]),
        version_needs=needs,
        version_defs=defs,
    )


#: The section types read; all others (symbol and hash tables ...) are skipped.
_WANTED_SECTION_TYPES = frozenset({"SHT_DYNAMIC", "SHT_GNU_verneed", "SHT_GNU_verdef"})
#: Their numeric values (ELF gABI and the GNU extensions).
_WANTED_SH_TYPES = frozenset({6, 0x6FFFFFFD, 0x6FFFFFFE})


def _iter_wanted_sections(elf):
    """Yield only the dynamic and GNU version sections of an ELF file."""
    count = elf["e_shnum"]
    entsize = elf["e_shentsize"]
    offset = elf["e_shoff"]
    if not offset or not count or entsize < 8:
        if offset:  # extended numbering (e_shnum == 0): let pyelftools count
            for section in elf.iter_sections():
                if section["sh_type"] in _WANTED_SECTION_TYPES:
                    yield section
        return
    elf.stream.seek(offset)
    table = elf.stream.read(count * entsize)
    order = "little" if elf.little_endian else "big"
    for index in range(min(count, len(table) // entsize)):
        start = index * entsize + 4
        if int.from_bytes(table[start : start + 4], order) in _WANTED_SH_TYPES:
            yield elf.get_section(index)


def _split_paths(values):
    return tuple(p for value in values for p in value.split(":") if p)


def scan_elf_files(*, root, path, skip=()):
    """Read every ELF regular file below an image directory (links not followed)."""
    for entry in walk_in_root(root=root, path=path):
        if entry.kind == "file" and entry.path not in skip:
            info = read_elf_info(path=entry.path)
            if info is not None:
                yield info
