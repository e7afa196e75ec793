"""Running a pip stage's steps in the sandbox: staging, pinning, pip, records."""

import contextlib
from dataclasses import dataclass
import glob
import json
import logging
import os
from pathlib import Path
import shlex
import shutil
import time
from typing import Callable

from ... import apptainer, imagelayout
from ...engine.rootfs import resolve_in_root, write_file_in_root
from ...engine.stage import StageReport
from ...errors import SECRET_NAME_RE, StageError, redact
from ...processes import CommandError
from .cache import export_cache, import_cache
from .hostenv import host_pip_overrides
from .protect import (
    check_protected,
    constraints_text,
    describe_changes,
    explain_conflicts,
    parse_pip_check,
    parse_pip_list,
)
from .requirements import StagedStep
from .sbom import write_sboms
from .uv import (
    UNSET_UV_VARIABLES,
    UV_BIN,
    UV_CACHE_DIR,
    explain_uv_conflicts,
    parse_uv_check,
    uv_command,
    uv_env,
    uv_in_sandbox,
)

logger = logging.getLogger(f"cotainr.{__name__}")

PIP_DIR = imagelayout.PIP_DIR
PACKAGES_FILE = imagelayout.PIP_PACKAGES_FILE
STEPS_FILE = imagelayout.PIP_STEPS_FILE
#: Removed before the image is built: staged files and the cache.
WORK_DIR = imagelayout.PIP_WORK_DIR
#: The host pip cache while the steps run.
CACHE_DIR = f"{WORK_DIR}/cache"
#: ``pip check``'s output after the last step.
CHECK_FILE = f"{PIP_DIR}/pip-check.txt"

#: Host pip variables that would send packages elsewhere than the active env.
UNSET_PIP_VARIABLES = (
    "PIP_TARGET PIP_PREFIX PIP_ROOT PIP_USER PIP_REQUIRE_VIRTUALENV PIP_REQUIRE_VENV "
    "PIP_EDITABLE"
)


def _timed(function, **kwargs):
    """``function(**kwargs)`` (a dict), with the ``seconds`` it took added."""
    t0 = time.time()
    result = function(**kwargs)
    result["seconds"] = round(time.time() - t0, 2)
    return result


def step_secrets(steps):
    """The values of the steps' secret variables (hidden in logs and errors)."""
    return [v for s in steps for k, v in s.env.items() if SECRET_NAME_RE.search(k)]


@contextlib.contextmanager
def redacted_logs(*, values):
    """Every log record made meanwhile (pip's output too) :func:`redact`-ed."""
    make = logging.getLogRecordFactory()

    def redacted(*args, **kwargs):
        record = make(*args, **kwargs)
        record.msg = redact(record.getMessage(), values=values)
        record.args = ()
        return record

    logging.setLogRecordFactory(redacted)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make)


def _pip_error_lines(output, *, limit=60):
    """Pip's own error output without warnings (the last `limit` lines)."""
    keep = [
        ln
        for ln in output.splitlines()
        if ln.strip()
        and not ln.lstrip().startswith(("WARNING:", "DEPRECATION:", "Looking in"))
    ]
    first_error = next(
        (i for i, ln in enumerate(keep) if ln.lstrip().lower().startswith("error")),
        None,
    )
    if first_error is not None:
        keep = keep[max(0, first_error - 20) :]
    return "\n".join(keep[-limit:])


def pip_command(*, cache_dir, python):
    """The ``pip install`` command line (in the container), before a step's arguments."""
    cmd = [python, "-m", "pip", "install", "--no-input"]
    cmd += ["--disable-pip-version-check", "--progress-bar", "off"]
    return cmd + (["--cache-dir", cache_dir] if cache_dir else ["--no-cache-dir"])


@dataclass(frozen=True)
class Installer:
    """What pip and uv do differently: a step is otherwise the same for both."""

    name: str  # how messages name its list and check
    install: Callable  # (cache_dir, python) -> the install command's start
    cache_dir: str  # its cache in the sandbox while the steps run
    unset: str  # host variables unset for the install
    explain: Callable  # which protected packages a failed install was about
    list_args: tuple
    verdict: str  # what its check says when nothing is broken
    parse_check: Callable

    def command(self, sub, *, python, args=()):
        """The command ``SUB`` (list or check) on the target env's `python`."""
        if self.name == "pip":
            return [python, "-m", "pip", sub, *args]
        return [UV_BIN, "--color", "never", "pip", sub, "--python", python, *args]


