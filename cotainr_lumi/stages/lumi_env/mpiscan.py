"""
Find the MPI of an image statically (pyelftools, no container run).

The MPI libraries in the environment's ``lib/`` and the loader's directories;
whether they speak CXI (need ``libcxi.so.1``, or load a libfabric that does);
the ELF files that need them; and the pins: users whose ``DT_RPATH`` (or the
interpreter's) holds a ``libmpi.so.12``, searched before ``LD_LIBRARY_PATH``,
so no run-time setting can swap that library.
"""

from dataclasses import asdict, dataclass, field
import glob
import os
from pathlib import PurePosixPath
import re

from ...engine.elfinfo import DEFAULT_LOADER_DIRS, read_elf_info, scan_elf_files
from ...engine.rootfs import image_path_of, resolve_or_none

#: The MPICH ABI library (MPICH >= 3.1, Cray MPICH's lib-abi-mpich, Intel MPI).
MPICH_ABI = "libmpi.so.12"
#: Open MPI's library: another ABI, which Cray MPICH cannot replace.
OPEN_MPI = "libmpi.so.40"
#: The libfabric an MPICH ``ch4:ofi`` loads, and the CXI library of its
#: Slingshot provider.
LIBFABRIC = "libfabric.so.1"
LIBCXI = "libcxi.so.1"
#: At most this many users are kept in the record.
MAX_USERS = 50


@dataclass(frozen=True)
class MpiLibrary:
    """One MPI library in the image."""

    path: str
    real: str
    soname: str
    where: str
    libfabric: str = None
    cxi: bool = False


@dataclass(frozen=True)
class Pin:
    """A user whose ``DT_RPATH`` fixes the MPI library it loads."""

    user: str
    entry: str
    library: str
    via: str
    distribution: str = None


@dataclass(frozen=True)
class MpiUser:
    """One ELF file that needs an MPI library."""

    path: str
    needs: str
    rpath: tuple = ()
    runpath: tuple = ()
    distribution: str = None
    preloaded: bool = False


@dataclass
class MpiScan:
    """What was found."""

    libraries: list = field(default_factory=list)
    users: list = field(default_factory=list)
    pins: list = field(default_factory=list)
    mpi4py: dict = None

    @property
    def mpich(self):
        """The MPICH-ABI libraries."""
        return [lib for lib in self.libraries if lib.soname == MPICH_ABI]

    @property
    def open_mpi(self):
        """The Open MPI libraries (paths; mpi4py's wheel has users of both ABIs)."""
        return [lib.path for lib in self.libraries if lib.soname == OPEN_MPI]

    @property
    def has_mpich(self):
        """Whether the image has an MPICH-ABI library or a user of one."""
        return bool(self.mpich) or any(u.needs == MPICH_ABI for u in self.users)

    def to_dict(self):
        """JSON-serialisable form (the users capped at :data:`MAX_USERS`)."""
        return {
            "libraries": [asdict(lib) for lib in self.libraries],
            "users": [asdict(u) for u in self.users[:MAX_USERS]],
            "users-total": len(self.users),
            "pins": [asdict(p) for p in self.pins],
            "mpi4py": self.mpi4py,
        }


def _included_dirs(*, root, conf, pattern, seen):
    """The directories of the files an ``include`` line of `conf` names."""
    # A relative pattern is relative to the file's directory.
    pattern = PurePosixPath(conf).parent / pattern
    parent = resolve_or_none(root=root, path=str(pattern.parent))
    if parent is None or not parent.is_dir():
        return []
    dirs = []
    for match in sorted(glob.glob(str(parent / pattern.name))):
        image = str(pattern.parent / os.path.basename(match))
        dirs += _conf_dirs(root=root, conf=image, seen=seen)
    return dirs


