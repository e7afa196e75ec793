"""Every example loads and dry-runs, so examples cannot rot."""

import ast
import json
import os
from pathlib import Path
import subprocess
import sys

from hosttools import need_tool
import pytest
import yaml

from cotainr_lumi import cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# example directory -> cotainr build options (relative to the directory)
DRY_RUNS = {
    "pytorch-rocm6.2": [
        "--system=lumi-g-ext-rocm-6.2",
        "--conda-env=env.yml",
        "--pip-steps=pip-steps.yml",
    ],
    "minimal": ["--system=lumi-g-ext-rocm-6.2", "--conda-env=env.yml"],
    "extend-lumi-pytorch": [
        "--base-image=/appl/local/containers/easybuild-sif-images/lumi-pytorch.sif",
        "--lumi-system=lumi-g-ext-pytorch",
        "--pip-requirements=requirements.txt",
    ],
    "demo": ["--system=lumi-g-ext-rocm-6.2", "--pip-requirements=requirements.txt"],
    "extend-lumi-aif": [
        "--system=lumi-aif-torch",
        "--pip-requirements=requirements.txt",
    ],
    "mpi4py": [
        "--system=lumi-g-ext-rocm-6.2",
        "--conda-env=env.yml",
        "--pip-steps=pip-steps.yml",
    ],
}
NOT_BUILD_INPUTS = {"slurm"}


def test_every_example_directory_is_covered():
    dirs = {p.name for p in EXAMPLES.iterdir() if p.is_dir()}
    assert dirs == set(DRY_RUNS) | NOT_BUILD_INPUTS
    for d in dirs:
        assert (EXAMPLES / d / "README.md").is_file(), f"examples/{d} has no README"


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_example_dry_runs(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(EXAMPLES / name)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "cotainr-lumi",
            "build",
            str(tmp_path / "x.sif"),
            *DRY_RUNS[name],
            "--dry-run",
        ],
    )
    cli.main()  # exits non-zero on any error
    out = capsys.readouterr().out
    assert "dry run" in out and "pip" in out and "lumi-env" in out
    assert not (tmp_path / "x.sif").exists()
    for option in DRY_RUNS[name]:
        if option.startswith(("--pip-steps", "--pip-requirements", "--conda-env")):
            assert option.split("=", 1)[1] in out
    if name in ("mpi4py", "pytorch-rocm6.2"):
        # The host binding the build will use once it finds the MPI.
        assert "MPI (lumi-env.mpi=auto)" in out
        assert "host: discover; LD_LIBRARY_PATH first /opt/cray/pe/lib64:" in out
        assert "  here: " in out  # what discovery finds on this host
    if name.startswith("pytorch-rocm"):
        # The git refs of apex, flash-attention and bitsandbytes are branches:
        # the plan says so, so users pin them for a reproducible image.
        assert out.count("not pinned: ") == 3
        assert "apex.git@master: 'master' is a branch" in out


@pytest.mark.parametrize("version", ["6.2"])
def test_pytorch_examples_express_the_hand_built_stack(version):
    steps = yaml.safe_load(
        (EXAMPLES / f"pytorch-rocm{version}" / "pip-steps.yml").read_text()
    )["steps"]
    text = json.dumps(steps)
    assert f"rocm{version}" in steps[0]["index-url"] and "torch==" in text
    names = [s["name"] for s in steps]
    keys = ("PyTorch", "apex", "DeepSpeed", "flash", "bitsandbytes", "Hugging")
    # After the PyTorch stack, as in the hand-built images: CuPy, then mpi4py.
    keys += ("CuPy", "mpi4py")
    order = [next(i for i, n in enumerate(names) if key in n) for key in keys]
    assert order == sorted(order)
    deepspeed = steps[order[2]]
    assert deepspeed["no-build-isolation"] is True
    for op in (
        "FUSED_ADAM",
        "FUSED_LAMB",
        "FUSED_LION",
        "CCL_COMM",
        "STOCHASTIC_TRANSFORMER",
    ):
        assert deepspeed["env"][f"DS_BUILD_{op}"] == "1"
    apex = steps[order[1]]
    assert (
        apex["no-build-isolation"] is True
        and any("--cpp_ext" in a for a in apex["pip-args"])
        and any("--cuda_ext" in a for a in apex["pip-args"])
    )
    assert all(s["env"]["PYTORCH_ROCM_ARCH"] == "gfx90a" for s in steps[1:5])
    cupy = steps[order[6]]
    assert any(p.startswith("cupy==") for p in cupy["packages"])
    assert cupy["env"]["CUPY_INSTALL_USE_HIP"] == "1"
    assert cupy["env"]["ROCM_HOME"] == "/opt/rocm"
    assert cupy["env"]["HCC_AMDGPU_TARGET"] == "gfx90a"
    assert_mpi4py_from_pip(steps[order[7]])


