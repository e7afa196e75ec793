"""End-to-end tests of the lumi-env stage: one real build, many checks.

The image is built with the stock ``cotainr`` command from a test system
(COTAINR_LUMI_SYSTEMS) on the LUMI-like base image, whole (``--flatten``: the
sandbox squashed with zstd into the SIF, issue 40), then run with real
Apptainer; the module file it writes is loaded in real Lmod.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import pwd
import re
import shutil
import subprocess
import tempfile
import uuid

from hostroot import BINDS
from hosttools import as_user, need_lmod, real_users, remove_dirs_of
import pytest

from cotainr_lumi.apptainer import SIF_JSON, SIF_PARTITION, SIF_SYSTEM, sif_objects

pytestmark = pytest.mark.e2e

ENV_PREFIX = "/opt/cotainr/conda/envs/conda_container_env"
PROFILE_ENV = {
    "CXI_FORK_SAFE": "1",
    "CXI_FORK_SAFE_HP": "1",
    "FI_CXI_DISABLE_CQ_HUGETLB": "1",
    "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
    "FI_CXI_DEFAULT_CQ_SIZE": 131072,
    "PYTORCH_ROCM_ARCH": "gfx90a",
    "RCCL_DEBUG": "0",
    "NCCL_NET_GDR_LEVEL": None,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, lumi_like_base_image, cotainr_build):
    """Build one image; return (image, module_dir, marker, hostile, output, profile)."""
    work = tmp_path_factory.mktemp("lumi-env-e2e")
    marker = work / "PWNED"
    hostile = (
        f"a'b\"c $(touch {marker}) `touch {marker}` ;touch {marker}\nline2 \\ $HOME"
    )
    image = work / "torch.sif"
    module_dir = work / "modules"
    env = dict(PROFILE_ENV, HOSTILE=hostile)
    proc = cotainr_build(
        work,
        image,
        "--system=lumi-env-e2e",
        "--force",
        "--flatten",
        "--env",
        "EXTRA_SETTING=from the command line",
        "--env",
        "CXI_FORK_SAFE_HP=2",
        "--set",
        "lumi-env.env={RCCL_DEBUG: null}",
        "--set",
        f"lumi-env.module-dir={module_dir}",
        systems={
            "lumi-env-e2e": {
                "base-image": lumi_like_base_image,
                "settings": {"lumi-env": {"env": env, "binds": BINDS}},
            }
        },
        timeout=900,
        name="lumi-env, whole image (zstd)",
    )
    profile = work / "systems.yaml"
    return image, module_dir, marker, hostile, proc.output, profile


def printenv(apptainer_exec, image, names, env=None):
    """The values of `names` inside the container (None when unset)."""
    script = "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
    proc = apptainer_exec(image, "python", "-c", script, *names, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_defaults_overrides_and_hostile_value(built, apptainer_exec):
    image, _, marker, hostile, _, _ = built
    names = [
        *PROFILE_ENV,
        "EXTRA_SETTING",
        "HOSTILE",
        "MIOPEN_USER_DB_PATH",
        "MIOPEN_CUSTOM_CACHE_DIR",
        "ROCM_PATH",
        "WITH_CONDA",
        "PATH",
        "LD_LIBRARY_PATH",
    ]
    env = printenv(apptainer_exec, image, names)
    assert env["CXI_FORK_SAFE"] == "1"
    assert env["CXI_FORK_SAFE_HP"] == "2"  # --env overrides the profile
    assert env["FI_CXI_DISABLE_CQ_HUGETLB"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert env["FI_CXI_DEFAULT_CQ_SIZE"] == "131072"
    assert env["PYTORCH_ROCM_ARCH"] == "gfx90a"
    assert env["RCCL_DEBUG"] is None  # lumi-env.env={RCCL_DEBUG: null}
    assert env["NCCL_NET_GDR_LEVEL"] is None  # null in the profile
    assert env["EXTRA_SETTING"] == "from the command line"
    assert env["HOSTILE"] == hostile
    assert not marker.exists()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert env["MIOPEN_USER_DB_PATH"] == f"/tmp/{user}-miopen-cache"
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == f"/tmp/{user}-miopen-cache"
    assert env["ROCM_PATH"] == "/opt/rocm"
    assert env["PATH"].split(":").count("/runscripts") == 1
    ld = env["LD_LIBRARY_PATH"].split(":")
    # The base already has both: they are not added twice.
    assert ld.count("/opt/rocm/lib") == 1 and ld.count("/opt/aws-ofi-rccl") == 1

    # Run-time overrides win: a host export (also to the empty string),
    # APPTAINERENV_ and SINGULARITYENV_.
    over = printenv(
        apptainer_exec,
        image,
        [
            "CXI_FORK_SAFE",
            "NCCL_SOCKET_IFNAME",
            "FI_MR_CACHE_MONITOR",
            "PYTORCH_ROCM_ARCH",
            "NCCL_NET_GDR_LEVEL",
            "MIOPEN_USER_DB_PATH",
        ],
        env={
            "CXI_FORK_SAFE": "0",
            "NCCL_SOCKET_IFNAME": "",
            "APPTAINERENV_FI_MR_CACHE_MONITOR": "memhooks",
            "SINGULARITYENV_PYTORCH_ROCM_ARCH": "gfx942",
            "NCCL_NET_GDR_LEVEL": "PHB",
            "MIOPEN_USER_DB_PATH": "/tmp/elsewhere",
        },
    )
    assert over == {
        "CXI_FORK_SAFE": "0",
        "NCCL_SOCKET_IFNAME": "",
        "FI_MR_CACHE_MONITOR": "memhooks",
        "PYTORCH_ROCM_ARCH": "gfx942",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "MIOPEN_USER_DB_PATH": "/tmp/elsewhere",
    }
    assert not marker.exists()


def test_jit_caches_are_per_job_on_node_local_tmp(built, apptainer_exec):
    image = built[0]
    names = ["TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR"]
    job = f"8{os.getpid()}"
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    dirs = [f"/tmp/{user}-job{job}-{d}-cache" for d in ("triton", "torchinductor")]
    try:
        env = printenv(
            apptainer_exec,
            image,
            names,
            env={"SLURM_JOB_ID": job, "TORCH_EXTENSIONS_DIR": "/tmp/mine"},
        )
        assert env == dict(zip(names, [*dirs, "/tmp/mine"]))
        for path in dirs:  # made by the env file, private to the user
            assert Path(path).is_dir() and Path(path).stat().st_mode & 0o777 == 0o700
    finally:
        for path in dirs:
            if Path(path).is_dir():
                Path(path).rmdir()


def test_the_sif_is_apptainers_layout_with_zstd(built, apptainer_path):
    """Definition, inspect metadata, a zstd system partition: as `apptainer build`."""
    image, *_ = built
    objects = sif_objects(image)
    assert [(o.datatype, o.name) for o in objects] == [
        (0x4001, ""),
        (SIF_JSON, "inspect-metadata.json"),
        (SIF_PARTITION, ""),
    ]
    system = objects[-1]
    assert (system.parttype, system.fstype, system.arch) == (SIF_SYSTEM, 1, 2)
    with open(image, "rb") as f:
        f.seek(system.offset + 20)  # the squashfs superblock's compression id
        assert f.read(2) == (6).to_bytes(2, "little")  # zstd
    proc = subprocess.run(
        [str(apptainer_path / "apptainer"), "inspect", "--deffile", str(image)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith("bootstrap: localimage\nfrom: /")


def test_the_sif_can_be_signed_and_verified(built, apptainer_path, tmp_path):
    """`apptainer sign` and `verify` with a throwaway key, as on Apptainer's SIF."""
    signed = tmp_path / "signed.sif"
    shutil.copy(built[0], signed)
    apptainer, env = (
        str(apptainer_path / "apptainer"),
        {**os.environ, "HOME": str(tmp_path)},
    )
    for args in (
        ["key", "newpair", "--password=", "--name=t", "--email=t@example.org"]
        + ["--comment=throwaway", "--push=false"],
        ["sign", str(signed)],
        ["verify", str(signed)],
    ):
        proc = subprocess.run(
            [apptainer, *args], capture_output=True, text=True, env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
    assert "Verified signature(s)" in proc.stderr + proc.stdout


def test_labels_and_run_hint(built, apptainer_path):
    image, module_dir, _, _, output, _ = built
    proc = subprocess.run(
        [
            str(apptainer_path / "apptainer"),
            "inspect",
            "--json",
            "--labels",
            str(image),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    labels = json.loads(proc.stdout)["data"]["attributes"]["labels"]
    assert labels["cotainr-lumi.compression"] == "zstd:3"
    assert (
        labels["org.label-schema.usage.singularity.deffile.bootstrap"] == "localimage"
    )
    assert labels["cotainr-lumi.binds"] == ",".join(BINDS)
    assert labels["cotainr-lumi.runscripts"] == "/runscripts"
    assert (
        labels["cotainr-lumi.env-file"] == "/.singularity.d/env/93-cotainr-lumi-env.sh"
    )
    assert "HOSTILE" in labels["cotainr-lumi.env"].split(",")
    assert f"module use {module_dir}; module load torch;" in output
    assert (
        f"srun singularity exec -B {','.join(BINDS)} {image} conda-python-distributed"
        in output
    )


def test_runscripts_with_fake_slurm(built, apptainer_exec, tmp_path):
    image = built[0]
    slurm = {
        "SLURM_JOB_ID": "4242424",
        "SLURM_JOB_NODELIST": "nid[005252-005254,005256],nid007000",
        "SLURM_PROCID": "13",
        "SLURM_LOCALID": "5",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "40",
        "SLURM_NPROCS": "40",
        "SLURM_TASKS_PER_NODE": "8(x5)",
        "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    proc = apptainer_exec(image, "get-master", env=slurm)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "nid005252\n"
    proc = apptainer_exec(image, "get-master", "--all", "gpu[08-10],login1", env=slurm)
    assert proc.stdout.split() == ["gpu08", "gpu09", "gpu10", "login1"]

    names = [
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "NODE_RANK",
        "LOCAL_WORLD_SIZE",
        "ROCR_VISIBLE_DEVICES",
        "MIOPEN_USER_DB_PATH",
    ]
    script = "import json, os, sys; print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
    proc = apptainer_exec(
        image, "conda-python-distributed", "-c", script, *names, env=slurm
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["MASTER_ADDR"] == "nid005252"
    assert got["MASTER_PORT"] == str(20000 + 4242424 % 12000)
    assert 1024 < int(got["MASTER_PORT"]) < 32768
    assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"]) == ("13", "5", "40")
    assert (got["NODE_RANK"], got["LOCAL_WORLD_SIZE"]) == ("1", "8")
    assert got["ROCR_VISIBLE_DEVICES"] == "5"
    assert Path(
        got["MIOPEN_USER_DB_PATH"]
    ).is_dir()  # created (/tmp is shared with the host)

    # An explicit MASTER_PORT wins; another job gets another port.
    proc = apptainer_exec(
        image,
        "conda-python-distributed",
        "-c",
        script,
        "MASTER_PORT",
        env={**slurm, "MASTER_PORT": "31000"},
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1])["MASTER_PORT"] == "31000"
    proc = apptainer_exec(
        image,
        "conda-python-distributed",
        "-c",
        script,
        "MASTER_PORT",
        env={**slurm, "SLURM_JOB_ID": "4242425"},
    )
    assert (
        json.loads(proc.stdout.strip().splitlines()[-1])["MASTER_PORT"]
        != got["MASTER_PORT"]
    )

    proc = apptainer_exec(
        image, "conda-python-simple", "-c", "import sys; print(sys.prefix)"
    )
    assert proc.returncode == 0 and proc.stdout.strip() == ENV_PREFIX


def test_with_conda_and_user_software_venv(built, apptainer_exec, tmp_path):
    image = built[0]
    # As the LUMI EasyBuild modules use it, with the env active and after
    # the env was dropped from PATH.
    proc = apptainer_exec(
        image, "bash", "-c", '$WITH_CONDA; python -c "import sys; print(sys.prefix)"'
    )
    assert proc.returncode == 0 and proc.stdout.strip() == ENV_PREFIX, proc.stderr
    proc = apptainer_exec(
        image,
        "bash",
        "-c",
        'export PATH=/usr/bin:/bin; $WITH_CONDA && python -c "import sys; print(sys.prefix)"',
    )
    assert proc.returncode == 0 and proc.stdout.strip() == ENV_PREFIX, proc.stderr
    proc = apptainer_exec(image, "bash", "-c", 'eval "$WITH_CONDA" && echo ok')
    assert proc.stdout.strip() == "ok"

    # The EasyBuild user-software flow: a --system-site-packages venv on top
    # of the image's env sees the env's packages and can install more. The
    # test env is itself a venv of the system Python (a stand-in for conda),
    # where --system-site-packages alone reaches /usr/lib/python3, not the
    # env: init-user-venv links the env's site-packages in (the venv's own
    # packages come first).
    project = tmp_path / "tinypkg"
    (project / "tinypkg").mkdir(parents=True)
    (project / "tinypkg" / "__init__.py").write_text("VALUE = 42\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "1.0"\n'
    )
    venv = tmp_path / "user-software"
    script = f"""
set -e
init-user-venv {venv}
source {venv}/bin/activate
python -c 'import importlib.metadata as m; [print("visible", d.metadata["Name"], d.locate_file("")) for d in m.distributions()]'
pip install --no-index --no-build-isolation --quiet {project}
python -c 'import tinypkg, sys; print("installed", tinypkg.VALUE, sys.prefix)'
"""
    proc = apptainer_exec(
        image, "bash", "-c", script, env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(
        f"^visible setuptools {ENV_PREFIX}/lib/python3[.0-9]+/site-packages$",
        proc.stdout,
        re.M,
    )
    assert f"installed 42 {venv}" in proc.stdout
    assert list(
        venv.glob("lib/python*/site-packages/tinypkg")
    )  # in the venv, not the image


@pytest.fixture(scope="session")
def lmod_init():
    """Lmod's init script; session scope: checked before the module's build."""
    return need_lmod()


def test_module_file_loads_in_real_lmod(lmod_init, built, apptainer_exec):
    image, module_dir, _, _, _, _ = built
    lua = module_dir / "torch.lua"
    snippet = module_dir / "torch.sh"
    assert lua.is_file() and snippet.is_file()
    script = f'source {lmod_init} && module use "$1" && module load torch && env -0'
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(module_dir)],
        env={"PATH": os.environ["PATH"], "HOME": str(module_dir)},
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    env = dict(e.decode().partition("=")[::2] for e in proc.stdout.split(b"\0") if e)
    assert env["SIF"] == env["SIFTORCH"] == str(image)
    root = image.parent / "torch.root"
    assert env["CONTAINERROOT"] == env["EBROOTTORCH"] == str(root)
    assert env["SINGULARITY_BIND"] == ",".join(
        [f"{root}/user-software:/user-software", *BINDS]
    )
    assert env["RUNSCRIPTS"] == str(root / "runscripts")
    assert env["SINGULARITYENV_PREPEND_PATH"] == "/runscripts"
    proc = subprocess.run(
        [
            "sh",
            "-c",
            '. "$1" && printf "%s\\n" "$SIF" "$SINGULARITY_BIND"',
            "sh",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.stdout.splitlines() == [
        str(image),
        ",".join([f"{root}/user-software:/user-software", *BINDS]),
    ]
    # The module's SIF and PREPEND_PATH work with Apptainer (binds are LUMI
    # host paths, absent here, so they are not passed).
    proc = apptainer_exec(
        env["SIF"],
        "bash",
        "-c",
        'echo "$PATH"',
        env={"SINGULARITYENV_PREPEND_PATH": env["SINGULARITYENV_PREPEND_PATH"]},
    )
    assert proc.stdout.startswith("/runscripts:")


def test_verify_fails_only_the_deliberate_build_overrides(built, verify_image):
    image, *_, profile = built
    code, rows, report = verify_image(image, env={"COTAINR_LUMI_SYSTEMS": str(profile)})
    # The build set CXI_FORK_SAFE_HP=2 and unset RCCL_DEBUG on purpose; the
    # test system's other values (HOSTILE included) are in the image.
    assert code == 1
    assert set(report["failed"]) == {"env:CXI_FORK_SAFE_HP", "env:RCCL_DEBUG"}, [
        r for r in report["results"] if r["status"] == "FAIL"
    ]
    assert rows["env:HOSTILE"] == "PASS"
    for check in ("rocm-layout", "net-plugin", "runscripts", "with-conda"):
        assert rows[check] == "PASS", check
    assert rows["package-list"] == "PASS"


def test_miopen_caches_of_a_co_user_are_never_used(built, apptainer_path):
    # Issue 29: on a shared node, another user planted a 0777 directory at
    # the image-wide default and a link at the runscript's per-job cache.
    # Before: the image's default was used whoever owned it, and ranks
    # other than 0 followed the link. The container runs as a real non-root
    # user (Apptainer's --security uid:, env scripts included: the test
    # machine's Apptainer wrapper needs root for its own namespaces), known
    # to the container's passwd as on LUMI.
    image = built[0]
    with real_users(2, why="two real users share /tmp") as (victim, attacker):
        user = pwd.getpwnam(victim)
        trap = Path(tempfile.mkdtemp(prefix=f"{attacker}-trap-"))
        passwd = trap.with_name(f"{trap.name}.passwd")
        passwd.write_text(f"{victim}:x:{user.pw_uid}:{user.pw_gid}::/:/bin/sh\n")
        passwd.chmod(0o644)
        apptainer = [
            str(apptainer_path / "apptainer"),
            "exec",
            "--no-home",
            f"--security=uid:{user.pw_uid},gid:{user.pw_gid}",
            f"--bind={passwd}:/etc/passwd",
            str(image),
        ]
        show = (
            'import os; p = os.environ["MIOPEN_USER_DB_PATH"]; s = os.lstat(p); '
            'print(p, s.st_uid, oct(s.st_mode), os.environ["MIOPEN_CUSTOM_CACHE_DIR"])'
        )
        default = Path(f"/tmp/{victim}-miopen-cache")
        job = str(uuid.uuid4().int % 10**9)
        per_job = Path(f"/tmp/{victim}-miopen-cache-{job}-0")
        trap.chmod(0o777)
        shutil.chown(trap, attacker)
        attack = 'mkdir -m 777 "$1" && ln -s "$3" "$2"'
        planted = [str(default), str(per_job), str(trap)]
        slurm = {
            "SLURM_JOB_ID": job,
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": "0",
            "MASTER_ADDR": "nid1",
        }
        try:
            subprocess.run(
                as_user(attacker) + ["sh", "-c", attack, "sh", *planted], check=True
            )
            runs = {
                "python": (["python", "-c", show], {}),
                "rank 0": (
                    ["conda-python-distributed", "-c", show],
                    {"SLURM_LOCALID": "0"},
                ),
                "rank 1": (
                    ["conda-python-distributed", "-c", show],
                    {"SLURM_LOCALID": "1"},
                ),
            }
            for what, (command, local) in runs.items():
                proc = subprocess.run(
                    apptainer + command,
                    env={**os.environ, **slurm, **local},
                    capture_output=True,
                    text=True,
                    timeout=300,
                    stdin=subprocess.DEVNULL,
                )
                assert proc.returncode == 0, (what, proc.stderr)
                used, uid, mode, custom = proc.stdout.split()
                expected = default if what == "python" else per_job
                assert used.startswith(f"{expected}.") and custom == used, what
                assert (uid, mode) == (str(user.pw_uid), "0o40700"), what
                # One message per directory refused: the env file's (at every
                # start), and local rank 0's for the per-job cache.
                refused = [default] + ([per_job] if what == "rank 0" else [])
                assert re.findall(r"not using (\S+):", proc.stderr) == [
                    str(p) for p in refused
                ], (what, proc.stderr)
            assert list(trap.iterdir()) == []
        finally:
            per_job.unlink(missing_ok=True)
            for path in Path("/tmp").glob(f"{victim}-miopen-cache*"):
                remove_dirs_of(victim, path)
                remove_dirs_of(attacker, path)
            shutil.rmtree(trap)
            passwd.unlink()
