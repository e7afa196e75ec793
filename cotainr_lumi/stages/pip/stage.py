"""
The pip stage: ordered pip steps after cotainr's conda step.

Each step is one ``pip install`` by the target environment's interpreter
(:mod:`cotainr_lumi.engine.targetenv`), with that env activated, so a package
built with ``no-build-isolation`` builds against what earlier steps installed.
Everything installed before a step is pinned for it (:mod:`.protect`) unless
the step lists it in ``allow-changes``. Credentials and secret ``env`` values
reach pip only (records show ``***``).
"""

import dataclasses
from pathlib import Path
import shlex

from ... import apptainer
from ...engine.stage import Stage
from ...errors import InputError, redact_env
from .install import (
    CHECK_FILE,
    PACKAGES_FILE,
    PIP_DIR,
    STEPS_FILE,
    WORK_DIR,
    PipRun,
    install_command,
    redacted_logs,
    step_dir,
    step_secrets,
)
from .requirements import scan_step
from .steps import PipSettings, default_cache_dir
from .uv import check_uv_step, find_uv

__all__ = ["PACKAGES_FILE", "WORK_DIR", "PipStage"]


def _describe_step(step, scan, *, cache):
    """The plan's lines on one step: its command, inputs and protection."""
    keep = step_dir(step)
    files = [f"{keep}/{rf.name}" for rf in scan.files]
    cmd = install_command(step=step, requirement_files=files, cache=cache)
    env = "".join(f"{k}={shlex.quote(v)} " for k, v in redact_env(step.env).items())
    lines = [f"{step.title}:", f"  {env}{shlex.join(cmd)}"]
    lines += [f"  requirements: {path}" for path in step.requirements]
    lines += [f"  package: {pkg}" for pkg in step.packages]
    lines += [f"  stages: {item}" for item in scan.local_inputs]
    protected = "everything installed before it"
    if step.allow_changes:
        protected += f" except {', '.join(sorted(step.allow_changes))}"
    lines.append(f"  protects: {protected}")
    return lines + [f"  not pinned: {moving}" for moving in scan.moving_refs]


class PipStage(Stage):
    """Ordered pip steps that cannot clobber installed packages."""

    name = "pip"
    settings_class = PipSettings

    def __init__(self, *, settings=None):
        super().__init__(settings=settings)
        allowed = self.settings.allow_changes
        self.steps = [
            dataclasses.replace(
                step, number=i + 1, installer=step.installer or self.settings.installer
            ).allowing(allowed)
            for i, step in enumerate(self.settings.steps)
        ]
        self.scans = [scan_step(step=step) for step in self.steps]
        self.cache_dir = Path(self.settings.cache_dir or default_cache_dir())
        self.uv_cache_dir = Path(self.settings.uv_cache_dir or default_cache_dir("uv"))
        self.uv = self._find_uv()

    def _find_uv(self):
        """(host program, version) of uv when a step uses it (checked), else None."""
        pairs = zip(self.steps, self.scans)
        uv_steps = [(step, scan) for step, scan in pairs if step.installer == "uv"]
        for step, scan in uv_steps:
            check_uv_step(step=step, scan=scan)
        if not uv_steps:
            return None
        uv = find_uv()
        if self.settings.cache and not apptainer.can_bind(self.uv_cache_dir):
            raise InputError(
                f"The uv cache {self.uv_cache_dir} is mounted into the container, "
                "which a path with ',' or ':' cannot be: set pip.uv-cache-dir."
            )
        return uv

    def describe(self, *, build):
        """The steps, their pip commands, protection and cache."""
        lines = [
            f"target: {build.target_text}",
            "pip runs as the target env's own interpreter (<env>/bin/python -m pip), "
            "with the env activated",
        ]
        if not self.steps:
            lines.append(
                "no pip steps: record the environment's package list only "
                f"({PACKAGES_FILE}; skipped with a warning if the image has "
                "no `python -m pip`)"
            )
            return lines
        cache = self.settings.cache
        lines.append(
            f"pip cache: {self.cache_dir} (linked into the sandbox, never kept in the image)"
            if cache
            else "pip cache: off"
        )
        if self.uv:
            lines.append(
                f"uv {self.uv[1]} ({self.uv[0]}) for installer uv: copied into the "
                "sandbox, run in the container for the target env's interpreter, "
                "never kept in the image; its cache: "
                + (str(self.uv_cache_dir) if cache else "off")
            )
        for step, scan in zip(self.steps, self.scans):
            lines += _describe_step(step, scan, cache=cache)
        lines.append(f"then pip check: {self.settings.check} (output: {CHECK_FILE})")
        lines.append(f"records: {PIP_DIR}/stepN/, {STEPS_FILE}, {PACKAGES_FILE}")
        return lines

    def run(self, *, context):
        """Run the pip steps in order (no secret in a record or log line)."""
        with redacted_logs(values=step_secrets(self.steps)):
            return PipRun(stage=self, context=context).run()
