"""End-to-end: images built with lumi-g-ext pass `cotainr-lumi verify`;
a deliberately broken one (pruning skipped) fails exactly the expected rows."""

import json
import os
from pathlib import Path
import subprocess
import sys

from pkgfixtures import make_wheel
import pytest
import yaml

pytestmark = pytest.mark.e2e

HARDWARE_ROWS = {"rccl-bandwidth", "rccl-net-plugin", "gpus-visible"}
#: The LUMI-like test base has no rccl-tests (LUMI's base images do).
NOT_IN_TEST_BASE = {"rccl-tests"}


@pytest.fixture(scope="module")
def images(tmp_path_factory, rocm_torch_base_image, apptainer_path):
    work = tmp_path_factory.mktemp("verify-e2e")
    profile = work / "systems.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "systems": {
                    "verify-e2e": {
                        "extends": "lumi-g-ext",
                        "base-image": str(rocm_torch_base_image),
                        "rocm-version": "6.1",
                        "settings": {"provenance": {"hash-base-image": False}},
                    }
                }
            }
        )
    )
    make_wheel(work, "tinypkg", "1.0")
    (work / "requirements.txt").write_text("./tinypkg-1.0-py3-none-any.whl\n")
    cotainr = str(Path(sys.executable).with_name("cotainr"))
    env = {**os.environ, "COTAINR_LUMI_SYSTEMS": str(profile)}
    built = {}
    for name, extra in (("full", []), ("broken", ["--skip-stage=prune"])):
        image = work / f"{name}.sif"
        proc = subprocess.run(
            [
                cotainr,
                "build",
                str(image),
                "--system=verify-e2e",
                "--force",
                "--pip-requirements=requirements.txt",
                *extra,
            ],
            env=env,
            cwd=work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        built[name] = (image, proc.stdout + proc.stderr)
    return built


def test_full_lumi_g_ext_image_passes_verify(images, verify_image, e2e_facts):
    code, rows, report = verify_image(images["full"][0])
    e2e_facts["lumi-g-ext (ROCm base + env), verify"] = ", ".join(
        f"{c} {s}" for c, s in rows.items()
    )
    assert code == 0, json.dumps(report, indent=1)
    assert report["failed"] == []
    assert {
        c for c, s in rows.items() if s == "N/A"
    } == HARDWARE_ROWS | NOT_IN_TEST_BASE
    for check in (
        "torch-rocm-duplicates",
        "torch-rccl",
        "env-libstdcxx",
        "runscripts",
        "with-conda",
        "package-list",
        "net-plugin",
        "net-plugin-deps",
        "cray-libfabric",
        "rocm-driver",
    ):
        assert rows[check] == "PASS", check
    assert "module load" in images["full"][1] or "singularity exec" in images["full"][1]


def test_broken_image_fails_exactly_the_expected_rows(images, verify_image):
    code, _, report = verify_image(images["broken"][0])
    assert code == 1
    assert set(report["failed"]) == {"env-libstdcxx", "torch-rocm-duplicates"}


def test_verify_text_output_and_missing_image(images, tmp_path):
    cmd = str(Path(sys.executable).with_name("cotainr-lumi"))
    proc = subprocess.run(
        [cmd, "verify", str(images["full"][0])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0
    assert (
        proc.stdout.splitlines()[0].startswith("STATUS")
        and "0 FAIL" in proc.stdout.splitlines()[-1]
    )
    proc = subprocess.run(
        [cmd, "verify", str(tmp_path / "none.sif")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_the_lumi_g_ext_familys_runtime_settings(images, image_runtime):
    # The 2024 family (LUMI ROCm base images): the host's Cray libfabric and
    # libcxi bound, aws-ofi-rccl, GDR level 3 only in the distributed runscript.
    labels, env, runtime = image_runtime("lumi-g-ext image", images["full"][0])
    binds = labels["cotainr-lumi.binds"].split(",")
    assert {"/opt/cray", "/usr/lib64/libcxi.so.1", "/var/spool/slurmd"} <= set(binds)
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert env["CXI_FORK_SAFE"] == "1" and env["CXI_FORK_SAFE_HP"] == "1"
    assert "NCCL_NET_GDR_LEVEL" not in env
    assert env["COTAINR_LUMI_NCCL_NET_GDR_LEVEL"] == "3"
    assert "/opt/cray/libfabric/" in env["LD_LIBRARY_PATH"]
    assert runtime["libfabric"] == "host"
    assert runtime["net-plugin"]["generation"] == "aws-ofi-rccl"
