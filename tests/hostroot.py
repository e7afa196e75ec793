"""A host tree laid out like LUMI after its January 2026 update, and profiles for it.

Versions from docs/issue 28's sources: PE 25.03 default (cray-mpich 8.1.32,
PMI 6.1.15, PALS 1.2.12; LUMI-SoftwareStack CrayPE/CPEpackages_25.03.csv),
cray-mpich 9.0.1 (25.09), libfabric 1.22.0 (LUMI-EasyBuild-contrib
aws-ofi-nccl-1.18.0-rocm.eb), amdgpu 6.3.60300 and ROCm 6.3.4
(LUMI-training-materials User-Updates/Update-202601).
"""

import os
from pathlib import Path

SIF_DIR = "/appl/local/containers/sif-images"
MPICH = "/opt/cray/pe/mpich/{}/ofi/gnu/12.3"
#: LUMI's binds with the host libfabric (also e2e/test_lumi_env.py's test system).
BINDS = [
    "/var/spool/slurmd",
    "/opt/cray",
    "/usr/lib64/libcxi.so.1",
    "/pfs",
    "/scratch",
    "/projappl",
    "/project",
    "/flash",
    "/appl",
]


def _file(root, path, text="x"):
    host = Path(root, path.lstrip("/"))
    host.parent.mkdir(parents=True, exist_ok=True)
    host.write_text(text)


def _link(root, path, target):
    host = Path(root, path.lstrip("/"))
    host.parent.mkdir(parents=True, exist_ok=True)
    host.symlink_to(target)


def lumi_2026(root, *, driver="6.3.60300", image_target=None):
    """Lay out the host tree at `root`; return `root`."""
    for version in ("8.1.32", "9.0.1"):
        lib = MPICH.format(version)
        _file(root, f"{lib}/lib/libmpi_gnu_123.so.12")
        _link(root, f"{lib}/lib-abi-mpich/libmpi.so.12", "../lib/libmpi_gnu_123.so.12")
    _link(
        root,
        "/opt/cray/pe/lib64/libmpi_gnu_123.so.12",
        MPICH.format("8.1.32") + "/lib/libmpi_gnu_123.so.12",
    )
    _file(root, "/opt/cray/libfabric/1.22.0/lib64/libfabric.so.1")
    _file(root, "/opt/cray/pe/pmi/6.1.15/lib/libpmi.so.0")
    _file(root, "/opt/cray/pals/1.2.12/lib/libpals.so.0")
    _file(root, "/opt/cray/xpmem/default/lib64/libxpmem.so.0")
    _file(root, "/usr/lib64/libcxi.so.1.5.0")
    _link(root, "/usr/lib64/libcxi.so.1", "libcxi.so.1.5.0")
    _file(root, "/usr/lib64/libjansson.so.4")
    for path in ("/var/spool/slurmd", "/pfs", "/scratch", "/projappl", "/project"):
        Path(root, path.lstrip("/")).mkdir(parents=True)
    Path(root, "flash").mkdir()
    _file(root, f"{SIF_DIR}/lumi-rocm-rocm-6.2.4-dockerhash-20260115.sif")
    _file(root, f"{SIF_DIR}/lumi-rocm-rocm-6.3.4-dockerhash-20260115.sif")
    _link(
        root,
        f"{SIF_DIR}/lumi-rocm-rocm-6.2.4.sif",
        image_target or "lumi-rocm-rocm-6.2.4-dockerhash-20260115.sif",
    )
    _file(root, "/sys/module/amdgpu/version", driver + "\n")
    _file(root, "/opt/rocm-6.3.4/.info/version", "6.3.4-128\n")
    _link(root, "/opt/rocm", "rocm-6.3.4")
    return root


def _system(name, *, image, mpich, pmi, pals, libfabric):
    paths = [
        f"/opt/cray/pe/pmi/{pmi}/lib",
        f"/opt/cray/pals/{pals}/lib",
        "/opt/cray/pe/lib64",
        f"/opt/cray/libfabric/{libfabric}/lib64",
    ]
    return (
        f"  {name}:\n    extends: lumi-g-ext\n    base-image: {image}\n"
        '    rocm-version: "6.2"\n    settings:\n'
        '      rocm: {supported: "6.1-7.0"}\n'
        f"      lumi-env:\n        binds: [{', '.join(BINDS)}]\n"
        "        mpi-host:\n"
        f"          libmpi: {MPICH.format(mpich)}/lib-abi-mpich/libmpi.so.12\n"
        f"          ld-library-path: [{', '.join(paths)}]\n"
        "          binds: [/opt/cray, /var/spool/slurmd, /usr/lib64/libcxi.so.1]\n"
    )


def write_profile(path):
    """A site profile: ``lumi-2026`` names today's host facts, ``lumi-2024`` CPE 24.03's."""
    image = f"{SIF_DIR}/lumi-rocm-rocm-6.2.4.sif"
    Path(path).write_text(
        "systems:\n"
        + _system(
            "lumi-2026",
            image=image,
            mpich="8.1.32",
            pmi="6.1.15",
            pals="1.2.12",
            libfabric="1.22.0",
        )
        + _system(
            "lumi-2024",
            image=f"{SIF_DIR}/lumi-rocm-rocm-6.0.3.sif",
            mpich="8.1.29",
            pmi="6.1.14",
            pals="1.3.2",
            libfabric="1.15.2.0",
        )
        + f"  lumi-escape:\n    extends: lumi-2026\n    base-image: {SIF_DIR}/escape.sif\n"
    )
    return os.fspath(path)
