"""Host tools some tests need: fail in CI, skip elsewhere.

``.ci/run`` installs every tool listed here, so in CI (``CI=true``) a
missing tool is a failure, never a skipped test standing in for a pass.
On a developer machine the test is skipped with the command that installs it.
"""

import contextlib
import os
from pathlib import Path
import pwd
import shutil
import signal
import stat
import subprocess
import uuid

import pytest

#: Lmod's bash initialisation (Debian's ``lmod`` package).
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def in_ci() -> bool:
    """Whether the tests run in CI (``CI=true``)."""
    return os.environ.get("CI") == "true"


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def need_tool(*names: str, install: str) -> str:
    """Return the path of the first of `names` on PATH, or fail/skip."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    unavailable(f"{' or '.join(names)} not found on PATH ({install})")
    raise AssertionError("unreachable")


def need_root(why: str) -> None:
    """Fail/skip unless running as root."""
    if os.geteuid() != 0:
        unavailable(f"needs root: {why}")


def need_file(path: Path, *, install: str) -> Path:
    """Return `path` if it is a file on this machine, or fail/skip."""
    path = Path(path)
    if not path.is_file():
        unavailable(f"{path} is missing on this machine ({install})")
    return path


def need_lmod() -> Path:
    """Return Lmod's bash init script, or fail/skip."""
    return need_file(LMOD_INIT, install="apt-get install -y lmod")


#: Debian's MPICH 4.0.2 library (package libmpich12): a libmpi.so.12 that is
#: not the image's, standing in for LUMI's Cray MPICH in the MPI e2e tests.
LIBMPICH12 = Path("/usr/lib/x86_64-linux-gnu/libmpich.so.12")


def need_libmpich12() -> Path:
    """Return Debian's libmpich.so.12 (resolved), or fail/skip."""
    return need_file(LIBMPICH12, install="apt-get install -y libmpich12").resolve()


def need_proot() -> str:
    """Return Debian's proot (LUMI's PRoot module stands for it), or fail/skip."""
    return need_tool("proot", install="apt-get install -y proot")


@contextlib.contextmanager
def real_users(count, *, why):
    """Create `count` real users (root, useradd); yield their names; remove them."""
    need_root(why)
    useradd = need_tool("useradd", install="apt-get install -y passwd")
    names = [f"cl29{uuid.uuid4().hex[:8]}" for _ in range(count)]
    try:
        for name in names:
            subprocess.run([useradd, "-M", "-s", "/bin/sh", name], check=True)
        yield names
    finally:
        for name in names:
            # What the users' runs left in /tmp (e.g. the runscripts' caches)
            leftovers = list(Path("/tmp").glob(f"{name}-*"))
            if leftovers:
                remove_dirs_of(name, *leftovers)
            subprocess.run(["userdel", name], capture_output=True, check=False)


def as_user(name):
    """The command prefix running a command as user `name` (setpriv, no PAM)."""
    user = pwd.getpwnam(name)
    return [
        need_tool("setpriv", install="apt-get install -y util-linux"),
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        "--clear-groups",
        "--",
    ]


@contextlib.contextmanager
def racing_user(name, *, path, target):
    """User `name` loops mkdir -m 777 / rmdir / symlink to `target` / rm at `path`."""
    loop = (
        'while :; do mkdir -m 777 "$1"; rmdir "$1"; ln -s "$2" "$1"; rm -f "$1"; '
        "done 2>/dev/null"
    )
    command = ["timeout", "900", "sh", "-c", loop, "sh", str(path), str(target)]
    proc = subprocess.Popen(as_user(name) + command, start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def remove_dirs_of(name, *paths):
    """Remove those of `paths` that are directories (not links) of user `name`."""
    uid = pwd.getpwnam(name).pw_uid
    for path in paths:
        try:
            info = os.lstat(path)
        except FileNotFoundError:  # a racing user's, gone
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            shutil.rmtree(path)
