"""
``cotainr-lumi check-host``: the host facts the system profiles rely on.

Binds, base images (and where their links point), the ROCm window against the
GPU driver and the host's ROCm, and the host MPI binding, one row per fact
with the fix. Host paths are looked up under a root (``/``, or a test tree),
links resolved inside it; a link out of it is reported, never followed.
"""

import logging
import os
from pathlib import Path, PurePosixPath
import re

from ..engine.rocmwindow import RocmSettings, Window, major_minor
from ..engine.rootfs import image_path_of, resolve_in_root
from ..errors import InputError
from ..pipeline.profiles import get_system, load_systems
from ..stages.lumi_env.mpi import HostBinding
from .checks import VerifyReport
from .status import FAIL, NA, PASS

logger = logging.getLogger(f"cotainr.{__name__}")

FIX = "in a site profile (COTAINR_LUMI_SYSTEMS)"


def _find(root, path, *, follow=True):
    """(host path inside `root`, None) or (None, why it cannot be looked up)."""
    try:
        found = resolve_in_root(root=root, path=path, follow_final=follow, confine=True)
        return found, None
    except OSError as e:
        return None, e.strerror or str(e)


def _shape(name):
    return re.sub(r"[\d.]", "", name)


def _moved(root, path):
    """Where a missing versioned path may be now (the nearest sibling with the rest)."""
    parts = PurePosixPath(path).parts
    for i in range(1, len(parts)):
        found, _ = _find(root, PurePosixPath(*parts[: i + 1]))
        if found is None or not found.exists():
            break
    else:
        return ""
    parent, missing = PurePosixPath(*parts[:i]), parts[i]
    try:
        names = os.listdir(_find(root, parent)[0])
    except (OSError, TypeError):
        return ""
    names = [n for n in names if _shape(n) == _shape(missing) and n != missing]
    names.sort(
        key=lambda n: (
            len(os.path.commonprefix([missing, n])),  # 8.1.29: 8.1.32 before 9.0.1
            [int(d) for d in re.findall(r"\d+", n)],
        ),
        reverse=True,
    )
    for name in names:
        candidate = parent.joinpath(name, *parts[i + 1 :])
        if (_find(root, candidate)[0] or Path("/nonexistent")).exists():
            return f"; it may be {candidate} ({parent} has {', '.join(names[:6])})"
    return f"; {parent} has {', '.join(names[:6])}" if names else ""


def _exists(root, path, *, file=False):
    """(ok, words): does the host path exist (as a file)."""
    found, problem = _find(root, path)
    if found is None:
        return False, f"{path}: {problem}"
    shown = image_path_of(root=root, host_path=found)
    where = f"{path} (-> {shown})" if str(shown) != str(path) else str(path)
    if not found.exists():
        return False, f"{where} does not exist{_moved(root, path)}"
    if file and not found.is_file():
        return False, f"{where} is not a file"
    return True, f"{where} exists"


def _bind_rows(system, root):
    settings = system.stage_settings("lumi-env")
    binds = [*settings.get("binds", []), *settings.get("mpi-host", {}).get("binds", [])]
    for bind in binds:
        src = bind.partition(":")[0]
        if "$" in src or not src.startswith("/"):
            yield f"bind {src}", NA, "expanded when the module file is loaded"
            continue
        ok, words = _exists(root, src, file=".so" in PurePosixPath(src).name)
        fix = f"; remove the bind or give where it moved in lumi-env binds {FIX}"
        yield f"bind {src}", PASS if ok else FAIL, words + ("" if ok else fix)


