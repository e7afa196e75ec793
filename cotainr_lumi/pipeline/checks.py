"""The checks around a build: before it starts, while it runs, when it fails."""

import contextlib
import logging
import os
from pathlib import Path
import shutil
import subprocess

from .. import _cotainr, apptainer
from ..engine import workdir
from ..errors import CotainrLumiError, InputError, StageError
from ..imagelayout import ENV_SCRIPTS_DIR

logger = logging.getLogger(f"cotainr.{__name__}")

#: Bind variables a LUMI bindings module may leave set; they break builds
#: because the bound host paths do not exist in the image being built.
BIND_ENV_VARS = (
    "SINGULARITY_BIND",
    "SINGULARITY_BINDPATH",
    "APPTAINER_BIND",
    "APPTAINER_BINDPATH",
)


def check_conda_prefix(prefix):
    """Refuse a cotainr whose conda env (`prefix`) is not where cotainr-lumi looks."""
    if prefix is not None and prefix != _cotainr.CONDA_PREFIX:
        raise InputError(
            f"cotainr {_cotainr.COTAINR_VERSION} installs conda in {prefix}, "
            f"this cotainr-lumi looks for it in {_cotainr.CONDA_PREFIX}; install "
            "a cotainr-lumi release for this cotainr."
        )


def refuse_base_links(plan):
    """Refuse a local base image whose metadata Apptainer writes is a link."""
    image = plan.base_image.resolved
    if not (plan.base_image.is_local_file or os.path.isdir(image)):
        return
    paths = apptainer.SANDBOX_METADATA
    if plan.conda_envs:  # cotainr's conda step appends there
        paths += (ENV_SCRIPTS_DIR, f"{ENV_SCRIPTS_DIR}/92-cotainr-env.sh")
    try:
        links = apptainer.links_in_image(image=image, paths=paths)
    except (OSError, subprocess.SubprocessError) as e:
        links = None
        logger.debug("Listing the base image failed: %s", e)
    if links is None:
        logger.warning(
            "Could not read the base image %s without running it (no "
            "unsquashfs?); its /.singularity.d is not checked for links.",
            image,
        )
        return
    for path, target in links.items():
        raise InputError(
            f"The base image's {path} is a symbolic link (to {target}); "
            "the build writes there before any cotainr-lumi stage runs, and "
            "a link can lead out of the image (to a host file). Use a base "
            f"image where {path} is not a link."
        )


def space_needed(plan):
    """
    What the build needs in its work directory, and what is free there.

    Returns
    -------
    needed, free : int or None, int
        Bytes (needed is None when it cannot be estimated).
    """
    image = plan.base_image.resolved
    unpacked = None
    sifs = 2
    if plan.layer_problem is None:  # nothing unpacked; a copy of the base
        unpacked = 0
        sifs = 0 if plan.layer_only else 1
    elif plan.base_image.is_local_file:
        unpacked = apptainer.unpacked_bytes(image=image)
    needed = workdir.estimate_bytes(
        base_image=image, conda_env=plan.conda_envs, unpacked=unpacked, sifs=sifs
    )
    return needed, shutil.disk_usage(plan.work_dir).free


def check_space(plan, *, refuse):
    """Refuse a build that will not fit in its work directory (`refuse`: else warn)."""
    needed, free = space_needed(plan)
    workdir.check_space(work_dir=plan.work_dir, needed=needed, free=free, refuse=refuse)


def log_resolved_base_image(base):
    """Say so when the base image is a link (its target is recorded)."""
    if base.is_local_file and base.resolved != os.path.abspath(base.given):
        logger.info(
            "Base image %s is a link to %s; recording that file (links such "
            "as LUMI's sif-images/ change without notice: build from a copy "
            "for a reproducible base)",
            base.given,
            base.resolved,
        )


@contextlib.contextmanager
def without_bind_variables():
    """Unset the bind variables (a LUMI bindings module's) during a build."""
    removed = {}
    for name in BIND_ENV_VARS:
        if name in os.environ:
            removed[name] = os.environ.pop(name)
    if removed:
        logger.warning(
            "Ignoring %s during the build (bind mounts are for running "
            "containers, not for building them); they are restored afterwards.",
            ", ".join(sorted(removed)),
        )
    try:
        yield removed
    finally:
        os.environ.update(removed)


def check_base_image_unchanged(base, *, used):
    """Stop when the base image cotainr `used` is not the file the plan resolved."""
    if not base.is_local_file:
        return
    if base.pinned is not None:
        base.pinned.check()
    now = os.path.realpath(used)
    if now != base.resolved:
        raise StageError(
            f"the base image link {base.given} was re-pointed during the build "
            f"(from {base.resolved} to {now}); build again, or from a copy of "
            "the image",
            stage="cotainr",
        )


def as_stage_error(error, *, stage):
    """The one clear error to report for an exception (not a CotainrLumiError)."""
    command_error = _cotainr.command_error_from(error)
    if command_error is not None:
        return StageError(
            str(command_error), stage=stage, details=command_error.error_lines()
        )
    if isinstance(error, FileNotFoundError) and error.filename == "singularity":
        return StageError(
            "the 'singularity' command was not found. Install Apptainer "
            "(or SingularityCE) so that 'singularity' is on PATH; on this "
            "project's test machines run scripts/provision-apptainer.sh.",
            stage=stage,
        )
    if isinstance(error, (OSError, ValueError, RuntimeError)):
        stderr = getattr(error.__cause__, "stderr", None)
        details = None
        if stderr:
            details = "\n".join(stderr.splitlines()[-20:])
        return StageError(str(error), stage=stage, details=details)
    logger.debug("Unexpected error in %s", stage, exc_info=error)
    return StageError(
        f"unexpected {type(error).__name__}: {error}. This is a bug in "
        "cotainr-lumi; please report it with the output of -vvv.",
        stage=stage,
    )


def _free_space_hint(plan):
    """What to say when a file system of the build is full."""
    places = {
        "the work directory": plan.work_dir,
        "the image's directory": Path(plan.image_path).parent,
    }
    free = []
    for what, place in places.items():
        try:
            room = shutil.disk_usage(place).free / 1024**3
        except OSError:
            continue
        free.append(f"{what} {place} has {room:.1f} GiB free")
    return (
        f" A file system is full ({'; '.join(free)}): build with --work-dir "
        "on one with more room (on LUMI /flash or /scratch, not /tmp), or "
        "write the image elsewhere."
    )


def cotainr_failure(error, *, plan):
    """One line for a failure of cotainr's own steps (sandbox, conda, image)."""
    if isinstance(error, CotainrLumiError):  # said by cotainr-lumi's own parts
        return error
    cause = error.__cause__ or error
    lines = (getattr(cause, "stderr", None) or "").strip().splitlines()
    detail = f"{type(error).__name__}: {error}"
    if lines:
        detail = " | ".join(lines[-3:])
    hint = apptainer.env_deadline_hint(
        detail, image=f"the base image {plan.base_image.given}"
    )
    full = "no space left on device" in detail.lower()
    if full or getattr(cause, "errno", 0) == 28:
        hint = _free_space_hint(plan)
    return f"cotainr's build failed: {detail[-800:]}.{hint}"
