"""Installing system packages into the sandbox and recording what changed."""

import contextlib
from dataclasses import dataclass
import functools
import json
import logging
import re
import shutil
import subprocess
import time

from ... import imagelayout
from ...engine.rootfs import resolve_in_root, write_file_in_root
from ...errors import StageError
from .managers import Package, find_manager, refusal
from .proot import run_in_root

logger = logging.getLogger(f"cotainr.{__name__}")

WORK_DIR = imagelayout.SYSTEM_PACKAGES_WORK_DIR
#: The Debian way to keep a package from starting its service (exit 101).
POLICY_RC_D = "/usr/sbin/policy-rc.d"
#: The longest one run of the package manager may take.
TIMEOUT = 3600
_NETWORK_RE = re.compile(r"^(?:Err:\S* .*|[WE]: Failed to fetch .*)$", re.MULTILINE)
_INST_RE = re.compile(r"^Inst (\S+) ", re.MULTILINE)
_FIX = "Leave it out of system-packages, or install it in the base image as root."


@dataclass
class SystemPackagesRecord:
    """What the stage installed: the database delta of the package manager."""

    manager: str
    kind: str
    distro: str
    requested: list[str]
    added: list[Package]
    changed: list[Package]
    removed: list[Package]
    seconds: float


def _error(message, *, proc=None):
    details = None
    if proc is not None:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        details = "\n".join(lines[-40:])
    return StageError(message, stage="system-packages", details=details)


def _distro(root):
    """The image's distribution ID (``/etc/os-release``), for purls."""
    path = resolve_in_root(root=root, path="/etc/os-release")
    text = path.read_text(errors="replace") if path.is_file() else ""
    found = re.search(r'^ID="?([A-Za-z0-9._-]+)"?$', text, re.MULTILINE)
    return found.group(1) if found else "unknown"


@contextlib.contextmanager
def _scratch(*, root):
    """The work directory (host path of its ``tmp``); no service starts meanwhile."""
    work = resolve_in_root(root=root, path=WORK_DIR)
    for sub in ("lists/partial", "archives/partial", "cache", "tmp"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    policy = resolve_in_root(root=root, path=POLICY_RC_D)
    ours = policy.parent.is_dir() and not policy.exists()
    if ours:
        write_file_in_root(
            root=root, path=POLICY_RC_D, content="#!/bin/sh\nexit 101\n", mode=0o755
        )
    try:
        yield work / "tmp"
    finally:
        if ours:
            policy.unlink()
        shutil.rmtree(work, ignore_errors=True)


def _problem(manager, what, output, packages):
    """What the output of a run says went wrong (None: nothing)."""
    unknown = sorted({n for m in manager.unknown.findall(output) for n in m if n})
    if unknown:
        return (
            f"{manager.program} knows no package {', '.join(unknown)} (not in the "
            "base image's package sources). Check the name for this distribution."
        )
    fetch = _NETWORK_RE.search(output) if manager.kind == "deb" else None
    if fetch:
        return (
            f"{manager.program} {what} could not reach the base image's package "
            f"sources ({fetch.group(0).strip()}). Build where the network reaches "
            "the distribution's mirrors (set http_proxy/https_proxy for a proxy)."
        )
    return _refused(output, packages) if what == "check" else None


def _refused(output, packages):
    """The message for a package the simulation lists that needs real root."""
    for name in _INST_RE.findall(output):
        if refusal(name):
            pulled = "" if name in packages else " (pulled in by the packages)"
            return f"{name}{pulled} cannot be installed without root: {refusal(name)}. {_FIX}"
    return None


def _check(manager, what, proc, packages, root):
    """Raise the one error a run of the package manager calls for."""
    output = proc.stdout + proc.stderr
    problem = _problem(manager, what, output, packages)
    if problem is None and proc.returncode != 0:
        unfinished = manager.unfinished(root=root)
        problem = f"{manager.program} {what} failed (exit status {proc.returncode})."
        if unfinished:
            problem = (
                f"{', '.join(unfinished)} could not be set up under proot's fake "
                f"root: its installation script failed (it may need real root). {_FIX}"
            )
    if problem:
        raise _error(problem, proc=proc)


def _run(run, command):
    """One run of the package manager (a StageError if it cannot run or hangs)."""
    try:
        return run(command=command)
    except subprocess.TimeoutExpired:
        raise _error(f"{command[0]} did not finish in {TIMEOUT} s.") from None
    except OSError as e:
        raise _error(f"cannot run proot: {e}") from e


def install_packages(*, root, packages, proot):
    """Install `packages` with the image's package manager; the record."""
    t0 = time.time()
    manager = find_manager(root=root)
    if manager is None:
        raise _error(
            "the base image has no package manager to install them with (looked "
            "for /usr/bin/apt-get, /usr/bin/zypper and /usr/bin/dnf). Use a base "
            "image that has one, or drop system-packages."
        )
    with _scratch(root=root) as tmp:
        run = functools.partial(
            run_in_root, proot=proot, root=root, tmp=tmp, timeout=TIMEOUT
        )
        before = manager.installed(root=root, run=run)
        for what, command in manager.commands(packages=packages):
            logger.info("system-packages: %s", " ".join(command))
            proc = _run(run, command)
            logger.debug("%s", proc.stdout + proc.stderr)
            _check(manager, what, proc, packages, root)
        after = manager.installed(root=root, run=run)
    return SystemPackagesRecord(
        manager=manager.name,
        kind=manager.kind,
        distro=_distro(root),
        requested=packages,
        added=[p for n, p in sorted(after.items()) if n not in before],
        changed=[p for n, p in sorted(after.items()) if before.get(n, p) != p],
        removed=[p for n, p in sorted(before.items()) if n not in after],
        seconds=round(time.time() - t0, 1),
    )


def update_aif_sbom(*, root, record):
    """The AI Factory images' ``/.sbom.json`` ``apt`` list, kept current (or False)."""
    path = resolve_in_root(root=root, path=imagelayout.AIF_SBOM_FILE)
    try:
        sbom = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        sbom = None
    if not isinstance(sbom, dict) or not isinstance(sbom.get("apt"), list):
        return False
    gone = {p.name for p in record.removed + record.changed}
    apt = [
        e for e in sbom["apt"] if not isinstance(e, dict) or e.get("name") not in gone
    ]
    apt += [
        {"name": p.name, "version": p.version} for p in record.changed + record.added
    ]
    sbom["apt"] = apt
    text = json.dumps(sbom, indent=2) + "\n"
    write_file_in_root(root=root, path=imagelayout.AIF_SBOM_FILE, content=text)
    return True