#: The installers of pip steps, by name.
INSTALLERS = {
    "pip": Installer(
        "pip",
        pip_command,
        CACHE_DIR,
        UNSET_PIP_VARIABLES,
        explain_conflicts,
        ("--format", "json", "--disable-pip-version-check"),
        "No broken requirements found.",
        parse_pip_check,
    ),
    "uv": Installer(
        "uv pip",
        uv_command,
        UV_CACHE_DIR,
        UNSET_UV_VARIABLES,
        explain_uv_conflicts,
        ("--format", "json"),
        "All installed packages are compatible",
        parse_uv_check,
    ),
}


def step_dir(step):
    """Where a step's requirement files and constraints are kept in the image."""
    return f"{PIP_DIR}/step{step.number}"


def constraints_file(step):
    """Where a step's constraints pinning what is installed before it are."""
    return f"{step_dir(step)}/protected-constraints.txt"


def install_command(*, step, requirement_files, cache, python="python"):
    """A step's install command: pip's or uv's (`cache`: the host caches used)."""
    installer = INSTALLERS[step.installer]
    cache_dir = installer.cache_dir if cache else None
    args = step.install_args(
        requirement_files=requirement_files, constraints=constraints_file(step)
    )
    return installer.install(cache_dir=cache_dir, python=python) + args


@contextlib.contextmanager
def private_wheel_cache(*, root, step, cache):
    """Hide the cache of built wheels from steps whose builds depend on the image."""
    if not cache or not (step.no_build_isolation or step.env):
        yield
        return
    top = resolve_in_root(root=root, path=INSTALLERS[step.installer].cache_dir)
    # pip's wheels built from source, uv's (its downloads are in wheels-vN).
    built = [top / "wheels", *map(Path, glob.glob(str(top / "sdists-v*")))]
    moved = []
    for path in built:
        if path.exists():
            aside = path.with_name(f".{path.name}-aside")
            shutil.move(path, aside)
            moved.append((path, aside))
    try:
        yield
    finally:
        for path in built:
            shutil.rmtree(path, ignore_errors=True)
        for path, aside in moved:
            shutil.move(aside, path)


def install_error(error, *, step, before, staged):
    """The StageError for a failed ``pip install`` (conflicts explained)."""
    output = redact(f"{error.stdout}\n{error.stderr}", values=step_secrets([step]))
    explain = INSTALLERS[step.installer].explain
    conflicts = explain(output=output, installed=before, allowed=step.allow_changes)
    message = (
        f"{step.installer} install failed in {step.title} "
        f"(exit status {error.returncode})."
    )
    if conflicts:
        names = ", ".join(c.name for c in conflicts)
        message = (
            f"{step.title} would change protected package(s) {names}:\n"
            + "\n".join(f"  {c.describe()}" for c in conflicts)
            + "\nPackages installed before a step are not upgraded, "
            "downgraded or removed. Fix the requirement, or let this step "
            f"change them with 'allow-changes: [{names}]' in the step."
        )
    files = "\n".join(f"  {k} <- {v}" for k, v in staged.kept_files.items())
    return StageError(
        message,
        stage="pip",
        details=(
            f"{step.installer}'s error output:\n"
            + _pip_error_lines(output)
            + f"\nRequirement files (in the image <- from):\n{files}"
        ),
    )


def _broken_message(tools, broken):
    """The message on ``pip check``'s broken requirements."""
    names = ", ".join(dict.fromkeys(n for *_, involved in broken for n in involved))
    return (
        f"{tools.name} check after the pip steps: broken requirements of {names}:\n"
        + "".join(f"  {pkg} {problem}\n" for pkg, problem, _ in broken)
        + "Fix: pin versions that fit together in a step (a package an "
        "earlier step installed changes only if the step lists it in "
        "allow-changes)."
    )


