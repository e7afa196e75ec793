"""End-to-end: the network family is decided from the image (issue 28).

A cheap variant of the cached LUMI-like base laid out like AMD's 2025 PyTorch
images (``layouts.LIBFABRIC_2025``: their own libfabric and libcxi, the
aws-ofi-rccl plugin linked to them) gets no host libfabric: no ``/opt/cray``
or libcxi bind, nothing of ``/opt/cray`` added to ``LD_LIBRARY_PATH``, and
``cotainr-lumi verify``'s libfabric row agrees. The 2024 layout (the cached
base itself) keeps the host family: ``test_verify_image.py``.
"""

import time

import layouts
from prune_fixtures import derive_base_image
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def image(
    tmp_path_factory, lumi_like_base_image, apptainer_path, build_times, cotainr_build
):
    work = tmp_path_factory.mktemp("libfabric-2025")
    t0 = time.time()
    base = derive_base_image(
        apptainer=str(apptainer_path / "apptainer"),
        base_image=lumi_like_base_image,
        work=work,
        cases=(),
        setup=layouts.LIBFABRIC_2025,
    )
    proc = cotainr_build(
        work,
        work / "image.sif",
        "--system=pytorch-2025",
        "--skip-stage=pip",
        "--skip-stage=prune",
        "--set=lumi-env.module-file=false",
        systems={"pytorch-2025": {"extends": "lumi-g-ext-pytorch", "base-image": base}},
        timeout=900,
    )
    build_times["libfabric 2025: derive base + build"] = time.time() - t0
    return work / "image.sif", proc.output


def test_an_image_with_its_own_libfabric_gets_no_host_libfabric(
    image, image_runtime, apptainer_exec, verify_image, e2e_facts
):
    sif, log = image
    assert "needs libfabric.so.1: the image's /opt/libfabric/lib/libfabric.so.1" in log
    labels, env, runtime = image_runtime("2025 PyTorch layout", sif)
    assert runtime["libfabric"] == "image"
    binds = labels["cotainr-lumi.binds"].split(",")
    assert "/opt/cray" not in binds and "/usr/lib64/libcxi.so.1" not in binds
    assert env["LD_LIBRARY_PATH"].startswith("/opt/libfabric/lib:/opt/shs-libcxi/lib")
    ours = apptainer_exec(sif, "cat", "/.singularity.d/env/93-cotainr-lumi-env.sh")
    assert ours.returncode == 0 and "/opt/cray" not in ours.stdout
    code, rows, report = verify_image(sif)
    e2e_facts["2025 PyTorch layout, verify network rows"] = ", ".join(
        f"{c} {s}" for c, s in rows.items() if "libfabric" in c or "net-plugin" in c
    )
    assert rows["image-libfabric"] == "PASS", report
    assert "cray-libfabric" not in rows
    assert rows["net-plugin-deps"] == "PASS", report
