"""
``cotainr-lumi check-host``: the host facts the system profiles rely on.

One row per fact with the fix; host paths are looked up under a root (``/``,
or a test tree), links resolved inside it, never followed out of it.
"""

from dataclasses import replace
import logging
import os
from pathlib import Path, PurePosixPath
import re

from .. import safeio
from ..engine.rocmwindow import major_minor, system_window
from ..engine.rootfs import image_path_of, resolve_in_root
from ..engine.sifimage import COMPRESSORS, Compression, mount_problem
from ..errors import InputError
from ..pipeline.profiles import get_system, load_systems
from ..stages.lumi_env.mpi import gpu_aware_caveat
from .checks import VerifyReport
from .status import FAIL, NA, PASS, WARN

logger = logging.getLogger(f"cotainr.{__name__}")


def _try(root, path, use, default=None):
    """use(the host path in `root`), or `default` for an OSError (a link out too)."""
    try:
        return use(resolve_in_root(root=root, path=path, confine=True))
    except OSError:
        return default


def _there(root, path):
    return _try(root, path, Path.exists, False)


def _moved(root, path):
    """Where a missing versioned path may be now (the nearest sibling with the rest)."""
    parts = PurePosixPath(path).parts
    i = next(i for i in range(2, len(parts) + 1) if not _there(root, Path(*parts[:i])))
    parent = Path(*parts[: i - 1])
    missing = parts[i - 1]
    rest = parts[i:]
    names = _try(root, parent, os.listdir, [])
    shape = re.sub(r"[\d.]", "", missing)  # the name without its version
    names = [n for n in names if re.sub(r"[\d.]", "", n) == shape and n != missing]
    # The same line first (8.1.29: 8.1.32 before 9.0.1), then the newest.
    common = os.path.commonprefix
    names.sort(
        key=lambda n: (len(common([missing, n])), [*map(int, re.findall(r"\d+", n))]),
        reverse=True,
    )
    if not names:
        return ""
    has = f"{parent} has {', '.join(names[:8])}"
    for name in names:
        if _there(root, parent.joinpath(name, *rest)):
            return f"; it may be {parent.joinpath(name, *rest)} ({has})"
    return f"; {has}"


def _exists(root, path, *, file=False):
    """(ok, words): does the host path exist (as a file)."""
    try:
        found = resolve_in_root(root=root, path=path, confine=True)
    except OSError as e:
        return False, f"{path}: {e.strerror}"
    shown = image_path_of(root=root, host_path=found)
    where = f"{path} (-> {shown})" if str(shown) != str(path) else str(path)
    if not found.exists():
        return False, f"{where} does not exist{_moved(root, path)}"
    if file and not found.is_file():
        return False, f"{where} is not a file"
    return True, f"{where} exists"


def _bind_rows(system, root):
    binding = system.mpi_host
    binds = system.stage_settings("lumi-env").get("binds") or []
    if binding is not None:
        binds += [*binding.binds, *binding.binds_if_absent]
    fix = "remove the bind or give where it moved in lumi-env binds"
    for src in (bind.partition(":")[0] for bind in binds):
        ok, words = _exists(root, src, file=".so" in PurePosixPath(src).name)
        yield f"bind {src}", ok, words, fix


def _base_image_rows(system, root):
    image = system.base_image
    if image.startswith("/"):
        ok, words = _exists(root, image, file=True)
        rocm = re.search(r"rocm-(\d+\.\d+)", words.partition("(-> ")[2])
        if ok and rocm and rocm.group(1) != (system.rocm_version or rocm.group(1)):
            ok = False
            words += f"; the link now points at ROCm {rocm.group(1)}, not {system.rocm_version}"
        fix = "give --base-image, or set base-image (and rocm-version)"
        yield f"base-image {PurePosixPath(image).name}", ok, words, fix


def _site_answer(site):
    """(status, words) of LUST's base image for a system against the built-in one."""
    default = site.default
    if site.site == default:
        return True, f"the same as the built-in default: {default}"
    if site.site:
        return WARN, f"{site.site}; builds use it, not the built-in {default}"
    if site.site_file:
        return WARN, f"{site.site_file} has no {site.name}; builds use {default}"
    return NA, f"no LUST systems.json; builds use the built-in {default}"


def _site_rows(system, _root):
    """LUST's systems.json (`follows`) against the profile's base image."""
    site = system.site_base
    if site is not None:
        check = f"site {site.name}" + (f" of {site.site_file}" if site.site else "")
        yield check, *_site_answer(site), ""


def _head(path):
    """A version file's text: a regular file only (no FIFO, no device), 4 KiB."""
    with safeio.open_regular(path) as f:
        return f.read(4096).decode(errors="replace").strip() or None