def assert_mpi4py_from_pip(step):
    """mpi4py and an MPICH-ABI library (the mpich wheel) from pip, pinned."""
    packages = step["packages"]
    assert any(p.startswith("mpi4py==") for p in packages)
    assert any(p.startswith("mpich==") for p in packages)
    assert not step.get("no-build-isolation")


def test_the_mpi4py_example_takes_mpi_from_pip():
    steps = yaml.safe_load((EXAMPLES / "mpi4py" / "pip-steps.yml").read_text())["steps"]
    (step,) = steps
    assert_mpi4py_from_pip(step)
    env = yaml.safe_load((EXAMPLES / "mpi4py" / "env.yml").read_text())
    # Not conda's mpi4py/mpich: its RPATH would pin conda's MPICH.
    assert not any("mpi" in str(d) for d in env["dependencies"])


def test_slurm_scripts_are_valid_bash():
    for script in (EXAMPLES / "slurm").glob("*.sbatch"):
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert "#SBATCH" in script.read_text()
    acceptance = (EXAMPLES / "slurm" / "acceptance.sbatch").read_text()
    assert "all_reduce_perf" in acceptance and "29" in acceptance
    assert (
        "NET/OFI Using aws-ofi-rccl" in acceptance
        and "Selected Provider is cxi" in acceptance
    )
    assert "osu_bw.py" in acceptance and "--nodes=2 --ntasks=2" in acceptance
    assert '--base-image "$sif"' in acceptance and "--flatten" in acceptance
    assert "#SBATCH --nodes=2" in acceptance


