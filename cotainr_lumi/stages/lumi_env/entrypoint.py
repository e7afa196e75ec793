"""
The environment the image's runscript prepares, for ``exec`` and ``shell`` too.

``run`` runs the runscript (for an OCI image: its ``ENTRYPOINT``), ``exec``
skips it. No shell is read: at each start but ``run``'s, the env file
(``entrypoint-env.sh``) runs it with a reporter (``entrypoint-report.sh``) as
its command and applies what it changed. The build runs it so once, read-only,
in a one-node job: one that fails, hangs, prints or does not run its command
gets one message and no effect.
"""

import importlib.resources
import logging
import shlex
import subprocess

from ... import apptainer
from ...engine.rootfs import resolve_in_root, write_file_in_root
from ...errors import clip_output
from ...imagelayout import ENTRYPOINT_ENV_FILE, ENTRYPOINT_REPORTER_FILE, RUNSCRIPT_FILE
from .validators import PATH_VARIABLES, RESERVED_NAMES, RESERVED_PREFIXES

logger = logging.getLogger(f"cotainr.{__name__}")

#: The reporter's first line.
MARKER = "cotainr-lumi-entrypoint-env"
#: The build's run: a one-node job's environment as Slurm sets it.
PROBE_JOB = dict(
    SLURM_JOB_ID="1", SLURM_NNODES="1", SLURM_PROCID="0", SLURM_LOCALID="0"
)
#: Seconds the build waits for each run (Apptainer's own limit for env files).
PROBE_TIMEOUT = 60
#: Shell and runtime state, never taken over from the runscript.
KEPT_NAMES = RESERVED_NAMES - PATH_VARIABLES


def _shipped(name):
    return (importlib.resources.files(__package__) / name).read_text()


def env_file_text(*, runscript=RUNSCRIPT_FILE, reporter=ENTRYPOINT_REPORTER_FILE):
    """The env file: the runscript's changes applied (the given paths: tests)."""
    prefixes = [f"{p}*" for p in RESERVED_PREFIXES]
    kept = " | ".join([*sorted(KEPT_NAMES), *prefixes])
    text = _shipped("entrypoint-env.sh").replace("@SKIP@", kept)
    text = text.replace("@RUNSCRIPT@", shlex.quote(runscript))
    return text.replace("@REPORTER@", shlex.quote(reporter))


def _clip(text):
    return clip_output(text, limit=300)


def _run(root, args):
    """One start of the sandbox with `args` (None: it did not finish)."""
    try:
        return apptainer.exec_in_image(
            image=root, args=args, env=PROBE_JOB, timeout=PROBE_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return None


def problem(before, after):
    """Why the runscript does more than prepare the env (reporter runs without, with it)."""
    if None in (before, after):
        return f"did not finish within {PROBE_TIMEOUT} s"
    if not before.stdout.startswith(MARKER):
        return f"could not be checked: /bin/sh fails here ({_clip(before.stderr)})"
    if after.returncode:
        return f"exited with status {after.returncode} ({_clip(after.stderr)})"
    head, found, _ = after.stdout.partition(MARKER)
    if not found:
        return f"did not run its command (it printed {_clip(head)!r})"
    if head:
        return f"printed {_clip(head)!r} before running its command"
    seen = before.stderr.splitlines()
    extra = [line for line in after.stderr.splitlines() if line not in seen]
    if extra:
        return f"printed {_clip(chr(10).join(extra))!r} on stderr"
    return None


def changed_names(before, after):
    """The variables the runscript set, changed or removed (reporter outputs)."""
    lines = set(before.splitlines()) ^ set(after.splitlines())
    names = {line.partition("=")[0] for line in lines} - KEPT_NAMES
    return sorted(n for n in names if not n.startswith(RESERVED_PREFIXES))


def write_entrypoint_env(*, root):
    """Write the env file (the runscript's changes if it only prepares them); label."""
    # First without effect: a previous build's must not run in the build's runs.
    note = "# cotainr-lumi: nothing (see the label cotainr-lumi.oci-entrypoint)\n"
    write_file_in_root(root=root, path=ENTRYPOINT_ENV_FILE, content=note)
    if not resolve_in_root(root=root, path=RUNSCRIPT_FILE).is_file():
        return ""
    reporter = _shipped("entrypoint-report.sh")
    write_file_in_root(root=root, path=ENTRYPOINT_REPORTER_FILE, content=reporter)
    before = _run(root, ["/bin/sh", ENTRYPOINT_REPORTER_FILE])
    after = _run(root, [RUNSCRIPT_FILE, "/bin/sh", ENTRYPOINT_REPORTER_FILE])
    why = problem(before, after)
    if why:
        log = logger.info if "did not run its command" in why else logger.warning
        log(
            "The base image's runscript %s (what `singularity run` runs; for an "
            "OCI image its ENTRYPOINT) %s: exec and the runscripts do not get the "
            "environment it prepares; use `singularity run` for that.",
            RUNSCRIPT_FILE,
            why,
        )
        return f"not applied: {RUNSCRIPT_FILE} {why}"
    write_file_in_root(root=root, path=ENTRYPOINT_ENV_FILE, content=env_file_text())
    changed = ", ".join(changed_names(before.stdout, after.stdout)) or "nothing"
    logger.info("exec gets the environment %s prepares", RUNSCRIPT_FILE)
    return (
        f"applied at each start but run's: {RUNSCRIPT_FILE} runs "
        f"{ENTRYPOINT_REPORTER_FILE} and the variables it changed are set "
        f"(in a one-node job: {changed})"
    )
