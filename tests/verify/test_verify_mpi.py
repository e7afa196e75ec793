"""Tests of verify's MPI rows (verify/mpi.py) and of the MPI part of its probe.

The probe runs here with this machine's python; a stand-in check answers for
the image's mpi4py. The real image is checked in tests/e2e/test_mpi_image.py.
"""

import copy
import json
from pathlib import Path
import subprocess
import sys

from verifyprobe import run_probe

from cotainr_lumi.stages.lumi_env.mpi import LOAD_CHECK_MARK
from cotainr_lumi.verify import mpi as verify_mpi
from cotainr_lumi.verify.checks import VerifyReport

LIB = "/opt/env/lib/libmpi.so.12"
CRAY = "/opt/cray/pe/mpich/8.1.29/ofi/gnu/12.3/lib-abi-mpich/libmpi.so.12"


def check_output(**loaded):
    """What the mpi4py check prints."""
    return {"rc": 0, "out": LOAD_CHECK_MARK + json.dumps(loaded) + "\n", "err": ""}


RECORD = {
    "mode": "host",
    "reason": "auto: the image's MPICH does not speak CXI",
    "image-library": LIB,
    "host": {
        "libmpi": CRAY,
        "ld-library-path": [str(Path(CRAY).parent), "/opt/cray/pe/lib64"],
        "mpi4py-libmpi": CRAY,
        "binds": ["/opt/cray", "/usr/lib64/libjansson.so.4"],
    },
    "srun": {"host": "srun (cray_shasta)", "container": "srun --mpi=pmi2"},
    "pins": [],
}
FACTS = {
    "record": RECORD,
    "check": check_output(
        mpi4py="4.1.2", library_version="MPICH Version: 5.0.2", libmpi=[LIB]
    ),
    "ldd": {LIB: {"rc": 0, "deps": {"libfabric.so.1": "/opt/env/lib/mpich/x"}}},
}


def rows(facts):
    return {check: (status, text) for check, status, text in verify_mpi.mpi_rows(facts)}


def test_an_image_with_mpi_gets_three_rows():
    got = rows(FACTS)
    status, text = got["mpi4py-libmpi"]
    assert status == "PASS" and LIB in text and "5.0.2" in text and "4.1.2" in text
    status, text = got["mpi-host-binding"]
    assert status == "PASS" and text.startswith("default host:")
    assert f"{CRAY} replaces {LIB}" in text and "libjansson" in text
    status, text = got["mpi-osu-bandwidth"]
    assert status == "N/A" and "cd examples/slurm && sbatch --account=" in text


def test_an_image_without_mpi_gets_none():
    facts = dict(
        FACTS,
        record=None,
        check=check_output(error="ModuleNotFoundError: No module named 'mpi4py'"),
    )
    assert verify_mpi.mpi_rows(facts) == []
    assert verify_mpi.mpi_rows(dict(facts, record={"mode": "none"})) == []
    # The main probe's facts (an older image, a mocked exec): no rows.
    assert verify_mpi.mpi_rows({"env": {}}) == [] and verify_mpi.mpi_rows(None) == []


def test_unresolved_dependencies_and_another_abi_fail():
    facts = copy.deepcopy(FACTS)
    facts["ldd"][LIB]["deps"] = {"libucp.so.0": None}
    status, text = rows(facts)["mpi4py-libmpi"]
    assert status == "FAIL" and "libucp.so.0 => not found" in text
    facts = copy.deepcopy(FACTS)
    facts["check"] = check_output(
        libmpi=["/opt/env/lib/libmpi.so.40"], library_version="Open MPI v5"
    )
    status, text = rows(facts)["mpi4py-libmpi"]
    assert status == "FAIL" and "not an MPICH-ABI libmpi.so.12" in text


def test_a_pin_fails_the_binding_row_and_container_mode_says_how_to_switch():
    facts = copy.deepcopy(FACTS)
    facts["record"]["pins"] = [
        {"user": "/x.so", "library": LIB, "entry": "$ORIGIN", "via": "its DT_RPATH"}
    ]
    assert rows(facts)["mpi-host-binding"][0] == "FAIL"
    facts = copy.deepcopy(FACTS)
    facts["record"].update(mode="container", reason="speaks CXI")
    status, text = rows(facts)["mpi-host-binding"]
    assert (
        status == "PASS" and "COTAINR_LUMI_MPI=host:" in text and "--mpi=pmi2" in text
    )


def test_mpi4py_without_a_library_of_its_own_is_not_a_failure():
    facts = copy.deepcopy(FACTS)
    facts["record"]["image-library"] = None
    facts["check"] = check_output(error="RuntimeError: cannot load MPI library")
    status, text = rows(facts)["mpi4py-libmpi"]
    assert status == "N/A" and "only with the host binding" in text


def test_the_probe_runs_the_check_and_ldd_in_the_one_verify_run(tmp_path):
    libc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes.util; print(ctypes.util.find_library('c'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    real = next(p for p in Path("/lib/x86_64-linux-gnu").glob(libc + "*"))
    # The check as the image's mpi4py would answer it: this library loaded.
    answer = LOAD_CHECK_MARK + json.dumps({"libmpi": [str(real)]})
    mpi_inputs = dict(
        mpi_file=str(tmp_path / "missing.json"),
        load_check=f"print({answer!r})",
        load_check_mark=LOAD_CHECK_MARK,
    )
    facts, _ = run_probe(tmp_path, mpi=mpi_inputs)
    assert facts["mpi"]["record"] is None
    assert facts["mpi"]["ldd"][str(real)]["rc"] == 0
    status, _ = rows(facts["mpi"])["mpi4py-libmpi"]
    assert status == "FAIL"  # libc is not an MPICH-ABI library


def test_a_discover_image_passes_with_or_without_a_build_host_mpich():
    facts = copy.deepcopy(FACTS)
    facts["record"]["host"].update(setting="discover", version="8.1.32")
    status, text = rows(facts)["mpi-host-binding"]
    assert status == "PASS"
    assert f"the Cray MPICH the module file finds on load (at build: {CRAY})" in text
    facts["record"]["host"].update(
        libmpi=None, version=None, **{"mpi4py-libmpi": "$COTAINR_LUMI_MPI_HOST_LIBMPI"}
    )
    status, text = rows(facts)["mpi-host-binding"]
    assert status == "PASS" and "(at build: none)" in text


def gpu_aware_rows(facts):
    """The ``mpi-gpu-aware`` rows check_mpi adds for the probe's facts."""
    report = VerifyReport(image="x.sif")
    verify_mpi.check_mpi(report, facts)
    return [r for r in report.results if r.check == "mpi-gpu-aware"]


def test_a_rocm_7_image_with_a_host_binding_warns_gpu_aware_mpi():
    """LUMI's Update-202601: no Cray MPICH up to PE 25.09 is GPU-aware with ROCm 7."""
    facts = {"mpi": FACTS, "rocm": {"version_file": "7.0.2-56"}}
    [(check, status, text)] = gpu_aware_rows(facts)
    assert (check, status) == ("mpi-gpu-aware", "WARN")
    assert "ROCm 7.0.2-56" in text and "PE 25.09" in text
    assert "MPICH_GPU_SUPPORT_ENABLED" in text
    # ROCm 6, no host binding, or no MPI: no row.
    assert gpu_aware_rows(dict(facts, rocm={"version_file": "6.2.4"})) == []
    no_host = dict(FACTS, record=dict(RECORD, host=None))
    assert gpu_aware_rows(dict(facts, mpi=no_host)) == []
    assert gpu_aware_rows({"rocm": {"version_file": "7.0"}}) == []
