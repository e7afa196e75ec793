"""End-to-end: a layered build touches only the cotainr names listed for plugins.

Issue 41: on a cotainr with the build hook (the upstream series), cotainr-lumi
uses only what ``docs/upstream/seam-api.md`` lists ("What a plugin may use"),
never a private name. The guard (``tests/seam_guard/``) records every other
access from cotainr-lumi's code in the ``cotainr`` process.

It needs a cotainr with the series applied, so the README's command (on the
cotainr release) deselects it (marker ``seam_guard``, pyproject.toml's
addopts); ``scripts/check-upstream-series.sh`` runs it on the whole series
(in CI), as does ``scripts/e2e-on-series.sh -m seam_guard
tests/e2e/test_seam_guard.py``.
"""

import os
from pathlib import Path

from pkgfixtures import make_wheel
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.seam_guard]

GUARD = Path(__file__).parents[1] / "seam_guard"


def _cotainr_plugins():
    """cotainr's plugins module (None: a cotainr without plugins)."""
    try:
        from cotainr import plugins
    except ImportError:
        return None
    return plugins


def test_a_layered_build_uses_only_the_listed_cotainr_names(
    tmp_path, lumi_like_base_image, write_systems, cotainr_build
):
    assert getattr(_cotainr_plugins(), "HOOK_API_VERSION", None) == 1, (
        "needs a cotainr with the build hook: scripts/e2e-on-series.sh"
    )
    write_systems(
        tmp_path / "systems.yaml", {"guard-e2e": {"base-image": lumi_like_base_image}}
    )
    make_wheel(tmp_path, "keep", "1.0")
    (tmp_path / "requirements.txt").write_text("./keep-1.0-py3-none-any.whl\n")
    report = tmp_path / "seam-guard.txt"
    path = os.pathsep.join(filter(None, [str(GUARD), os.environ.get("PYTHONPATH")]))
    run = cotainr_build(
        tmp_path,
        tmp_path / "guarded.sif",
        "--system",
        "guard-e2e",
        "--pip-requirements",
        "requirements.txt",
        env={"PYTHONPATH": path, "COTAINR_LUMI_SEAM_GUARD": str(report)},
    )
    assert "Layered image: " in run.stdout  # the base mounted, a layer written
    found = report.read_text().splitlines()
    assert found == [], "cotainr-lumi touched:\n" + "\n".join(found)