def test_the_acceptance_job_is_shellcheck_clean_and_sources_cleanly():
    shellcheck = need_tool("shellcheck", install="apt-get install -y shellcheck")
    job = EXAMPLES / "slurm" / "acceptance.sbatch"
    proc = subprocess.run([shellcheck, str(job)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    # Sourced under the strictest options it only defines its functions.
    script = (
        'set -euo pipefail; source "$1"; row PASS a "one\nline"; row SKIP b c; '
        'table x.sif zstd; echo "ok $?"; row FAIL c d; table x.sif zstd || echo "failed"'
    )
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(job)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "Acceptance of x.sif (squashfs compression: zstd)" in lines
    assert lines.count("ok 0") == 1 and lines[-1] == "failed"
    assert "PASS   a                            one line" in lines


# The fake image's answers: labels, imports, the MPI mode, each program.
FAKE_SINGULARITY = """#!/bin/bash
echo "singularity $* COTAINR_LUMI_MPI=${{SINGULARITYENV_COTAINR_LUMI_MPI-}}" >>{log}
case "$*" in
  "inspect --labels"*) printf '%s\\n' "cotainr-lumi.system: lumi-g-ext" \\
      "cotainr-lumi.binds: /opt/cray" "cotainr-lumi.compression: zstd" ;;
  *"import mpi4py"* | *"import torch"*) exit 0 ;;
  *COTAINR_LUMI_MPI_ACTIVE*) printf %s {active} ;;
  *osu_bw.py*) echo "# MPI library: {expect} Version: x"; echo "4194304 20000.0" ;;
  *Get_library_version*) echo "rank 0 of 2 CRAY MPICH version 8.1.32.110"
      echo "rank 1 of 2 CRAY MPICH version 8.1.32.110" ;;
  *second_group.py*) {torch} ;;
  *) echo "NET/OFI Using aws-ofi-rccl"; echo "Selected Provider is cxi"
     echo "# Avg bus bandwidth    : 100" ;;
esac
"""


def run_acceptance(
    tmp_path, *, active, expect, torch="echo second_group: DONE", env=None
):
    """The sbatch script with fake singularity/srun/cotainr tools: what it does."""
    fakes = tmp_path / "bin"
    fakes.mkdir()
    log = tmp_path / "calls.log"
    fake = {
        "singularity": FAKE_SINGULARITY.format(
            log=log, active=active, expect=expect, torch=torch
        ),
        "cotainr-lumi": f'#!/bin/bash\necho "cotainr-lumi $*" >>{log}\n'
        'echo "check-host /: 17 PASS, 0 FAIL, 0 N/A"\n',
        # A build: its image path's shell snippet sets SIF.
        "cotainr": f'#!/bin/bash\necho "cotainr $*" >>{log}\n'
        'echo "export SIF=$2" >"${2%.*}.sh"; echo "Layered image: stand-in"\n',
        "srun": f"""#!/bin/bash
echo "srun $*" >>{log}
while [[ $1 == -* ]]; do shift; done
exec "$@"
""",
    }
    for name, text in fake.items():
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    (tmp_path / "x.sh").write_text(
        "export COTAINR_LUMI_MPI_HOST_LIBMPI=/opt/cray/pe/lib-abi-mpich/libmpi.so.12\n"
    )
    proc = subprocess.run(
        [
            "bash",
            str(EXAMPLES / "slurm" / "acceptance.sbatch"),
            str(tmp_path / "x.sif"),
        ],
        env={
            "PATH": f"{fakes}:{os.environ['PATH']}",
            "SLURM_JOB_ID": "7",
            "SLURM_SUBMIT_DIR": str(tmp_path),
            "HOME": str(tmp_path),
            **(env or {}),
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return proc, log.read_text()


@pytest.mark.parametrize(
    "active, srun_args, expect",
    [
        # The host's Cray MPICH: plain srun (LUMI's default cray_shasta PMI).
        ("host", "--nodes=2 --ntasks=2 --ntasks-per-node=1 singularity", "CRAY MPICH"),
        # The image's own MPICH (AI Factory images): srun --mpi=pmi2.
        ("container", "--ntasks-per-node=1 --mpi=pmi2 singularity", "MPICH"),
    ],
)
def test_the_acceptance_job_checks_in_order_and_ends_with_one_table(
    tmp_path, active, srun_args, expect
):
    proc, calls = run_acceptance(tmp_path, active=active, expect=expect)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    commands = [c.split()[0] for c in calls.splitlines()]
    # check-host first (after reading the labels), then the three builds.
    first = commands.index("cotainr-lumi")
    assert "srun" not in commands[:first] and "cotainr" not in commands[:first]
    builds = [c for c in calls.splitlines() if c.startswith("cotainr build")]
    assert len(builds) == 3 and "--flatten" in builds[0] and "--layer-only" in builds[2]
    mpi_srun = [c for c in calls.splitlines() if c.startswith("srun") and "osu_bw" in c]
    assert len(mpi_srun) == 1 and srun_args in mpi_srun[0], calls
    assert f"osu_bw.py COTAINR_LUMI_MPI={active}" in calls
    assert "Get_library_version" in calls and "COTAINR_LUMI_MPI=host" in calls
    table = proc.stdout.split("Acceptance of ")[1].splitlines()
    assert table[0].endswith("(squashfs compression: cotainr-lumi.compression=zstd)")
    rows = {line.split()[1]: line.split()[0] for line in table[2:]}
    assert rows == {
        "check-host": "PASS",
        "build-full": "PASS",
        "build-layered": "PASS",
        "build-layer-only": "PASS",
        "rccl-ofi-plugin": "PASS",
        "rccl-cxi": "PASS",
        "rccl-bus-bandwidth": "PASS",
        "osu-bandwidth": "PASS",
        "mpi4py-host-cray-mpich": "PASS",
        "torch-second-group": "PASS",
    }, proc.stdout
    assert "20000.0 MB/s >= 10000 MB/s" in proc.stdout and "12242 MB/s" in proc.stdout


def test_a_hung_second_process_group_is_a_fail_row_not_a_hung_job(tmp_path):
    """laifs-container-recipes #44: the first all_reduce on a new group never returns."""
    proc, _ = run_acceptance(
        tmp_path,
        active="host",
        expect="CRAY MPICH",
        torch="sleep 600",
        env={"PG_DEADLINE_S": "2"},
    )
    assert proc.returncode == 1
    line = next(x for x in proc.stdout.splitlines() if "torch-second-group" in x)
    assert line.startswith("FAIL") and "laifs #28/#44" in line


def test_the_osu_bandwidth_script_runs_the_osu_bw_loop():
    text = (EXAMPLES / "slurm" / "osu_bw.py").read_text()
    assert "WINDOW = 64" in text and "Get_library_version" in text


def test_python_examples_parse():
    for script in [
        EXAMPLES / "api_build.py",
        EXAMPLES / "slurm" / "train_ddp.py",
        EXAMPLES / "slurm" / "osu_bw.py",
    ]:
        ast.parse(script.read_text())


def test_api_example_dry_run(tmp_path, capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import api_build
    finally:
        sys.path.pop(0)
    assert (
        api_build.main(
            [
                str(tmp_path / "a.sif"),
                "--dry-run",
                "--conda-env",
                str(EXAMPLES / "minimal" / "env.yml"),
            ]
        )
        == 0
    )
    assert "lumi-g-ext" in capsys.readouterr().out
