"""
Where a build works: the sandbox and Apptainer's temporary files.

On LUMI's compute nodes ``/tmp`` is in memory, so the settings section
``build`` (``work-dir``, ``--work-dir``) moves both to a chosen file system,
whose free space is checked against an estimate first.
"""

import contextlib
from dataclasses import dataclass
import logging
import os
from pathlib import Path
import shutil
import tempfile
from typing import Optional

from ..errors import InputError
from .layer import unmount_below
from .settings import StageSettings, setting
from .sifimage import Compression

logger = logging.getLogger(f"cotainr.{__name__}")

#: The settings section of the build (``build.work-dir``).
SETTINGS_NAME = "build"
#: The variables that place temporary files (Python's, Apptainer's, Singularity's).
TMP_VARIABLES = ("TMPDIR", "APPTAINER_TMPDIR", "SINGULARITY_TMPDIR")
#: An unpacked sandbox is this many times its SIF (squashfs compresses ~2-3x),
#: when its files cannot be listed.
EXPANSION = 3
#: What a conda environment adds (the Miniforge installer, packages, caches).
CONDA_BYTES = 6 * 1024**3
#: Room for pip steps, caches and the rest when nothing else is known.
HEADROOM_BYTES = 2 * 1024**3


def _check_work_dir(value):
    if not value.startswith(("/", "~")):
        raise ValueError(f"must be an absolute path (got {value!r})")


@dataclass(frozen=True)
class BuildSettings(StageSettings):
    """The settings section ``build``."""

    work_dir: Optional[str] = setting(
        None,
        doc="where the sandbox and Apptainer's temporary files go "
        "(null: $TMPDIR, else /tmp)",
        check=_check_work_dir,
    )
    check_space: bool = setting(
        True,
        doc="refuse to start when the work directory has less free space "
        "than the build is estimated to need",
    )
    layered: bool = setting(
        True,
        doc="on a local SIF base without a conda env, add the change as a layer "
        "to a copy of the base (false, or --flatten: squash the whole image)",
    )
    compression: str = setting(
        "zstd:3",
        doc="the image's squashfs compressor: zstd, gzip, lz4 or xz, with a level "
        "as zstd:19 or gzip:1 (gzip where the runtime cannot run the image)",
        check=Compression.parse,
    )
    layer_only: bool = setting(
        False,
        doc="with layered: write only the layer, a squashfs file at the image path "
        "(no copy of the base; the module file mounts it on the base SIF)",
    )


def resolve_work_dir(value):
    """The work directory a setting names, checked."""
    if value is None:
        return Path(tempfile.gettempdir())
    try:
        path = Path(value).expanduser()
    except RuntimeError as e:  # ~nosuchuser
        raise InputError(f"--work-dir {value!r}: {e}") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise InputError(
            f"--work-dir {value!r} is not a writable directory. Create it (e.g. "
            "mkdir -p /flash/project_XXXXXXXXX/$USER/cotainr-work) or choose another."
        )
    return path.resolve()


def estimate_bytes(*, base_image, conda_env, unpacked=None, sifs=2):
    """
    The space a build needs at its peak in its work directory (None: unknown).

    The sandbox (the base unpacked: `unpacked`, else :data:`EXPANSION` times
    the SIF, squashed into the image without a copy, issue 40), `sifs` times
    the SIF (the squashfs and the image it is added to; a layered build's copy
    of the base; none for the layer alone), pip's files and the conda env (when `conda_env` is true).
    """
    try:
        size = os.stat(base_image).st_size
    except (OSError, ValueError, TypeError):
        return None
    if unpacked is None:
        unpacked = size * EXPANSION
    needed = unpacked + sifs * size + HEADROOM_BYTES
    if conda_env:
        needed += CONDA_BYTES
    return needed


def _gib(n):
    return f"{n / 1024**3:.1f} GiB"


def check_space(*, work_dir, needed, free, refuse=True):
    """Refuse a build that needs more than is `free` in `work_dir` (else warn)."""
    if needed is None or needed <= free:
        return
    if not refuse:
        logger.warning(
            "The build may need about %s in %s; %s is free (build.check-space is off).",
            _gib(needed),
            work_dir,
            _gib(free),
        )
        return
    raise InputError(
        f"The build needs about {_gib(needed)} in its work directory "
        f"{work_dir} (the base image unpacked, the "
        f"image, the conda env and pip's files) but only {_gib(free)} is free "
        "there. Choose a larger file system with --work-dir DIR (or "
        "build.work-dir in a site profile); on LUMI a directory in "
        "/flash/project_... or /scratch/project_..., not /tmp, which is in "
        "memory on compute nodes. (--set build.check-space=false starts anyway.)"
    )


BUILD_DIR_PREFIX = "cotainr-lumi-build-"


def _dead(pid_text):
    """Whether the process `pid_text` (digits) is gone."""
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, OverflowError):
        return False
    return False


def remove_leftovers(*, work_dir, image_path):
    """Remove the work and partial image files of your killed earlier builds."""
    image_path = Path(image_path)
    found = [
        (path, path.name.removeprefix(BUILD_DIR_PREFIX).split("-")[0])
        for path in Path(work_dir).glob(f"{BUILD_DIR_PREFIX}*-*")
    ] + [
        (path, path.name.rsplit("-", 1)[1])
        for pattern in (
            f".{image_path.name}.partial-*",
            f"{image_path.name}.cotainr-partial-*",
        )
        for path in image_path.parent.glob(pattern)
    ]
    for path, pid in found:
        try:
            mine = path.lstat().st_uid == os.getuid() and not path.is_symlink()
        except OSError:
            continue
        if mine and _dead(pid):
            if path.is_dir():
                unmount_below(path)
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            logger.warning(
                "Removed %s, left behind by an earlier build that was killed "
                "(process %s is gone).",
                path,
                pid,
            )


@contextlib.contextmanager
def work_dir_environment(work_dir):
    """Point temporary files at a new directory in `work_dir`, removed at the end."""
    build_dir = Path(
        tempfile.mkdtemp(prefix=f"{BUILD_DIR_PREFIX}{os.getpid()}-", dir=work_dir)
    )
    saved = {name: os.environ[name] for name in TMP_VARIABLES if name in os.environ}
    saved_tempdir = tempfile.tempdir
    os.environ.update(dict.fromkeys(TMP_VARIABLES, str(build_dir)))
    tempfile.tempdir = str(build_dir)
    logger.info("Working in %s (sandbox and Apptainer's temporary files)", build_dir)
    try:
        yield build_dir
    finally:
        tempfile.tempdir = saved_tempdir
        for name in TMP_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(saved)
        shutil.rmtree(build_dir, ignore_errors=True)
