"""conda-python-distributed with MPI ranks: the PMI Slurm gives fits the MPI.

The image's MPI env file sets COTAINR_LUMI_MPI_ACTIVE (host: LUMI's Cray
MPICH, container: the image's own). Slurm's cray_shasta plugin (LUMI's
default) sets PALS_RANKID, ``--mpi=pmi2`` sets PMI_FD, ``--mpi=pmix``
PMIX_RANK. A mismatch gets one note from task 0; the script still runs
python (torch.distributed jobs do not use MPI).
"""

from pathlib import Path
import shutil

import pytest
from test_distributed import CLEANUP_USER, FAKE_ID, FAKE_PYTHON, SLURM, run


@pytest.fixture(scope="module")
def fakebin(tmp_path_factory):
    """test_distributed's fake python and id."""
    path = tmp_path_factory.mktemp("fakebin")
    for name, text in (("python", FAKE_PYTHON), ("id", FAKE_ID)):
        (path / name).write_text(text)
        (path / name).chmod(0o755)
    return path


@pytest.fixture(scope="module", autouse=True)
def cleanup_tmp():
    """Remove the per-node caches the script made for the test user."""
    yield
    for entry in Path("/tmp").glob(f"{CLEANUP_USER}-*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)


#: Task 0 of a two-task step on one node.
RANK0 = {**SLURM, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2"}
RANK0["SLURM_TASKS_PER_NODE"] = "2"


@pytest.mark.parametrize(
    "active,pmi",
    [
        ("host", {"PALS_RANKID": "0"}),
        ("container", {"PMI_FD": "7", "PMI_RANK": "0"}),
        ("container", {"PMIX_RANK": "0"}),
        ("", {}),  # an image without MPI settings
        (None, {}),
    ],
)
def test_a_fitting_pmi_or_no_mpi_gives_no_note(fakebin, active, pmi):
    proc, got = run(fakebin, {**RANK0, "COTAINR_LUMI_MPI_ACTIVE": active, **pmi})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert got["RANK"] == "0" and got["WORLD_SIZE"] == "2"


def test_cray_mpich_without_cray_shasta_is_one_note(fakebin):
    proc, got = run(
        fakebin, {**RANK0, "COTAINR_LUMI_MPI_ACTIVE": "host", "PMI_FD": "7"}
    )
    assert proc.returncode == 0 and got["RANK"] == "0"
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "conda-python-distributed: note: the image uses LUMI's Cray MPICH"
    )
    assert "no PALS_RANKID" in line and "plain srun" in line


def test_the_images_mpich_without_pmi2_is_one_note(fakebin):
    proc, _ = run(fakebin, {**RANK0, "COTAINR_LUMI_MPI_ACTIVE": "container"})
    (line,) = proc.stderr.splitlines()
    assert "its own MPICH" in line and "srun --mpi=pmi2" in line


def test_only_task_0_of_a_multi_task_step_notes(fakebin):
    other = {**SLURM, "COTAINR_LUMI_MPI_ACTIVE": "container"}  # task 13 of 40
    assert run(fakebin, other)[0].stderr == ""
    single = {**RANK0, "SLURM_NTASKS": "1", "COTAINR_LUMI_MPI_ACTIVE": "container"}
    assert run(fakebin, single)[0].stderr == ""
