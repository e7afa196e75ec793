"""A host tree laid out as LUMI's published artefacts show it, and profiles for it.

Every path, link and version comes from an artefact in ``tests/artefacts/``
(each cites repository, path, lines and commit); nothing is named to fit our
code. LUMI after its January 2026 update (``lumi-update-202601``):

- the four PEs side by side (``lumi-cpe-<pe>``): Cray MPICH 8.1.27, 8.1.29,
  8.1.32 and 9.0.1, PMI 6.1.12 to 6.1.16; the default PE is 25.03, so
  ``/opt/cray/pe/lib64/libmpi_gnu_123.so.12`` links to 8.1.32 (absolute
  target, ``lumi-course-102-cpe-2026``) although 9.0.1 is the newest;
- Cray MPICH's ``ofi/gnu/<v>`` directories (12.3: ``lumi-course-102-cpe-2026``,
  ``lust-singularity-bindings-24.03``; 9.1 for 8.1.27:
  ``lust-singularity-bindings-23.09``) with ``lib-abi-mpich/libmpi.so.12``
  linking to ``../lib/<library>`` (the shape of ``amd-server-files-tree``,
  with the library name of the 102-CPE ``ls -l``: a combination of two facts);
- PMI in ``/opt/cray/pe/pmi/<v>/lib`` and PALS in ``/opt/cray/pals/1.3.2/lib``
  (the directories ``lust-singularity-bindings-24.03`` names; the CPE tables'
  PALS 1.2.12 is not a directory any source shows);
- libfabric 1.22.0 (``lust-aws-ofi-nccl-1.18.0``), libcxi
  (``amd-server-files-tree``), libjansson 4.14.0 and XPMEM's default link
  through ``/etc/alternatives`` (``lust-ccpe-25.09``);
- LUST's cotainr base images (``lust-cotainr-2025.7.1``), ROCm 6.3.4 and the
  amdgpu driver 6.3.60300 (``lumi-update-202601``).

Directories hold no invented file names: where a source names only a
directory (PMI, PALS), the tree has the directory.
"""

import os
from pathlib import Path

import artefacts

#: LUMI's PEs after January 2026, oldest first (all installed).
PES = ("23.09", "24.03", "25.03", "25.09")
#: The library the default-PE link names (lumi-course-102-cpe-2026).
DEFAULT_LINK = "/opt/cray/pe/lib64/libmpi_gnu_123.so.12"


def facts(slug):
    """The facts of artefact `slug`."""
    return artefacts.load(slug).facts


def mpich_versions():
    """{PE: Cray MPICH version} of the four PEs (lumi-cpe-<pe>)."""
    return {pe: facts(f"lumi-cpe-{pe}")["mpich"] for pe in PES}


def pmi_versions():
    """{PE: Cray PMI version} of the four PEs (lumi-cpe-<pe>)."""
    return {pe: facts(f"lumi-cpe-{pe}")["pmi"] for pe in PES}


def _gnu(version):
    """The ofi/gnu/<v> directory of a Cray MPICH version (its bindings' or 12.3)."""
    abi = facts("lust-singularity-bindings-23.09")["singularityenv-ld-library-path"][0]
    if f"/mpich/{version}/" in abi:
        return abi.split("/ofi/gnu/")[1].split("/")[0]
    return facts("lust-singularity-bindings-24.03")["gnu-toolchain"]


def mpich_dir(version):
    """``/opt/cray/pe/mpich/<version>/ofi/gnu/<v>`` on LUMI."""
    return f"/opt/cray/pe/mpich/{version}/ofi/gnu/{_gnu(version)}"


def abi_library(version):
    """The MPICH-ABI ``libmpi.so.12`` of a Cray MPICH version on LUMI."""
    return f"{mpich_dir(version)}/lib-abi-mpich/libmpi.so.12"


def default_mpich():
    """The default PE's Cray MPICH (lumi-update-202601, lumi-cpe-<pe>)."""
    return mpich_versions()[facts("lumi-update-202601")["default-pe"]]


def pals_dir():
    """The PALS directory LUST's bindings name."""
    return next(
        p
        for p in facts("lust-singularity-bindings-24.03")[
            "singularityenv-ld-library-path"
        ]
        if "/pals/" in p
    )


def libfabric_dir():
    """The host libfabric's lib64 after January 2026."""
    return facts("lust-aws-ofi-nccl-1.18.0")["libfabric-prefix"] + "/lib64"


def binds():
    """LUST's PyTorch 2.7.1 module binds, without its runscripts bind."""
    return [b for b in facts("lust-pytorch-2.7.1")["binds"] if ":" not in b]


#: LUMI's binds with the host libfabric (also e2e/test_lumi_env.py's test system).
BINDS = binds()


def _file(root, path, text="x"):
    host = Path(root, path.lstrip("/"))
    host.parent.mkdir(parents=True, exist_ok=True)
    host.write_text(text)


def _dir(root, path):
    Path(root, path.lstrip("/")).mkdir(parents=True, exist_ok=True)


def _link(root, path, target):
    host = Path(root, path.lstrip("/"))
    host.parent.mkdir(parents=True, exist_ok=True)
    host.symlink_to(target)