def _conf_dirs(*, root, conf, seen):
    """The directories an ``ld.so.conf`` file names (``include`` followed)."""
    if conf in seen:
        return []
    seen.add(conf)
    host = resolve_or_none(root=root, path=conf)
    try:
        lines = host.read_text(errors="replace").splitlines() if host else []
    except OSError:
        return []
    dirs = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include"):
            pattern = line[len("include") :].strip()
            dirs += _included_dirs(root=root, conf=conf, pattern=pattern, seen=seen)
        elif line.startswith("/"):
            dirs.append(line.rstrip("/") or "/")
    return dirs


def library_dirs(*, root):
    """The loader's directories in the image."""
    dirs = _conf_dirs(root=root, conf="/etc/ld.so.conf", seen=set())
    return list(dict.fromkeys([*dirs, *DEFAULT_LOADER_DIRS]))


def _find(*, root, name, dirs):
    """The first ``DIR/name`` of `dirs` that is a file in the image (image path)."""
    for directory in dirs:
        path = f"{directory.rstrip('/')}/{name}"
        host = resolve_or_none(root=root, path=path)
        if host is not None and host.is_file():
            return path
    return None


def image_library(*, root, name):
    """The image path of library `name` in the loader's directories (or None)."""
    return _find(root=root, name=name, dirs=library_dirs(root=root))


def _expand(entry, *, origin):
    """A search path entry with ``$ORIGIN`` expanded (None for other tokens)."""
    text = entry.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", origin)
    if "$" in text or not text.startswith("/"):
        return None
    return os.path.normpath(text)


def _real_image_path(*, root, path):
    """The image path of `path` with its links resolved."""
    host = resolve_or_none(root=root, path=path)
    return path if host is None else str(image_path_of(root=root, host_path=host))


def find_needed(*, root, name, info, origin, ld_path=()):
    """The image path where the loader finds `name` for `info` in `origin` (or None)."""
    own = [*(() if info.runpath else info.rpath), *ld_path, *info.runpath]
    search = [d for p in own if p and (d := _expand(p, origin=origin))]
    return _find(root=root, name=name, dirs=search + library_dirs(root=root))


def _speaks_cxi(*, root, library_path, info):
    """(libfabric image path or None, whether the library speaks CXI)."""
    if LIBCXI in info.needed:
        return None, True
    if LIBFABRIC not in info.needed:
        return None, False
    origin = str(PurePosixPath(library_path).parent)
    fabric = find_needed(root=root, name=LIBFABRIC, info=info, origin=origin)
    if fabric is None:
        return None, False
    fabric_info = read_elf_info(path=resolve_or_none(root=root, path=fabric))  # a file
    providers = resolve_or_none(
        root=root, path=f"{PurePosixPath(fabric).parent}/libfabric"
    )
    has_provider = providers is not None and glob.glob(str(providers / "libcxi-fi*.so"))
    return fabric, bool(has_provider or (fabric_info and LIBCXI in fabric_info.needed))


def _libraries(*, root, prefixes):
    """The MPI libraries of the image, the env's first."""
    places = [(f"{p.rstrip('/')}/lib", "env") for p in prefixes]
    places += [(d, "system") for d in library_dirs(root=root)]
    found, seen = [], set()
    for directory, where in places:
        for name in (MPICH_ABI, OPEN_MPI):
            path = _find(root=root, name=name, dirs=[directory])
            real = path and _real_image_path(root=root, path=path)
            if real is None or real in seen:
                continue
            seen.add(real)
            info = read_elf_info(path=resolve_or_none(root=root, path=real))
            if info is None:
                continue
            cxi = _speaks_cxi(root=root, library_path=real, info=info)
            found.append(MpiLibrary(path, real, info.soname or name, where, *cxi))
    return found


