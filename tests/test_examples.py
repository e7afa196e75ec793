"""Every example loads and dry-runs, so examples cannot rot."""

import ast
import json
import os
from pathlib import Path
import subprocess
import sys

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
    "pytorch-rocm6.1": [
        "--system=lumi-g-ext-rocm-6.1",
        "--conda-env=env.yml",
        "--pip-steps=pip-steps.yml",
    ],
    "minimal": ["--system=lumi-g-ext", "--conda-env=env.yml"],
    "extend-lumi-pytorch": [
        "--base-image=/appl/local/containers/easybuild-sif-images/lumi-pytorch.sif",
        "--lumi-system=lumi-g-ext",
        "--pip-requirements=requirements.txt",
    ],
    "demo": ["--system=lumi-g-ext", "--pip-requirements=requirements.txt"],
    "extend-lumi-aif": [
        "--system=lumi-aif-torch",
        "--pip-requirements=requirements.txt",
    ],
    "mpi4py": [
        "--system=lumi-g-ext",
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
    if name in ("mpi4py", "pytorch-rocm6.2", "pytorch-rocm6.1"):
        # The host binding the build will use once it finds the MPI.
        assert "MPI (lumi-env.mpi=auto)" in out
        assert "host: discover; LD_LIBRARY_PATH first /opt/cray/pe/lib64:" in out
        assert "  here: " in out  # what discovery finds on this host
    if name.startswith("pytorch-rocm"):
        # The git refs of apex, flash-attention and bitsandbytes are branches:
        # the plan says so, so users pin them for a reproducible image.
        assert out.count("not pinned: ") == 3
        assert "apex.git@master: 'master' is a branch" in out


@pytest.mark.parametrize("version", ["6.2", "6.1"])
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
    assert '--base-image "$sif"' in acceptance and "Layered image:" in acceptance


@pytest.mark.parametrize(
    "active, srun_args, expect",
    [
        # The host's Cray MPICH: plain srun (LUMI's default cray_shasta PMI).
        ("host", "--nodes=2 --ntasks=2 --ntasks-per-node=1 singularity", "CRAY MPICH"),
        # The image's own MPICH (AI Factory images): srun --mpi=pmi2.
        ("container", "--ntasks-per-node=1 --mpi=pmi2 singularity", "MPICH"),
    ],
)
def test_the_acceptance_jobs_mpi_part_follows_the_images_mode(
    tmp_path, active, srun_args, expect
):
    """The sbatch script with fake singularity/srun/rocm tools: what it launches."""
    fakes = tmp_path / "bin"
    fakes.mkdir()
    log = tmp_path / "calls.log"
    fake = {
        # The image: mpi4py imports; its env file's active MPI mode; the
        # MPI bandwidth program prints what osu_bw.py prints.
        "singularity": f"""#!/bin/bash
echo "singularity $* COTAINR_LUMI_MPI=${{SINGULARITYENV_COTAINR_LUMI_MPI-}}" >>{log}
case "$*" in
  *"import mpi4py"*) exit 0 ;;
  *COTAINR_LUMI_MPI_ACTIVE*) printf %s {active} ;;
  *osu_bw.py*) echo "# MPI library: {expect} Version: x"; echo "4194304 20000.0" ;;
  *) echo "# Avg bus bandwidth    : 100" ;;
esac
""",
        "cotainr-lumi": f'#!/bin/bash\necho "cotainr-lumi $*" >>{log}\n',
        "srun": f"""#!/bin/bash
echo "srun $*" >>{log}
while [[ $1 == -* ]]; do shift; done
exec "$@"
""",
    }
    for name, text in fake.items():
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
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
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    calls = log.read_text()
    mpi_srun = [c for c in calls.splitlines() if c.startswith("srun") and "osu_bw" in c]
    assert len(mpi_srun) == 1 and srun_args in mpi_srun[0], calls
    assert "cotainr-lumi check-host" in calls  # the host facts, on the node
    assert f"osu_bw.py COTAINR_LUMI_MPI={active}" in calls
    assert f"MPI mode: {active}" in proc.stdout
    assert "PASS: MPI bandwidth 20000.0 MB/s" in proc.stdout, proc.stdout + proc.stderr


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
