"""The dry run: what a plan would do, after asking a local base image."""

from dataclasses import dataclass, replace
import os
import subprocess
from typing import Any, Optional

from .. import apptainer
from ..engine import imageprobe, rocmwindow, targetenv
from ..errors import InputError, redact
from . import checks
from .plan import is_uri


@dataclass(frozen=True)
class BaseAnswer:
    """
    What the dry run learned by asking the base image.

    Attributes
    ----------
    facts : dict or None
        The probe's facts (None: not asked).
    target : TargetEnv, TargetEnvNotFoundError or None
        The target env the build would choose, or why there is none.
    problem : str or None
        Why the base image could not be asked.
    """

    facts: Optional[dict] = None
    target: Any = None
    problem: Optional[str] = None


def _probe_failure(error, *, timeout):
    """The dry run's words for a failed probe of the base image."""
    if isinstance(error, subprocess.TimeoutExpired):
        return imageprobe.timeout_message(timeout)
    text = (getattr(error, "stderr", None) or "").strip()
    why = (
        " | ".join(text.splitlines()[-3:])[-300:]
        or getattr(error, "strerror", None)
        or f"exit status {getattr(error, 'returncode', '')}, no message"
    )
    hint = apptainer.env_deadline_hint(text, image="the base image")
    return f"the probe of the base image failed ({why}){hint}"


def ask_base_image(plan):
    """Probe a local base image once: its facts and target env (or why not)."""
    if not plan.base_image.is_local_file:
        return BaseAnswer()
    explicit = plan.target_settings.prefix or None
    timeout = plan.target_settings.probe_timeout
    try:
        facts = imageprobe.probe_image_facts(
            image=plan.base_image.resolved, explicit=explicit, timeout=timeout
        )
    except (OSError, subprocess.SubprocessError) as e:
        problem = _probe_failure(e, timeout=timeout)
        return BaseAnswer(
            target=targetenv.TargetEnvNotFoundError(problem), problem=problem
        )
    if facts is None or explicit or plan.conda_env is not None:
        return BaseAnswer(facts=facts)
    try:
        target = targetenv.choose(facts=facts)
    except targetenv.TargetEnvNotFoundError as e:
        target = e
    return BaseAnswer(facts=facts, target=target)


def _inputs(plan):
    """The plan's lines on the image, system, base image and conda env."""
    exists = ""
    if plan.image_exists and plan.request.force:
        exists = " (exists: will be replaced when the build succeeds)"
    elif plan.image_exists:
        exists = " (exists: the build will refuse; pass --force to overwrite)"
    lines = [f"  image:      {plan.image_path}{exists}"]
    if plan.system is None:
        lines.append("  system:     none (--base-image)")
    else:
        lines += plan.system.describe_lines()
    lines += _base_lines(plan.base_image)
    conda = ", ".join(map(str, plan.conda_envs)) or "none"
    lines.append(f"  conda env:  {conda}")
    return lines


def _base_lines(base):
    """The plan's lines on the base image: as given, matched, linked, resolved."""
    lines = [f"  base image: {base.given}"]
    if base.pattern:
        lines.append(f"    matched by: {base.pattern}")
    if base.link:
        lines.append(f"    a link to: {base.link}")
    if base.is_local_file and base.resolved != os.path.abspath(base.given):
        lines.append(f"    resolved: {base.resolved}")
    if not base.is_local_file and not is_uri(base.given):
        lines.append("    (not a file on this machine: the build will fail here)")
    return lines


def _titled(title, answer):
    """An answer's lines under a title, the rest indented."""
    lines = [f"  {title + ':':<11} {answer[0]}"]
    lines += [f"              {line}" for line in answer[1:]]
    return lines


def _layered_line(plan):
    """Whether the image is a layer on the base, and why not."""
    if plan.layer_problem:
        return f"  layered:    no, the whole image is squashed: {plan.layer_problem}"
    if plan.layer_only:
        return f"  layered:    yes, only the layer (on {plan.base_image.resolved}, no copy)"
    return "  layered:    yes"


def _image_step(plan):
    """The last step: how the image is written."""
    image = "build the SIF"
    if plan.layer_problem is None:
        image = "add the change as a squashfs layer to a copy of the base SIF"
        if plan.layer_only:
            image = "write only the change, a squashfs layer for the base SIF"
        image += " (kept if an exec of it shows the layer, else the whole SIF)"
    image += " (written next to the target, moved into place on success)"
    return f"cotainr: add metadata labels and {image}"


def _steps(plan, facts):
    """The plan's numbered steps: cotainr's and the stages', in order."""
    unpack = "create the sandbox from the base image"
    if plan.mount_problem is None:
        unpack = "mount the base image read-only under a writable dir (no unpack)"
    steps = [(f"cotainr: {unpack}", [])]
    if plan.conda_env is not None:
        updates = [f"then update it with {f.name}" for f in plan.conda_envs[1:]]
        steps.append((f"cotainr: install the conda env {plan.conda_env.name}", updates))
    for stage in plan.stages:
        steps.append((stage.name, stage.describe(build=facts)))
    steps.append((_image_step(plan), []))
    lines = []
    for number, (title, details) in enumerate(steps, 1):
        lines.append(f"  {number}. {title}")
        lines += [f"       {detail}" for detail in details]
    return lines


def describe(plan, *, answer, space):
    """
    The dry-run text of a plan (no I/O).

    Parameters
    ----------
    plan : BuildPlan
        The plan.
    answer : BaseAnswer
        What the base image said (:func:`ask_base_image`).
    space : tuple of (int or None, int)
        Bytes needed and free in the work directory.
    """
    target = targetenv.describe_lines(
        settings=plan.target_settings, conda_env=plan.conda_env, answer=answer.target
    )
    rocm = rocmwindow.describe_lines(
        settings=plan.rocm_settings,
        profile_rocm=plan.facts.rocm_version,
        facts=answer.facts,
        target=answer.target,
    )
    needed, free = space
    estimate = ""
    if needed:
        estimate = f"needs about {needed / 1024**3:.1f} GiB, "
    mode = "stock cotainr"
    if plan.extended:
        mode = "extended cotainr-lumi pipeline"
    lines = ["cotainr-lumi build plan (dry run: nothing is built)", *_inputs(plan)]
    lines.append(
        f"  work dir:   {plan.work_dir} ({estimate}{free / 1024**3:.1f} GiB free)"
    )
    lines += _titled("target env", target)
    lines += _titled("rocm", rocm)
    lines.append(f"  pipeline:   {mode}")
    lines.append(_layered_line(plan))
    compression = plan.build_settings.compression
    lines.append(f"  squashfs:   {compression} (gzip where the runtime cannot run it)")
    lines += _steps(plan, replace(plan.facts, target_text=target[0]))
    lines += [f"  skipped: {reason}" for reason in plan.skipped]
    return redact("\n".join(lines))


def dry_run(plan):
    """
    Ask the base image, then describe the plan.

    Returns
    -------
    text, answer : str, BaseAnswer
        The dry-run text, and what the base image said.
    """
    answer = ask_base_image(plan)
    return describe(plan, answer=answer, space=checks.space_needed(plan)), answer


def dry_run_lines(plan):
    """The dry run's lines; the plan, then one error when the base could not be asked."""
    text, answer = dry_run(plan)
    if answer.problem:  # the plan, then a non-zero exit (as stated)
        print(text)
        raise InputError(f"the dry run could not ask the base image: {answer.problem}")
    return text.splitlines()
