"""The benchmark command runs (quick mode) so it cannot rot; no thresholds."""

from pathlib import Path
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


def test_quick_benchmark_prints_every_section(
    apptainer_path, lumi_like_base_image, rocm_torch_base_image
):
    # Section 3 on the session's ROCm-layout fixture (the same derivation).
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "--quick",
            f"--rocm-torch-base={rocm_torch_base_image}",
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for header in (
        "1. stage overhead",
        "2. pruning scan",
        "3. bytes saved",
        "4. cached rebuild",
        "6. layered stacked builds",
    ):
        assert header in out
    assert re.search(r"cotainr --system=lumi-g-ext .*\d+\.\d\d+x", out)
    assert re.search(r"de-duplicated by the prune stage .* \d+%", out)
    assert re.search(r"second build .* [0-9.]+x faster", out)
    for kind in ("a copy of the base \\+ layer", "the layer alone"):
        assert re.search(rf"stacked, {kind} .* \d+\.\d\d+x", out), kind