class PipRun:
    """One run of a pip stage's steps in a sandbox (the target env, pip's env)."""

    def __init__(self, *, stage, context):
        self.stage = stage
        self.settings = stage.settings
        self.context = context
        self.root = context.sandbox.root
        self.installers = {step.installer for step in stage.steps}
        self.pip_env = {}  # host pip variables replaced (see hostenv)
        self.target = None
        self.tools = INSTALLERS["pip"]  # what lists and checks the target env
        if "uv" in self.installers:  # uv, when a step uses it (maybe no pip)
            self.tools = INSTALLERS["uv"]
        self.base_packages = None  # before the first step (pip list form)
        self.listed = None  # the last _pip_list (nothing installed since)

    def _run(self, command, *, env=None, script=""):
        """Run `command` (a list) in the target env, after `script`."""
        activate = f"{self.target.activation()}; {script}"
        env = {**self.pip_env, **(env or {})} or None
        return self.context.sandbox.run(
            ["bash", "-c", f"{activate}exec {shlex.join(command)}"], env=env
        )

    def _pip_list(self, *, check=False):
        """(installed by canonical name, the list); `check`: ``pip check`` first."""
        python = self.target.python
        script = ""
        if check:
            checking = self.tools.command("check", python=python)
            script = f"{shlex.join(checking)} >{CHECK_FILE} 2>&1; "
        listing = self.tools.command("list", python=python, args=self.tools.list_args)
        try:
            return parse_pip_list(text=self._run(listing, script=script).stdout)
        except ValueError as e:
            raise StageError(
                f"cannot read the installed packages: {e}", stage="pip"
            ) from e

    def _check_pip(self, target):
        """The target env's record, with the version of its pip (which must work)."""
        self.target = target
        info = {
            k: getattr(target, k) for k in ("prefix", "version", "source", "reason")
        }
        info["executable"] = target.python
        if self.stage.uv:
            info["uv"] = self.stage.uv[1]
        try:
            proc = self._run([target.python, "-m", "pip", "--version"])
        except CommandError as e:
            if self.installers == {"uv"}:  # uv installs and lists: no pip needed
                return info
            raise StageError(
                f"the target environment {target.prefix} ({target.reason}) has no "
                f"working `python -m pip` ({target.python}). Install pip into it "
                "in the base image, or give a conda env (--conda-env).",
                stage="pip",
                details=e.error_lines(),
            ) from e
        for line in proc.stdout.splitlines():
            if line.startswith("pip "):
                info["pip"] = line.split()[1]
        return info

    @contextlib.contextmanager
    def _work_dir(self):
        """A fresh :data:`WORK_DIR`: the host pip cache in it, uv's mounted there.

        Yields the record of the caches (filled in when the steps are done).
        """
        work = resolve_in_root(root=self.root, path=WORK_DIR)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        sandbox_cache = resolve_in_root(root=self.root, path=CACHE_DIR)
        host_cache = self.stage.cache_dir
        stats = {"dir": None}
        uv_cache = None
        if self.settings.cache:
            stats["dir"] = str(host_cache)
        if self.settings.cache and self.stage.uv:
            uv_cache = self.stage.uv_cache_dir
            stats["uv-dir"] = str(uv_cache)
        pip_cache = self.settings.cache and "pip" in self.installers
        try:
            if pip_cache:
                stats["import"] = _timed(
                    import_cache, host_dir=host_cache, sandbox_dir=sandbox_cache
                )
                logger.info(
                    "pip cache %s: %d files linked/copied into the sandbox",
                    host_cache,
                    stats["import"]["files"],
                )
            with uv_in_sandbox(
                root=self.root, uv=self.stage.uv, cache=uv_cache, run=self._run
            ):
                yield stats
        finally:
            if pip_cache:
                stats["export"] = _timed(
                    export_cache, sandbox_dir=sandbox_cache, host_dir=host_cache
                )
            shutil.rmtree(work, ignore_errors=True)

    def run(self):
        """Run the pip steps in order; record the packages and SBOMs."""
        if self.stage.steps:
            record = self._run_steps()
            summary = f"{len(self.stage.steps)} step(s) into {self.target.prefix}; "
            return self._report(record, summary=summary)
        target = self.context.target_env
        try:  # no steps: keep the env's package list (if pip can list it)
            if target is None:
                raise StageError("no Python environment in the image", stage="pip")
            info = self._check_pip(target)
            summary = f"no pip steps; package list of {target.prefix}: "
            return self._report({"target": info, "steps": []}, summary=summary)
        except (StageError, CommandError) as e:
            logger.warning(
                "No pip steps and no package list: %s",
                str(e).splitlines()[0] if str(e) else type(e).__name__,
            )
            return StageReport(
                name="pip",
                summary="no pip steps; no package list (no Python env with pip in the image)",
            )

    def _report(self, details, *, summary):
        """Write the package list, the SBOMs and the steps record; the report."""
        installed, packages = self.listed or self._pip_list()
        details["sbom"] = write_sboms(
            root=self.root,
            image_name=Path(self.context.build.image_path).name,
            packages=packages,
            base_packages=self.base_packages,
            target_prefix=self.target.prefix,
            base_image=self.context.build.base_image.given,
        )
        labels = {
            imagelayout.LABEL_PIP_PACKAGES: PACKAGES_FILE,
            imagelayout.LABEL_SBOM: imagelayout.CYCLONEDX_SBOM_FILE,
        }
        records = {PACKAGES_FILE: packages}
        if self.stage.steps:
            labels[imagelayout.LABEL_PIP_STEPS] = STEPS_FILE
            records[STEPS_FILE] = details
        for path, data in records.items():
            text = json.dumps(data, indent=2, sort_keys=True) + "\n"
            write_file_in_root(root=self.root, path=path, content=text)
        summary += f"{len(installed)} distributions"
        if "torch" in installed:
            summary += f" (torch {installed['torch'][1]})"
        return StageReport(name="pip", summary=summary, record=details, labels=labels)

    def _run_steps(self):
        """Check pip, run every step; the steps record."""
        for scan in self.stage.scans:
            for moving in scan.moving_refs:
                logger.warning("Not pinned: %s", moving)
        info = self._check_pip(self.context.require_target_env(stage="pip"))
        logger.info(
            "pip steps install into %s (python %s at %s, pip %s)",
            info["prefix"],
            info["version"],
            info["executable"],
            info.get("pip"),
        )
        self.pip_env = host_pip_overrides(root=self.root, environ=os.environ)
        with self._work_dir() as cache:
            records = [
                self._run_step(step=step, scan=scan)
                for step, scan in zip(self.stage.steps, self.stage.scans)
            ]
        record = {"target": info, "steps": records, "cache": cache}
        record["check"] = self._pip_check()
        return record

    def _pip_check(self):
        """``pip check``'s broken requirements after the steps: warned about, or fatal."""
        if self.settings.check == "off":
            return None
        path = resolve_in_root(root=self.root, path=CHECK_FILE)
        text = path.read_text(errors="replace") if path.is_file() else ""
        broken = self.tools.parse_check(text=text)
        if not broken:
            if self.tools.verdict not in text:
                logger.warning(
                    "%s check gave no verdict: %s", self.tools.name, text[-500:]
                )
            return []
        message = _broken_message(self.tools, broken)
        if self.settings.check == "strict":
            raise StageError(f"{message} Or build anyway: pip.check=warn.", stage="pip")
        logger.warning("%s pip.check=strict makes this an error.", message)
        return [{"package": p, "problem": q, "involved": i} for p, q, i in broken]

    def _install(self, *, step, staged, before):
        """Run the step's install command in the target env; return it redacted."""
        env = step.env
        if step.installer == "uv":
            env = {**uv_env(environ=os.environ, overrides=self.pip_env), **env}
        cmd = install_command(
            step=step,
            requirement_files=staged.requirement_files,
            cache=self.settings.cache,
            python=self.target.python,
        )
        shown = [redact(arg) for arg in cmd]
        logger.info("Running: %s", shlex.join(shown))
        script = f"unset {INSTALLERS[step.installer].unset}; "
        try:
            with private_wheel_cache(
                root=self.root, step=step, cache=self.settings.cache
            ):
                with apptainer.bind_mounts(staged.binds):
                    self._run(cmd, env=env, script=script)
        except CommandError as e:
            raise install_error(e, step=step, before=before, staged=staged) from e
        finally:  # pip has read them: the image keeps them without credentials
            for path in staged.kept_files:
                text = resolve_in_root(root=self.root, path=path).read_text()
                write_file_in_root(root=self.root, path=path, content=redact(text))
        return shown

    def _run_step(self, *, step, scan):
        """Stage, pin, install and check one step; return its record."""
        logger.info("pip %s", step.title)
        t0 = time.time()
        staging_dir = f"{WORK_DIR}/staging/step{step.number}"
        staged = StagedStep(
            scan=scan, root=self.root, keep_dir=step_dir(step), staging_dir=staging_dir
        )
        before, packages = self.listed or self._pip_list()
        if step.number == 1:
            self.base_packages = packages
        write_file_in_root(
            root=self.root,
            path=constraints_file(step),
            content=constraints_text(installed=before, allowed=step.allow_changes),
        )
        cmd = self._install(step=step, staged=staged, before=before)
        last = step.number == len(self.stage.steps) and self.settings.check != "off"
        self.listed = self._pip_list(check=last)
        after = self.listed[0]
        check_protected(step=step, before=before, after=after)
        staging = resolve_in_root(root=self.root, path=staging_dir)
        shutil.rmtree(staging, ignore_errors=True)
        diff = describe_changes(before=before, after=after)
        logger.info(
            "Finished pip %s in %.1f s: %d added, %d changed",
            step.title,
            time.time() - t0,
            len(diff["added"]),
            len(diff["changed"]),
        )
        settings = step.to_dict()
        return {
            "number": step.number,
            **{k: settings[k] for k in ("name", "source", "installer", "env")},
            "command": cmd,
            "requirement-files": staged.kept_files,
            "staged": staged.staged,
            "allow-changes": settings["allow-changes"],
            "seconds": round(time.time() - t0, 1),
            **diff,
        }
