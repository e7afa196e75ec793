"""Helpers of the build hook that runs a plan's stages inside cotainr's build."""

import contextlib
from dataclasses import dataclass, field
import logging
import os
from pathlib import Path
import shutil
import time
from typing import Optional

from .. import _cotainr, apptainer
from ..engine.stage import OUTPUT_MARKER, StageReport
from ..errors import CotainrLumiError, StageError

logger = logging.getLogger(f"cotainr.{__name__}")

#: Bind variables a LUMI bindings module may leave set; they break builds
#: because the bound host paths do not exist in the image being built.
BIND_ENV_VARS = (
    "SINGULARITY_BIND",
    "SINGULARITY_BINDPATH",
    "APPTAINER_BIND",
    "APPTAINER_BINDPATH",
)


@dataclass
class BuildResult:
    """
    What a build produced.

    Attributes
    ----------
    image_path : :class:`pathlib.Path`
        The image (not created for a dry run).
    system : str or None
        The system name.
    base_image : str
        The base image as given.
    labels : dict of str to str
        The labels cotainr-lumi added.
    reports : list of StageReport
        One report per stage, in order.
    duration : float
        Wall time in seconds.
    dry_run : bool
        True if nothing was built.
    plan_text : str
        The plan description.
    """

    image_path: Path
    system: Optional[str]
    base_image: str
    labels: dict[str, str] = field(default_factory=dict)
    reports: list[StageReport] = field(default_factory=list)
    duration: float = 0.0
    dry_run: bool = False
    plan_text: str = ""

    def report(self, name):
        """The report of the stage `name` (KeyError: the stage did not run)."""
        for report in self.reports:
            if report.name == name:
                return report
        raise KeyError(name)


@contextlib.contextmanager
def without_bind_variables():
    """Unset the bind variables (a LUMI bindings module's) during a build."""
    removed = {
        name: os.environ.pop(name) for name in BIND_ENV_VARS if name in os.environ
    }
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


def run_stage(*, stage, context):
    """Run one stage and record its report and labels in the context."""
    logger.info("Running stage: %s", stage.name)
    t_stage = time.time()
    report = stage.run(context=context)
    report.duration = time.time() - t_stage
    context.reports.append(report)
    context.labels.update(report.labels)
    logger.info(
        "Finished stage %s in %.1f s%s",
        stage.name,
        report.duration,
        f": {report.summary}" if report.summary else "",
    )
    return report


def check_outputs(reports):
    """Collect the host files stages asked for; refuse to clobber foreign files."""
    outputs = {}
    for report in reports:
        for path, content in report.outputs.items():
            path = Path(path)
            if OUTPUT_MARKER not in content:
                raise StageError(
                    f"output {path} lacks the marker {OUTPUT_MARKER!r}",
                    stage=report.name,
                )
            if path.is_symlink() or (
                path.exists() and OUTPUT_MARKER not in path.read_text(errors="replace")
            ):
                raise StageError(
                    f"{path} exists and was not written by cotainr-lumi; it is "
                    "left untouched. Move it away, or choose another output "
                    "directory for this stage.",
                    stage=report.name,
                )
            ancestor = path.parent
            while not ancestor.exists() and ancestor != ancestor.parent:
                ancestor = ancestor.parent
            if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
                raise StageError(
                    f"cannot write {path}: {ancestor} is not a writable "
                    "directory. Choose another output directory for this stage.",
                    stage=report.name,
                )
            outputs[path] = content
    return outputs


def write_outputs(outputs):
    """Write host files atomically, one by one (after :func:`check_outputs`)."""
    for path, content in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
        tmp.write_text(content)
        tmp.chmod(0o755 if content.startswith("#!") else 0o644)
        os.replace(tmp, path)
        logger.info("Wrote %s", path)


def as_stage_error(error, *, stage):
    """The one clear error to report for an exception raised while building."""
    if isinstance(error, CotainrLumiError):
        return error
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
        details = "\n".join(stderr.splitlines()[-20:]) if stderr else None
        return StageError(str(error), stage=stage, details=details)
    logger.debug("Unexpected error in %s", stage, exc_info=error)
    return StageError(
        f"unexpected {type(error).__name__}: {error}. This is a bug in "
        "cotainr-lumi or a plugin stage; please report it with the output of -vvv.",
        stage=stage,
    )


def cotainr_failure(error, *, plan):
    """One line for a failure of cotainr's own steps (sandbox, conda, image)."""
    if isinstance(error, CotainrLumiError):  # said by cotainr-lumi's own parts
        return error
    cause = error.__cause__ if error.__cause__ is not None else error
    lines = (getattr(cause, "stderr", None) or "").strip().splitlines()
    detail = " | ".join(lines[-3:]) if lines else f"{type(error).__name__}: {error}"
    hint = apptainer.env_deadline_hint(
        detail, image=f"the base image {plan.base_image.given}"
    )
    if "no space left on device" in detail.lower() or getattr(cause, "errno", 0) == 28:
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
        hint = (
            f" A file system is full ({'; '.join(free)}): build with --work-dir "
            "on one with more room (on LUMI /flash or /scratch, not /tmp), or "
            "write the image elsewhere."
        )
    return f"cotainr's build failed: {detail[-800:]}.{hint}"


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