def _cray_pe(root):
    """The four PEs' Cray MPICH and PMI, and the default PE's link."""
    links = facts("lumi-course-102-cpe-2026")["pe-lib64-links"]
    library = Path(DEFAULT_LINK).name
    for version in mpich_versions().values():
        lib = mpich_dir(version)
        if lib.endswith("/12.3"):
            _file(root, f"{lib}/lib/{library}")
            _link(root, f"{lib}/lib-abi-mpich/libmpi.so.12", f"../lib/{library}")
        else:  # no source names the library of this compiler version
            _file(root, f"{lib}/lib-abi-mpich/libmpi.so.12")
    _link(root, DEFAULT_LINK, links[DEFAULT_LINK])
    for pmi in pmi_versions().values():
        _dir(root, f"/opt/cray/pe/pmi/{pmi}/lib")


def _cray_network(root):
    """PALS, libfabric, XPMEM, libcxi and libjansson as LUMI has them."""
    ccpe = facts("lust-ccpe-25.09")
    _dir(root, pals_dir())
    _file(root, f"{libfabric_dir()}/libfabric.so.1")
    _dir(root, f"{ccpe['xpmem-dir']}/lib64")
    _link(root, ccpe["xpmem-default-via"], ccpe["xpmem-dir"])
    _link(root, "/opt/cray/xpmem/default", ccpe["xpmem-default-via"])
    links = facts("amd-server-files-tree")["links"]
    cxi = links["/usr/lib64/libcxi.so.1"]
    _file(root, f"/usr/lib64/{cxi}")
    _link(root, "/usr/lib64/libcxi.so.1", cxi)
    jansson = ccpe["host-libjansson"]
    _file(root, jansson)
    _link(root, "/usr/lib64/libjansson.so.4", Path(jansson).name)


def lumi_2026(root, *, driver=None, image_target=None):
    """
    Lay out the host tree at `root`; return `root`.

    `driver` replaces the amdgpu version, `image_target` makes the ROCm 6.2
    base image a link to that file name beside it (test variations of an
    update, not facts).
    """
    update = facts("lumi-update-202601")
    _cray_pe(root)
    _cray_network(root)
    for path in BINDS:
        if not path.startswith("/usr/"):
            _dir(root, path)
    for system in facts("lust-cotainr-2025.7.1")["systems"].values():
        image = system["base-image"]
        if image.startswith("/") and not Path(root, image.lstrip("/")).exists():
            _file(root, image)
    if image_target:
        image = facts("lust-cotainr-2025.7.1")["systems"]["rocm-6.2"]["base-image"]
        Path(root, image.lstrip("/")).unlink()
        _file(root, str(Path(image).with_name(image_target)))
        _link(root, image, image_target)
    _file(
        root, "/sys/module/amdgpu/version", (driver or update["amdgpu-driver"]) + "\n"
    )
    rocm = update["system-rocm"]
    _file(root, f"/opt/rocm-{rocm}/.info/version", rocm + "\n")
    return root


def _system(name, *, image, libmpi, paths):
    return (
        f"  {name}:\n    extends: lumi-g-ext-rocm-6.2\n    base-image: {image}\n"
        '    rocm-version: "6.2"\n    settings:\n'
        '      rocm: {supported: "6.1-7.0"}\n'
        f"      lumi-env:\n        binds: [{', '.join(BINDS)}]\n"
        "        mpi-host:\n"
        f"          libmpi: {libmpi}\n"
        f"          ld-library-path: [{', '.join(paths)}]\n"
        "          binds: [/opt/cray, /var/spool/slurmd, /usr/lib64/libcxi.so.1]\n"
    )


def base_image(system):
    """The base image of one of LUST's cotainr 2025.7.1 systems."""
    return facts("lust-cotainr-2025.7.1")["systems"][system]["base-image"]


def write_profile(path):
    """
    A site profile: ``lumi-2026`` names today's host facts (the default PE
    25.03), ``lumi-2024`` those of LUST's 24.03 bindings, with the ROCm
    6.0.3 base image of LUST's cotainr 2025.03.0 (gone from 2025.7.1).
    """
    pe = facts("lumi-cpe-25.03")
    today = [
        f"/opt/cray/pe/pmi/{pe['pmi']}/lib",
        pals_dir(),
        "/opt/cray/pe/lib64",
        libfabric_dir(),
    ]
    old = facts("lust-singularity-bindings-24.03")["singularityenv-ld-library-path"]
    image = base_image("rocm-6.2")
    Path(path).write_text(
        "systems:\n"
        + _system(
            "lumi-2026",
            image=image,
            libmpi=abi_library(pe["mpich"]),
            paths=today,
        )
        + _system(
            "lumi-2024",
            image=image.replace("6.2.4", "6.0.3"),
            libmpi=f"{old[1]}/libmpi.so.12",
            paths=[p for p in old[2:] if p.startswith("/opt/")],
        )
        + f"  lumi-escape:\n    extends: lumi-2026\n    base-image: {Path(image).parent}/escape.sif\n"
    )
    return os.fspath(path)