def _rocm_rows(system, root):
    window = system_window(system)
    if window is None:
        return
    names = _try(root, "/opt", os.listdir, [])
    rocms = {_try(root, f"/opt/{n}/.info/version", _head) for n in names if "rocm" in n}
    driver = _try(root, "/sys/module/amdgpu/version", _head)
    for check, found, what in (
        ("rocm-driver", {driver}, "amdgpu driver"),
        ("rocm-host", rocms, "host ROCm"),
    ):
        found = sorted(found - {None})
        out = [v for v in found if major_minor(v) not in window]
        words = f"{what} {', '.join(found) or 'unreadable here'}; {window.words()}"
        words += f": {', '.join(out)} is outside" if out else ""
        fix = "set rocm.supported (and .source) as LUST states for this driver"
        yield f"{check} {window}", not out if found else NA, words, fix


def _discovered_mpi_row(binding, root):
    """The ``mpi-host`` row of a binding found on the host (``discover``, globs)."""
    binds = [
        f"{root}/{b.lstrip('/')}:{b}" if ":" not in b else b for b in binding.binds
    ]
    found = replace(binding, binds=tuple(binds)).find_here()
    words = found.problem or (
        f"the module file finds {found.libmpi} ({found.source}); LD_LIBRARY_PATH "
        f"{':'.join(found.ld_library_path)}"
    )
    fix = "load cray-mpich (or cray-mpich-abi) or set lumi-env.mpi-host.libmpi (COTAINR_LUMI_MPI=container works meanwhile)"
    return "mpi-host", not found.problem, words, fix


def _bound_mpi_rows(binding, root):
    """A row per host path a fixed binding binds (the container's own: none)."""
    paths = [("libmpi", binding.libmpi)]
    paths += [("ld-library-path", p) for p in binding.ld_library_path[1:]]
    for key, path in paths:
        host = binding.host_path(path)
        if host is None:
            continue
        ok, words = _exists(root, host, file=key == "libmpi")
        if host != path:
            words = f"{path} is {words}"
        yield f"mpi {path}", ok, words, f"set lumi-env.mpi-host.{key}"


def _mpi_rows(system, root):
    """The rows of a system's host MPI binding (``lumi-env.mpi-host``)."""
    binding = system.mpi_host
    if binding is None:
        return
    caveat = gpu_aware_caveat(system.rocm_version)
    if caveat:  # a ROCm 7 system (Update-202601)
        yield "mpi-gpu-aware", WARN, caveat, ""
    paths = [binding.libmpi, *binding.ld_library_path]
    if binding.discover or any("*" in p for p in paths):
        yield _discovered_mpi_row(binding, root)
    else:
        yield from _bound_mpi_rows(binding, root)


def _status(ok):
    """The status of a row's answer (True, False, N/A or WARN)."""
    if ok in (NA, WARN):
        return ok
    return PASS if ok else FAIL


def _add_compression_rows(report, root):
    """Which compressors the runtime of the host (root "/") mounts: a tiny image each."""
    if root != "/":  # a test tree has no runtime of its own
        return
    for name in COMPRESSORS:
        problem = mount_problem(Compression.parse(name))
        words = f"the runtime mounts {name} images"
        status = PASS
        if problem is not None:
            status = FAIL if name == "gzip" else NA
            words = f"the runtime cannot run a {name} image: {problem}"
            if status == NA:
                words += f"; builds asking for {name} write gzip images here"
        report.add(f"squashfs {name}", status, words)


def _checked_root(root):
    """The absolute host tree to check (InputError for one binds cannot name)."""
    if not Path(root).is_dir():
        raise InputError(f"--root {root}: not a directory; give the host tree to check")
    root = os.path.abspath(root)
    if set(root) & set(":,") or any(c.isspace() for c in root):
        raise InputError(
            f"--root {root}: host paths are looked up through binds, which cannot "
            "name a path with ':', ',' or white space; give a link to it instead"
        )
    return root


def check_host(*, root="/", system=None):
    """The report of the host facts of every system (or of one)."""
    root = _checked_root(root)
    systems = load_systems()
    chosen = [get_system(name=system, systems=systems)] if system else systems.values()
    rows = {}
    for one in chosen:
        kinds = [_site_rows, _base_image_rows, _rocm_rows]
        if "lumi-env" in one.stages:  # the row makers that apply to the system
            kinds += [_bind_rows, _mpi_rows]
        for kind in kinds:
            for check, ok, words, fix in kind(one, Path(root)):
                status = _status(ok)
                row = rows.setdefault(check, [status, words, []])
                if status == FAIL:  # the worst of the systems' answers, with the fix
                    row[:2] = (
                        FAIL,
                        f"{words}; {fix} in a site profile (COTAINR_LUMI_SYSTEMS)",
                    )
                row[2].append(one.name)
    report = VerifyReport(image=str(root), command="check-host")
    for check, (status, words, names) in rows.items():
        report.add(check, status, f"{words} [{', '.join(dict.fromkeys(names))}]")
    _add_compression_rows(report, root)
    return report
