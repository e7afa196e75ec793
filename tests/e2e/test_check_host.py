"""The installed ``cotainr-lumi check-host`` on a test root laid out like LUMI (no Apptainer)."""

import json
import os
from pathlib import Path
import subprocess
import sys

from errorlines import error_lines
from hostroot import facts, libfabric_dir, lumi_2026, write_profile
import pytest

pytestmark = pytest.mark.e2e


def _check_host(*args, profile):
    return subprocess.run(
        [str(Path(sys.executable).with_name("cotainr-lumi")), "check-host", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COTAINR_LUMI_SYSTEMS": profile},
        timeout=300,
        check=False,
    )


def test_check_host_passes_today_and_reports_moved_facts(tmp_path):
    """On a host tree built from LUMI's published facts (tests/hostroot.py)."""
    profile = write_profile(tmp_path / "site.yaml")
    today = str(lumi_2026(tmp_path / "today"))
    proc = _check_host("--root", today, "--system", "lumi-2026", profile=profile)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"check-host {today}: 18 PASS, 0 FAIL, 0 N/A" in proc.stdout
    # After the next update: the driver is newer, the image link re-pointed
    # (at a real name of LUST's with ROCm 6.0).
    other = Path(facts("lust-pytorch-user-md")["example-image"]).name
    moved = str(lumi_2026(tmp_path / "moved", driver="7.1.70100", image_target=other))
    proc = _check_host("--root", moved, "--system", "lumi-2026", profile=profile)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 2 and "rocm.supported" in failed[1], proc.stdout
    # LUST's 24.03 bindings, as JSON: PE 24.03 is still installed, its
    # libfabric is not (the row names the fix).
    proc = _check_host(
        "--root", today, "--system", "lumi-2024", "--json", profile=profile
    )
    assert proc.returncode == 1, proc.stderr
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert rows["mpi /opt/cray/pe/pmi/6.1.14/lib"]["status"] == "PASS"
    row = rows["mpi /opt/cray/libfabric/1.15.2.0/lib64"]
    assert row["status"] == "FAIL"
    assert f"it may be {libfabric_dir()}" in row["evidence"]
    proc = _check_host("--root", str(tmp_path / "none"), profile=profile)
    assert proc.returncode == 2
    assert error_lines(proc.stderr)[0].startswith("cotainr-lumi: error: --root")


def test_check_host_reports_the_compressors_this_runtime_mounts(
    tmp_path, apptainer_path
):
    """On /: a tiny image of each compressor, run by the real runtime."""
    profile = write_profile(tmp_path / "site.yaml")
    proc = _check_host("--system", "lumi-2026", "--json", profile=profile)
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    for name in ("gzip", "zstd", "lz4", "xz"):  # Debian's kernel mounts all four
        row = rows[f"squashfs {name}"]
        assert row["status"] == "PASS", row
