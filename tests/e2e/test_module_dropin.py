"""End-to-end: the module file is a drop-in for LUST's EasyBuild PyTorch module.

An image is built with the stock ``cotainr`` command on bases laid out like
LUMI's PyTorch images (layout 1: the env only through ``$WITH_CONDA``;
layout 2: conda pre-activated), its module is loaded in real Lmod, and the
commands of LUMI's PyTorch documentation run as written: ``singularity exec
$SIF pip list``, ``$WITH_CONDA; pip list``, ``start-shell -c 'pip list'``, a
user ``pip install`` into the venv in ``/user-software``, the host wrappers
``python``, ``pip``, ... (in the image's env, or the user venv), ``make-squashfs``,
a reload with the SquashFS file mounted, ``unmake-squashfs``, and
``conda-python-distributed`` under Slurm task variables.
"""

from __future__ import annotations

import os
from pathlib import Path
import shlex
import subprocess

from hosttools import need_lmod, need_tool
import layouts
from pkgfixtures import make_wheel
import pytest

pytestmark = pytest.mark.e2e

BASES = {"layout1": layouts.LAYOUT1, "layout2": layouts.LAYOUT2}


@pytest.fixture(scope="module", params=sorted(BASES))
def image(request, tmp_path_factory, derived_base, cotainr_build):
    """(work dir, module dir, image) built on a LUMI-PyTorch-like base."""
    need_lmod()
    need_tool("mksquashfs", install="apt-get install -y squashfs-tools")
    need_tool("unsquashfs", install="apt-get install -y squashfs-tools")
    name = request.param
    work = tmp_path_factory.mktemp(f"dropin-{name}")
    # layout 1's is also test_system_packages.py's base.
    base = derived_base(
        f"{name}-bare",
        cases=(),
        setup=BASES[name],
        python=f"{layouts.ENV}/bin/python",
    )
    (work / "wheels").mkdir()
    image_pkg = make_wheel(work / "wheels", "imagepkg", "1.0")
    make_wheel(work / "wheels", "userpkg", "2.0")
    (work / "req.txt").write_text(f"./wheels/{image_pkg.name}\n")
    sif = work / "pytorch.sif"
    cotainr_build(
        work,
        sif,
        "--system=dropin",
        "--pip-requirements",
        "req.txt",
        f"--set=lumi-env.module-dir={work / 'modules'}",
        systems={
            "dropin": {
                "base-image": base,
                # LUMI's host paths do not exist here.
                "settings": {"lumi-env": {"binds": [], "host-libfabric-binds": []}},
            }
        },
    )
    return work, work / "modules", sif