def _base_image_rows(system, root):
    image = system.base_image
    if not image.startswith("/"):
        yield f"base-image {image}", NA, "not a host path"
        return
    ok, words = _exists(root, image, file=True)
    found, _ = _find(root, image, follow=False)
    if ok and found.is_symlink():
        words += " (a link: builds resolve it and record the file)"
        rocm = re.search(r"rocm-(\d+\.\d+)", words.partition("(-> ")[2])
        if rocm and system.rocm_version and rocm.group(1) != system.rocm_version:
            ok = False
            words += (
                f"; it now points at ROCm {rocm.group(1)}, not {system.rocm_version}"
            )
    fix = f"; set base-image (and rocm-version) {FIX}, or use --base-image"
    yield (
        f"base-image {PurePosixPath(image).name}",
        PASS if ok else FAIL,
        words + ("" if ok else fix),
    )


def _read_first_line(root, path):
    found, _ = _find(root, path)
    try:
        return found.read_text(errors="replace").split("\n")[0].strip() or None
    except (OSError, AttributeError):
        return None


def _rocm_rows(system, root):
    settings = RocmSettings.complete(system.stage_settings("rocm"))
    window = Window.from_text(settings.supported, source=settings.source)
    if window is None:
        return
    fix = (
        f"; find the ROCm range LUST states for this driver (LUMI update notes) "
        f"and set rocm.supported and rocm.source {FIX}"
    )
    driver = _read_first_line(root, "/sys/module/amdgpu/version")
    opt = _find(root, "/opt")[0]
    names = sorted(os.listdir(opt)) if opt and opt.is_dir() else []
    rocms = [f"/opt/{n}/.info/version" for n in names if n.startswith("rocm")]
    host = [v for v in (_read_first_line(root, p) for p in rocms) if v]
    for check, versions, what in (
        ("rocm-driver", [driver] if driver else [], "amdgpu driver"),
        ("rocm-host", sorted(set(host)), "host ROCm"),
    ):
        if not versions:
            yield f"{check} {window}", NA, f"no {what} readable here (not a GPU node?)"
            continue
        out = [v for v in versions if major_minor(v) not in window]
        words = f"{what} {', '.join(versions)}; {window.words()}"
        yield (
            f"{check} {window}",
            FAIL if out else PASS,
            words + (f": {', '.join(out)} is outside{fix}" if out else ""),
        )


def _mpi_rows(system, root):
    """The rows of a system's host MPI binding (``lumi-env.mpi-host``)."""
    raw = system.stage_settings("lumi-env").get("mpi-host") or {}
    if not raw.get("libmpi"):
        return
    paths = [raw["libmpi"], *raw.get("ld-library-path", [])]
    if raw["libmpi"] == "discover" or any("*" in p for p in paths):
        yield "mpi-host", NA, "discovered on the host when the module file is loaded"
        return
    binding = HostBinding.from_setting(raw)
    for key, path in [("libmpi", binding.libmpi)] + [
        ("ld-library-path", p) for p in binding.ld_library_path[1:]
    ]:
        host = binding.host_path(path)
        if host is None:
            continue  # not bound: the container's own directory
        ok, words = _exists(root, host, file=key == "libmpi")
        if host != path:
            words = f"{path} is {words}"
        fix = f"; set lumi-env.mpi-host.{key} {FIX}"
        yield f"mpi {path}", PASS if ok else FAIL, words + ("" if ok else fix)


def check_host(*, root="/", system=None):
    """The report of the host facts of every system (or of one)."""
    if not Path(root).is_dir():
        raise InputError(f"--root {root}: not a directory; give the host tree to check")
    systems = load_systems()
    chosen = [get_system(name=system, systems=systems)] if system else systems.values()
    rows = {}
    for one in chosen:
        kinds = [_base_image_rows, _rocm_rows]
        if "lumi-env" in one.stages:
            kinds += [_bind_rows, _mpi_rows]
        for kind in kinds:
            for check, status, words in kind(one, Path(root)):
                row = rows.setdefault(check, [status, words, []])
                if status == FAIL:  # the worst of the systems' answers
                    row[:2] = status, words
                row[2].append(one.name)
    report = VerifyReport(image=str(root), command="check-host")
    for check, (status, words, names) in rows.items():
        report.add(check, status, f"{words} [{', '.join(dict.fromkeys(names))}]")
    return report
