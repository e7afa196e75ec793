"""Host tools some tests need: fail in CI, skip elsewhere.

``.ci/run`` installs every tool listed here, so in CI (``CI=true``) a
missing tool is a failure, never a skipped test standing in for a pass.
On a developer machine the test is skipped with the command that installs it.
"""

import os
from pathlib import Path
import shutil

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