def module_run(modules, script, *, env=None, cwd=None):
    """Run `script` in bash after ``module use MODULES; module load pytorch``."""
    full = (
        f"source {shlex.quote(str(need_lmod()))} && module use {shlex.quote(str(modules))}"
        f" && module load pytorch && {script}"
    )
    proc = subprocess.run(
        ["bash", "-c", full],
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(modules),
            "APPTAINER_MKSQUASHFS_ARGS": "-comp lz4",
            **(env or {}),
        },
        cwd=cwd or modules,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_lust_user_software_workflow_as_documented(image):
    work, modules, sif = image
    root = work / "pytorch.root"
    # The module's variables.
    out = ok(
        module_run(
            modules,
            'printf "%s\\n" "$SIF" "$SIFPYTORCH" "$CONTAINERROOT" "$RUNSCRIPTS" '
            '"$EBROOTPYTORCH" "$SINGULARITYENV_PREPEND_PATH" "$SINGULARITY_BIND"; '
            "command -v make-squashfs unmake-squashfs start-shell list-packages "
            "python pip",
            env={"SINGULARITYENV_PREPEND_PATH": "/mine"},
        )
    ).splitlines()
    assert out[:7] == [
        str(sif),
        str(sif),
        str(root),
        str(root / "runscripts"),
        str(root),
        "/runscripts:/mine",
        f"{root}/user-software:/user-software",
    ]
    assert out[7:] == [
        str(root / "bin" / n)
        for n in (
            "make-squashfs",
            "unmake-squashfs",
            "start-shell",
            "list-packages",
            "python",
            "pip",
        )
    ]
    assert os.access(root / "runscripts" / "conda-python-distributed", os.X_OK)

    # The documented ways to list packages all see the image's env.
    for script in (
        'singularity exec "$SIF" pip list',
        "singularity exec \"$SIF\" bash -c '$WITH_CONDA ; pip list'",
        "start-shell -c 'pip list'",
        "list-packages",  # LUST's host command
        'singularity exec "$SIF" "$CONTAINERROOT/bin/list-packages"',  # in it
    ):
        assert "imagepkg" in ok(module_run(modules, script)), script

    # LUST's wrappers, for the commands the env has: they run in its container.
    assert sorted(p.name for p in (root / "bin").iterdir()) == sorted(
        "make-squashfs unmake-squashfs start-shell list-packages python python3 "
        "python3.11 "
        "pip pip3 pip3.11".split()
    )
    out = ok(
        module_run(
            modules,
            "python -c 'import sys, imagepkg; print(sys.prefix)'; pip3.11 --version",
        )
    ).splitlines()
    assert out[0] == layouts.ENV
    assert out[1].startswith("pip ") and f" from {layouts.ENV}/lib/" in out[1]
    # In the container (where /tmp is the host's), they refuse to start.
    proc = module_run(modules, 'singularity exec "$SIF" "$CONTAINERROOT/bin/pip" -V')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "pip: this host wrapper of the module does not run in a" in proc.stderr

    # A user pip install into the venv in /user-software (the exampleVenv flow).
    wheel = next((work / "wheels").glob("userpkg-*.whl"))
    ok(
        module_run(
            modules,
            'singularity exec "$SIF" bash -c \'source /runscripts/init-conda-venv; '
            f"pip install --no-index --no-deps {shlex.quote(str(wheel))}'",
        )
    )
    venv_site = list(root.glob("user-software/venv/pytorch/lib/python*/site-packages"))
    assert venv_site and (venv_site[0] / "userpkg").is_dir()
    # Not in the image's env, not in the decoys: only in the user venv.
    check = (
        "import imagepkg, userpkg, sys; "
        "print(userpkg.__file__); print(imagepkg.__file__); print(sys.prefix)"
    )
    for script in (
        f'singularity exec "$SIF" python -c {shlex.quote(check)}',
        f'singularity exec "$SIF" bash -c \'$WITH_CONDA; python -c "{check}"\'',
        f"start-shell -c {shlex.quote('python -c ' + shlex.quote(check))}",
        f"python -c {shlex.quote(check)}",  # the host wrapper keeps the venv
    ):
        lines = ok(module_run(modules, script)).splitlines()
        assert lines[-3].startswith("/user-software/venv/pytorch/"), script
        assert lines[-2].startswith(layouts.ENV + "/"), script
    assert "userpkg" in ok(module_run(modules, 'singularity exec "$SIF" pip list'))
    assert "userpkg" in ok(module_run(modules, "list-packages"))

    # make-squashfs, remove the directory, reload: the SquashFS file is mounted.
    ok(module_run(modules, "make-squashfs"))
    assert (root / "user-software.squashfs").is_file()
    subprocess.run(["rm", "-rf", str(root / "user-software")], check=True)
    out = ok(
        module_run(
            modules,
            'printf "%s\\n" "$SINGULARITY_BIND"; '
            f'singularity exec "$SIF" python -c {shlex.quote(check)}; '
            'singularity exec "$SIF" touch /user-software/x && echo WRITABLE || echo READONLY',
        )
    ).splitlines()
    assert out[0] == f"{root}/user-software.squashfs:/user-software:image-src=//"
    assert out[1].startswith("/user-software/venv/pytorch/")
    assert out[-1] == "READONLY"

    # unmake-squashfs recreates the directory; it refuses to overwrite it.
    ok(module_run(modules, "unmake-squashfs"))
    assert (root / "user-software/venv/pytorch/bin/python").exists()
    again = module_run(modules, "unmake-squashfs")
    assert again.returncode != 0 and "not empty" in again.stderr


def test_conda_python_distributed_under_slurm_variables(image):
    _, modules, _ = image
    user = subprocess.run(
        ["id", "-un"], capture_output=True, text=True, check=True
    ).stdout.strip()
    probe = (
        "import os; print(*(os.environ.get(n) for n in ('MASTER_ADDR', 'MASTER_PORT',"
        " 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'NCCL_NET_GDR_LEVEL',"
        " 'MIOPEN_USER_DB_PATH', 'MIOPEN_CUSTOM_CACHE_DIR')), sep='|');"
        " print(os.path.isdir(os.environ['MIOPEN_USER_DB_PATH']))"
    )
    slurm = {
        "SLURM_NODELIST": "nid[005252-005254,005256],nid007000",
        "SLURM_JOB_ID": "4242",
        "SLURM_NODEID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_PROCID": "17",
        "SLURM_NTASKS": "40",
    }
    cache = Path(f"/tmp/{user}-miopen-cache-4242-2")
    cache.mkdir(mode=0o700, exist_ok=True)
    (cache / "stale").write_text("from an earlier step of the job\n")
    script = f'singularity exec "$SIF" conda-python-distributed -c {shlex.quote(probe)}'
    lines = ok(module_run(modules, script, env=slurm)).splitlines()
    assert lines[-2].split("|") == [
        "nid005252",
        str(20000 + 4242 % 12000),
        "17",
        "0",
        "40",
        "3",
        str(cache),
        str(cache),
    ]
    assert lines[-1] == "True"
    # The job's private cache is used as its earlier step left it (issue 29).
    assert (cache / "stale").exists()
    # Another local rank keeps it; a value the user sets is kept too.
    (cache / "mine").write_text("x")
    env = {**slurm, "SLURM_LOCALID": "3", "NCCL_NET_GDR_LEVEL": "PHB"}
    lines = ok(module_run(modules, script, env=env)).splitlines()
    fields = lines[-2].split("|")
    assert fields[3] == "3" and fields[5] == "PHB" and fields[6] == str(cache)
    assert (cache / "mine").exists()