def _distributions(*, root, site_dirs):
    """Image path of each installed file -> ``name version`` (from RECORD)."""
    owners = {}
    for site in site_dirs:
        host_site = resolve_or_none(root=root, path=site)
        if host_site is None or not host_site.is_dir():
            continue
        for record in sorted(host_site.glob("*.dist-info/RECORD")):
            name, _, version = record.parent.name[: -len(".dist-info")].partition("-")
            try:
                lines = record.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for rel in filter(None, (line.split(",", 1)[0] for line in lines)):
                image = os.path.normpath(os.path.join(site, rel))
                owners.setdefault(image, f"{name} {version}".strip())
    return owners


def _mpi4py(*, root, site_dirs):
    """mpi4py's version, directory and whether it loads its library itself."""
    for site in site_dirs:
        host = resolve_or_none(root=root, path=f"{site.rstrip('/')}/mpi4py/__init__.py")
        if host is None or not host.is_file():
            continue
        text = host.read_text(errors="replace")
        match = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
        return {
            "version": match.group(1) if match else None,
            "dir": f"{site.rstrip('/')}/mpi4py",
            "abi_aware": host.with_name("_mpiabi.py").is_file(),
        }
    return None


def _pin(*, root, user, interpreter):
    """The pin of one :class:`MpiUser` of ``libmpi.so.12`` (None: not pinned)."""
    if user.runpath:
        return None
    searches = [(user.rpath, str(PurePosixPath(user.path).parent), "its DT_RPATH")]
    exe_path, exe = interpreter
    if exe and exe.rpath and not exe.runpath:
        origin = str(PurePosixPath(exe_path).parent)
        searches.append((exe.rpath, origin, f"the DT_RPATH of {exe_path}"))
    # The loader takes the first directory that has it, in this order.
    for entries, origin, via in searches:
        for entry in entries:
            directory = _expand(entry, origin=origin)
            found = directory and _find(root=root, name=MPICH_ABI, dirs=[directory])
            if found:
                return Pin(user.path, entry, found, via, user.distribution)
    return None


def _mpi_needed(info):
    """The MPI library an ELF file needs (None: none)."""
    for name in (MPICH_ABI, OPEN_MPI):
        if name in info.needed:
            return name
    return None


def _interpreter(*, root, python):
    """(image path, ELF info) of the env's Python: its DT_RPATH pins too."""
    if not python:
        return None, None
    exe = _real_image_path(root=root, path=python)
    return exe, read_elf_info(path=resolve_or_none(root=root, path=exe))


def _users(*, root, prefixes, skip, owners, preloading):
    """The ELF files below `prefixes` that need an MPI library (`skip` aside)."""
    users = []
    seen = set(skip)
    for prefix in prefixes:
        for info in scan_elf_files(root=root, path=prefix):
            needs = _mpi_needed(info)
            path = str(image_path_of(root=root, host_path=info.path))
            if needs is None or path in seen:
                continue
            seen.add(path)
            preloaded = bool(preloading and path.startswith(preloading))
            owner = owners.get(path)
            users.append(
                MpiUser(path, needs, info.rpath, info.runpath, owner, preloaded)
            )
    return users


def scan_mpi(*, root, prefixes, site_dirs=(), python=None):
    """Find the MPI of an image."""
    scan = MpiScan(libraries=_libraries(root=root, prefixes=prefixes))
    scan.mpi4py = _mpi4py(root=root, site_dirs=site_dirs)
    # mpi4py 4 loads its library itself (MPI4PY_LIBMPI): its users are not pinned.
    preloading = None
    if scan.mpi4py and scan.mpi4py["abi_aware"]:
        preloading = scan.mpi4py["dir"] + "/"
    scan.users = _users(
        root=root,
        prefixes=prefixes,
        skip={lib.real for lib in scan.libraries},
        owners=_distributions(root=root, site_dirs=site_dirs),
        preloading=preloading,
    )
    interpreter = _interpreter(root=root, python=python)
    for user in scan.users:
        if user.needs != MPICH_ABI or user.preloaded:
            continue
        pin = _pin(root=root, user=user, interpreter=interpreter)
        if pin:
            scan.pins.append(pin)
    return scan
