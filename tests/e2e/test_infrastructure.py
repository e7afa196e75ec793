"""Smoke tests of the e2e infrastructure: apptainer, base images, stock cotainr."""

from __future__ import annotations

from pathlib import Path
import shutil
import subprocess
import sys

from hosttools import unavailable
import pytest

pytestmark = pytest.mark.e2e

ENV_PREFIX = "/opt/cotainr/conda/envs/conda_container_env"

# library name -> (SONAME, DT_NEEDED that must be present)
ROCM_LIBS = {
    "libamdhip64.so": (
        "libamdhip64.so.6",
        {"libhsa-runtime64.so.1", "libamd_comgr.so.2"},
    ),
    "libhsa-runtime64.so": ("libhsa-runtime64.so.1", set()),
    "librccl.so": ("librccl.so.1", {"libamdhip64.so.6", "librocm_smi64.so.7"}),
    "librocblas.so": ("librocblas.so.4", {"libamdhip64.so.6"}),
    "libMIOpen.so": ("libMIOpen.so.1", {"libamdhip64.so.6", "librocblas.so.4"}),
    "libhipblaslt.so": ("libhipblaslt.so.0", {"libamdhip64.so.6"}),
    "libroctx64.so": ("libroctx64.so.4", set()),
    "librocm_smi64.so": ("librocm_smi64.so.7", set()),
    "libamd_comgr.so": ("libamd_comgr.so.2", set()),
}

_LAYOUT_SCRIPT = r"""
set -e
echo "rocm_link=$(readlink /opt/rocm)"
echo "info_version=$(cat /opt/rocm/.info/version)"
for d in /opt/rocm/lib/rocblas/library /opt/rocm/lib/hipblaslt/library; do
    echo "datadir=$d:$(ls "$d" | wc -l)"
done
for lib in /opt/rocm/lib/lib*.so /opt/aws-ofi-rccl/librccl-net.so; do
    echo "lib=$(basename "$lib") chain=$(readlink "$lib")>$(readlink "$(dirname "$lib")/$(readlink "$lib")")"
    readelf -d "$lib" | sed -n 's/.*(\(SONAME\|NEEDED\)).*\[\(.*\)\]/\1=\2/p'
done
"""


def _parse_layout(stdout: str) -> dict:
    info: dict = {"libs": {}, "datadirs": {}}
    current = None
    for line in stdout.splitlines():
        key, _, value = line.partition("=")
        if key == "lib":
            name, _, chain = value.partition(" chain=")
            current = info["libs"].setdefault(name, {"needed": set(), "chain": chain})
        elif key == "SONAME":
            current["soname"] = value
        elif key == "NEEDED":
            current["needed"].add(value)
        elif key == "datadir":
            path, _, count = value.rpartition(":")
            info["datadirs"][path] = int(count)
        else:
            info[key] = value
    return info


@pytest.fixture(params=["6.1.3", "6.0.3"])
def base_image_and_version(request):
    name = (
        "lumi_like_base_image"
        if request.param == "6.1.3"
        else "lumi_like_base_image_rocm60"
    )
    return request.getfixturevalue(name), request.param


def test_apptainer_and_singularity_on_path(apptainer_path: Path):
    for name in ("apptainer", "singularity"):
        found = shutil.which(name)  # hosttools: ok (the fixture's PATH)
        assert Path(found).parent == apptainer_path
        out = subprocess.run(
            [name, "--version"], capture_output=True, text=True, check=True
        )
        assert "version" in out.stdout


def test_base_image_rocm_layout(base_image_and_version, apptainer_exec):
    sif, version = base_image_and_version
    proc = apptainer_exec(sif, "bash", "-c", _LAYOUT_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    info = _parse_layout(proc.stdout)

    assert info["rocm_link"] == f"/opt/rocm-{version}"
    assert info["info_version"].startswith(f"{version}-")
    assert all(n > 0 for n in info["datadirs"].values()), info["datadirs"]
    vnum = "{}{:02d}{:02d}".format(*map(int, version.split(".")))
    for lib, (soname, needed) in ROCM_LIBS.items():
        got = info["libs"][lib]
        assert got["soname"] == soname, lib
        assert needed <= got["needed"], (lib, got["needed"])
        # libX.so -> libX.so.N -> libX.so.N.M.<vnum>
        first, _, second = got["chain"].partition(">")
        assert (
            first == soname
            and second.startswith(soname + ".")
            and second.endswith(vnum)
        )
    assert info["libs"]["librccl-net.so"]["soname"] == "librccl-net.so.0"


def test_base_image_environment(lumi_like_base_image: Path, apptainer_exec):
    code = (
        "import ctypes, os, sys\n"
        "print(sys.prefix)\n"
        "print(os.environ['ROCM_PATH'], os.environ['ROCM_RELEASE'], os.environ.get('CONDA_PREFIX'))\n"
        "print(os.environ['LD_LIBRARY_PATH'])\n"
        "rccl = ctypes.CDLL('librccl.so.1')\n"
        "rccl.rccl_rocm_version.restype = ctypes.c_char_p\n"
        "print(rccl.rccl_marker(), rccl.rccl_rocm_version().decode())\n"
        "print(ctypes.CDLL('librccl-net.so').rccl_net_marker())\n"
    )
    proc = apptainer_exec(lumi_like_base_image, "python", "-c", code)
    assert proc.returncode == 0, proc.stderr
    prefix, rocm, ld_path, rccl, net = proc.stdout.splitlines()
    assert prefix == ENV_PREFIX
    assert rocm.split() == ["/opt/rocm", "6.1.3", ENV_PREFIX]
    # LUMI's order: the host's Cray libraries (bound), ROCm, the plugin.
    ld = ld_path.split(":")
    assert ld[0] == "/opt/cray/libfabric/1.15.2.0/lib64"
    assert ld.index("/opt/rocm/lib") < ld.index("/opt/aws-ofi-rccl")
    assert rccl == "103 6.1.3"
    assert net == "110"

    pip = apptainer_exec(lumi_like_base_image, "pip", "--version")
    assert pip.returncode == 0, pip.stderr
    assert ENV_PREFIX in pip.stdout


def test_stock_cotainr_build(
    lumi_like_base_image: Path, apptainer_exec, apptainer_path, tmp_path, cotainr_build
):
    cotainr = Path(sys.executable).parent / "cotainr"
    if not cotainr.exists():
        unavailable(f"no cotainr executable next to {sys.executable}")
    out = tmp_path / "stock.sif"
    cotainr_build(tmp_path, out, "--base-image", lumi_like_base_image, timeout=900)
    assert out.is_file()

    labels = subprocess.run(
        [str(apptainer_path / "apptainer"), "inspect", "--labels", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "cotainr.version" in labels.stdout

    proc = apptainer_exec(out, "python", "-c", "import sys; print(sys.prefix)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ENV_PREFIX
