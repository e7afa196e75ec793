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


class ImageFiles:
    """
    The files of one image, read statically (`root`: its host directory).

    ``library_dirs`` are the loader's directories: those ``/etc/ld.so.conf``
    names (``include`` followed), then the default ones.
    """

    def __init__(self, root):
        self.root = root
        dirs = self._conf_dirs("/etc/ld.so.conf", seen=set())
        self.library_dirs = list(dict.fromkeys([*dirs, *DEFAULT_LOADER_DIRS]))

    def host(self, path):
        """The host path of image path `path` (None for a symlink loop)."""
        return resolve_or_none(root=self.root, path=path)

    def real(self, path):
        """The image path of `path` with its links resolved."""
        host = self.host(path)
        return (
            path if host is None else str(image_path_of(root=self.root, host_path=host))
        )

    def elf(self, path):
        """:func:`read_elf_info` of image path `path`."""
        return read_elf_info(path=self.host(path))

    def find(self, name, dirs):
        """The first ``DIR/name`` of `dirs` that is a file in the image (image path)."""
        for directory in dirs:
            path = f"{directory.rstrip('/')}/{name}"
            host = self.host(path)
            if host is not None and host.is_file():
                return path
        return None

    def needed(self, name, info, origin, ld_path=()):
        """Where the loader finds `name` for `info` in `origin` (image path or None)."""
        own = [*(() if info.runpath else info.rpath), *ld_path, *info.runpath]
        search = [d for p in own if p and (d := _expand(p, origin))]
        return self.find(name, search + self.library_dirs)

    def _conf_dirs(self, conf, seen):
        """The directories an ``ld.so.conf`` file names (``include`` followed)."""
        host = self.host(conf)
        if conf in seen or host is None:
            return []
        seen.add(conf)
        try:
            lines = host.read_text(errors="replace").splitlines()
        except OSError:
            return []
        dirs = []
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if line.startswith("/"):
                dirs.append(line.rstrip("/") or "/")
            elif line.startswith("include"):
                # A relative pattern is relative to the file's directory.
                pattern = PurePosixPath(conf).parent / line[len("include") :].strip()
                parent = self.host(str(pattern.parent))
                matches = glob.glob(f"{parent}/{pattern.name}") if parent else []
                for match in sorted(matches):
                    included = pattern.parent / os.path.basename(match)
                    dirs += self._conf_dirs(str(included), seen)
        return dirs


def _expand(entry, origin):
    """A search path entry with ``$ORIGIN`` expanded (None for other tokens)."""
    text = entry.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", origin)
    if "$" in text or not text.startswith("/"):
        return None
    return os.path.normpath(text)


def _speaks_cxi(image, library_path, info):
    """(libfabric image path or None, whether the library speaks CXI)."""
    if LIBCXI in info.needed:
        return None, True
    if LIBFABRIC not in info.needed:
        return None, False
    origin = os.path.dirname(library_path)
    fabric = image.needed(LIBFABRIC, info, origin)
    if fabric is None:
        return None, False
    fabric_info = image.elf(fabric)  # a file
    providers = image.host(f"{os.path.dirname(fabric)}/libfabric")
    has_provider = providers is not None and glob.glob(str(providers / "libcxi-fi*.so"))
    return fabric, bool(has_provider or (fabric_info and LIBCXI in fabric_info.needed))


def _libraries(image, prefixes):
    """The MPI libraries of the image, the env's first."""
    places = [(f"{p.rstrip('/')}/lib", "env") for p in prefixes]
    places += [(d, "system") for d in image.library_dirs]
    found = {}
    for directory, where in places:
        for name in (MPICH_ABI, OPEN_MPI):
            path = image.find(name, [directory])
            real = path and image.real(path)
            if real is None or real in found:
                continue
            info = image.elf(real)
            if info is None:
                continue
            cxi = _speaks_cxi(image, real, info)
            found[real] = MpiLibrary(path, real, info.soname or name, where, *cxi)
    return list(found.values())


def _distributions(image, site_dirs):
    """Image path of each installed file -> ``name version`` (from RECORD)."""
    owners = {}
    for site in site_dirs:
        host_site = image.host(site)
        records = host_site.glob("*.dist-info/RECORD") if host_site else []
        for record in sorted(records):
            name, _, version = record.parent.stem.partition("-")
            try:
                lines = record.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for rel in filter(None, (line.split(",", 1)[0] for line in lines)):
                image_path = os.path.normpath(os.path.join(site, rel))
                owners.setdefault(image_path, f"{name} {version}".strip())
    return owners


def _mpi4py(image, site_dirs):
    """mpi4py's version, directory and whether it loads its library itself."""
    for site in site_dirs:
        directory = f"{site.rstrip('/')}/mpi4py"
        host = image.host(f"{directory}/__init__.py")
        if host is None or not host.is_file():
            continue
        text = host.read_text(errors="replace")
        match = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
        return {
            "version": match.group(1) if match else None,
            "dir": directory,
            "abi_aware": host.with_name("_mpiabi.py").is_file(),
        }
    return None


def _interpreter_search(image, python):
    """The DT_RPATH of the env's Python, which pins its extensions' MPI too."""
    exe = python and image.real(python)
    info = exe and image.elf(exe)
    if not info or not info.rpath or info.runpath:
        return []
    return [(info.rpath, os.path.dirname(exe), f"the DT_RPATH of {exe}")]


def _pin(image, user, search):
    """The pin of one :class:`MpiUser` (None: not pinned)."""
    # mpi4py 4 loads its library itself (MPI4PY_LIBMPI): its users are not pinned.
    if user.needs != MPICH_ABI or user.preloaded or user.runpath:
        return None
    own = (user.rpath, os.path.dirname(user.path), "its DT_RPATH")
    # The loader takes the first directory that has it, in this order.
    for entries, origin, via in [own, *search]:
        for entry in entries:
            directory = _expand(entry, origin)
            found = directory and image.find(MPICH_ABI, [directory])
            if found:
                return Pin(user.path, entry, found, via, user.distribution)
    return None


def _users(image, prefixes, *, skip, owners, preloading):
    """The ELF files below `prefixes` that need an MPI library (`skip` aside)."""
    users = {}
    for prefix in prefixes:
        for info in scan_elf_files(root=image.root, path=prefix):
            needs = [n for n in (MPICH_ABI, OPEN_MPI) if n in info.needed]
            path = str(image_path_of(root=image.root, host_path=info.path))
            if needs and path not in skip and path not in users:
                preloaded = bool(preloading and path.startswith(preloading))
                owner = owners.get(path)
                user = MpiUser(
                    path, needs[0], info.rpath, info.runpath, owner, preloaded
                )
                users[path] = user
    return list(users.values())


def scan_mpi(*, root, prefixes, site_dirs=(), python=None):
    """Find the MPI of an image."""
    image = ImageFiles(root)
    libraries = _libraries(image, prefixes)
    mpi4py = _mpi4py(image, site_dirs)
    # mpi4py 4 loads its library itself (MPI4PY_LIBMPI): its users are not pinned.
    preloading = mpi4py and mpi4py["abi_aware"] and mpi4py["dir"] + "/"
    users = _users(
        image,
        prefixes,
        skip={lib.real for lib in libraries},
        owners=_distributions(image, site_dirs),
        preloading=preloading,
    )
    search = _interpreter_search(image, python)
    pins = [_pin(image, user, search) for user in users]
    return MpiScan(libraries, users, [pin for pin in pins if pin], mpi4py)
