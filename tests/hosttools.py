"""Host tools some tests need: fail in CI, skip elsewhere.

``.ci/run`` installs every tool listed here, so in CI (``CI=true``) a
missing tool is a failure, never a skipped test standing in for a pass.
On a developer machine the test is skipped with the command that installs it.
"""

import os
import shutil

import pytest


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
