"""A test base laid out like the LUMI AI Factory torch image (issue 19).

Derived from the cached LUMI-like base (Debian 12, which has Ubuntu's
multiarch library directory ``/usr/lib/x86_64-linux-gnu``) by
:data:`SETUP`, after lumi-ai-factory/laifs-container-recipes
(``containerfiles/{rocm,libfabric,mpich,torch}``):

- the 2024 layers removed: cotainr's pre-activated conda env,
  ``/opt/aws-ofi-rccl``, the stub ROCm 6.1.3 and its environment (the host's
  ``/opt/cray`` on ``LD_LIBRARY_PATH``);
- a stub ROCm 7.0.2 at ``/opt/rocm-7.0.2`` (``/opt/rocm`` links to it;
  ROCm 7 SONAMEs: ``libamdhip64.so.7``, ``librocblas.so.5`` ...), found
  through ``/etc/ld.so.conf.d/rocm-30.conf`` as in the recipe, no
  ``ROCM_PATH``;
- in the multiarch directory: stub ``libcxi.so.1``, ``libfabric.so.1``
  (needs libcxi), ``libmpi.so.12`` (MPICH ABI, needs libfabric), the
  aws-ofi-nccl plugin as its ROCm build names itself, ``librccl-net-ofi.so``
  (needs libfabric and libcxi; RCCL loads it only as ``NCCL_NET_PLUGIN=ofi``),
  and a decoy ``libnccl-net.so`` (NCCL's name, which RCCL never loads);
  ``/usr/libexec/rccl-tests/all_reduce_perf``; the OCI entry point
  ``/opt/oci-entrypoint.sh`` of the newest recorded release (:data:`RELEASE`,
  written from its artefact by ``tests/entrypoints.py``: ``#!/usr/bin/env
  bash``, ``FI_HMEM_DISABLE_P2P`` on one node without GPUs, the GPU binding
  ``ROCR_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES`` when opted in) and the
  runscript Apptainer itself writes for it, taken from a sandbox Apptainer
  builds of a one-file OCI image with that ``ENTRYPOINT``
  (:func:`oci_entrypoint`);
- the venv ``/opt/venv`` (Debian's python3 -m venv), exposed only through
  ``PATH`` and ``PYTHONPATH`` (no ``VIRTUAL_ENV``), holding a torch-like
  tree: ``torch 2.10.0+rocm7.0`` as an installed distribution, ``torch/lib``
  with copies of the base's ROCm 7 libraries and ``rocblas/``, and a
  ``libtorch_hip.so`` whose RUNPATH prefers ``/opt/rocm/lib`` (the recipe
  patches it so); and ``aifswap 1.0`` (with ``aifswap/old.py``), which a
  build replaces;
- ``MPIR_CVAR_*`` GPU settings in the image's environment, in
  ``10-docker2singularity.sh`` as Apptainer writes the ``ENV`` lines of the
  OCI archive the recipe builds the SIF from; ``/.sbom.json``
  (``{"apt": [...], "pip": [...]}``) as the recipe writes it;
- ``/usr/bin/python3`` (Debian's) stays: the system python decoy.
"""

import hashlib
import io
import json
import subprocess
import tarfile

import entrypoints

VENV = "/opt/venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
ROCM = "/opt/rocm-7.0.2"
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
TORCH_VERSION = "2.10.0+rocm7.0"
#: The release whose entry point the base has.
RELEASE = "20260807"


def _blob(blobs, data, media_type):
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def oci_entrypoint(*, apptainer, work):
    """A sandbox of a one-file OCI image whose ENTRYPOINT is RELEASE's entry point.

    Apptainer builds it from an OCI layout written here, so its runscript is
    Apptainer's own for that ENTRYPOINT (``OCI_ENTRYPOINT=``, no CMD).
    """
    form = entrypoints.facts(RELEASE)
    script = entrypoints.script(RELEASE).encode()
    layout = work / "oci-entrypoint"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for name in ("opt", form["path"].lstrip("/")):
            info = tarfile.TarInfo(name)
            info.mode = 0o755
            if name == "opt":
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(script)
            tar.addfile(info, io.BytesIO(script) if info.isfile() else None)
    layer = layer.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": form["entrypoint"]},
        "rootfs": {
            "type": "layers",
            "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"],
        },
    }
    oci = "application/vnd.oci.image"
    manifest = {
        "schemaVersion": 2,
        "mediaType": f"{oci}.manifest.v1+json",
        "config": _blob(blobs, json.dumps(config).encode(), f"{oci}.config.v1+json"),
        "layers": [_blob(blobs, layer, f"{oci}.layer.v1.tar")],
    }
    index = [_blob(blobs, json.dumps(manifest).encode(), f"{oci}.manifest.v1+json")]
    (layout / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "manifests": index})
    )
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    sandbox = work / "oci-entrypoint-sandbox"
    proc = subprocess.run(
        [apptainer, "build", "--sandbox", str(sandbox), f"oci:{layout}"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sandbox


def setup(*, oci_sandbox):
    """The script deriving the base, with the entry point of `oci_sandbox`."""
    return SETUP.replace("@OCI_SANDBOX@", str(oci_sandbox))


SETUP = rf"""
set -euo pipefail
trap 'echo "aif layout: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
W="$(mktemp -d)"
rm -f /.singularity.d/env/92-cotainr-env.sh /.singularity.d/env/90-environment.sh \
    /.singularity.d/env/10-docker2singularity.sh
rm -rf /opt/cotainr /opt/aws-ofi-rccl /opt/rocm /opt/rocm-6.1.3

# mklib DIR NAME SOMAJOR [LINK FLAGS...]: a stub library with a real SONAME.
mklib() {{
    local dir=$1 name=$2 major=$3 stem
    shift 3
    stem=${{name//-/_}}
    printf 'int %s_marker(void) {{ return 1; }}\n' "${{stem,,}}" >"$W/$name.c"
    gcc -O1 -shared -fPIC -o "$dir/lib$name.so.$major.70002" "$W/$name.c" \
        -Wl,-soname,"lib$name.so.$major" -Wl,--no-as-needed -L"$dir" "$@"
    ln -sfn "lib$name.so.$major.70002" "$dir/lib$name.so.$major"
    ln -sfn "lib$name.so.$major" "$dir/lib$name.so"
}}

# ROCm 7.0.2 (stub).
L={ROCM}/lib
mkdir -p "$L/rocblas/library" {ROCM}/bin {ROCM}/.info
echo 7.0.2-56 >{ROCM}/.info/version
ln -sfn {ROCM} /opt/rocm
mklib "$L" amd_comgr 3
mklib "$L" hsa-runtime64 1
mklib "$L" roctx64 4
mklib "$L" rocm_smi64 1
mklib "$L" amdhip64 7 -lhsa-runtime64 -lamd_comgr
mklib "$L" rocblas 5 -lamdhip64 -lroctx64
mklib "$L" hipblaslt 1 -lamdhip64
mklib "$L" rccl 1 -lamdhip64 -lhsa-runtime64 -lrocm_smi64
mklib "$L" MIOpen 1 -lamdhip64 -lrocblas
echo 'stub Tensile library gfx90a (ROCm 7.0.2)' >"$L/rocblas/library/TensileLibrary_lazy_gfx90a.dat"
printf '#!/bin/sh\necho "stub rocm-smi 7.0.2: no GPUs"\n' >{ROCM}/bin/rocm-smi
chmod 755 {ROCM}/bin/rocm-smi
echo /opt/rocm/lib >/etc/ld.so.conf.d/rocm-30.conf

# The network layer inside the image (libcxi, libfabric, MPICH, aws-ofi-nccl).
M={MULTIARCH}
mklib "$M" cxi 1
mklib "$M" fabric 1 -lcxi
mklib "$M" mpi 12 -lfabric
printf 'int nccl_net_ofi_marker(void) {{ return 1; }}\n' >"$W/net.c"
gcc -O1 -shared -fPIC -o "$M/librccl-net-ofi.so" "$W/net.c" -Wl,--no-as-needed \
    -L"$M" -lfabric -lcxi
gcc -O1 -shared -fPIC -o "$M/libnccl-net.so" "$W/net.c"
ldconfig
mkdir -p /usr/libexec/rccl-tests /usr/libexec/osu-micro-benchmarks
printf '#!/bin/sh\necho "stub all_reduce_perf"\n' >/usr/libexec/rccl-tests/all_reduce_perf
chmod 755 /usr/libexec/rccl-tests/all_reduce_perf
# The release's OCI entry point and Apptainer's runscript for it.
cp @OCI_SANDBOX@/opt/oci-entrypoint.sh /opt/oci-entrypoint.sh
cp @OCI_SANDBOX@/.singularity.d/runscript /.singularity.d/runscript
chmod 755 /opt/oci-entrypoint.sh /.singularity.d/runscript

# The venv with a ROCm 7 torch-like tree.
/usr/bin/python3 -m venv {VENV}
T={SITE}/torch
mkdir -p "$T/lib"
for n in libamdhip64.so.7 libhsa-runtime64.so.1 libamd_comgr.so.3 librccl.so.1 \
         librocm_smi64.so.1 librocblas.so.5 libroctx64.so.4; do
    cp -L "$L/$n" "$T/lib/$n"
done
cp -rL "$L/rocblas" "$T/lib/rocblas"
printf 'extern int amdhip64_marker(void);\nextern int rccl_marker(void);\n' >"$W/th.c"
printf 'int torch_hip_probe(void) {{ return amdhip64_marker() + rccl_marker(); }}\n' >>"$W/th.c"
gcc -shared -fPIC -o "$T/lib/libtorch_hip.so" "$W/th.c" -Wl,-soname,libtorch_hip.so \
    -L"$T/lib" -l:libamdhip64.so.7 -l:librccl.so.1 \
    -Wl,-rpath,/opt/rocm/lib:'$ORIGIN',--enable-new-dtags
printf 'from typing import Optional\n__version__ = "{TORCH_VERSION}"\nhip: Optional[str] = "7.0.51831-fixture"\n' \
    >"$T/version.py"
: >"$T/__init__.py"
D={SITE}/torch-{TORCH_VERSION}.dist-info
mkdir -p "$D"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: {TORCH_VERSION}\n' >"$D/METADATA"
echo pip >"$D/INSTALLER"
: >"$D/RECORD"
# A pure-Python distribution a build replaces (its aifswap/old.py goes).
mkdir -p {SITE}/aifswap {SITE}/aifswap-1.0.dist-info
echo 'VERSION = "1.0"' >{SITE}/aifswap/__init__.py
echo 'GONE_IN_2 = True' >{SITE}/aifswap/old.py
printf 'Metadata-Version: 2.1\nName: aifswap\nVersion: 1.0\n' \
    >{SITE}/aifswap-1.0.dist-info/METADATA
printf 'aifswap/%s,,\n' __init__.py old.py >{SITE}/aifswap-1.0.dist-info/RECORD
printf 'aifswap-1.0.dist-info/%s,,\n' METADATA RECORD >>{SITE}/aifswap-1.0.dist-info/RECORD

# The image's environment, as the recipe's ENV lines make it.
cat >/.singularity.d/env/10-docker2singularity.sh <<'EOF'
#!/bin/sh
export PATH="{VENV}/bin:$PATH"
export PYTHONPATH="{SITE}${{PYTHONPATH:+:$PYTHONPATH}}"
export MPIR_CVAR_CH4_OFI_ENABLE_HMEM=1
export MPIR_CVAR_CH4_OFI_ENABLE_MR_HMEM=1
export MPIR_CVAR_ENABLE_GPU=1
EOF
# Apptainer's own empty 90-environment.sh (/environment links to it).
printf '#!/bin/sh\n# Custom environment shell code should follow\n\n' \
    >/.singularity.d/env/90-environment.sh
chmod 755 /.singularity.d/env/10-docker2singularity.sh /.singularity.d/env/90-environment.sh

# The SBOM the recipe writes: {{"apt": [...], "pip": [pip list --format=json]}}.
dpkg-query -W -f='${{Package}}\t${{Version}}\n' >"$W/apt.tsv"
{VENV}/bin/python -m pip list --format=json --disable-pip-version-check >"$W/pip.json"
{VENV}/bin/python - "$W/apt.tsv" "$W/pip.json" <<'EOF'
import json, sys
apt = [dict(zip(("name", "version"), line.split("\t")))
       for line in open(sys.argv[1]).read().splitlines() if line]
pip = json.load(open(sys.argv[2]))
json.dump({{"apt": apt, "pip": pip}}, open("/.sbom.json", "w"), indent=2)
EOF
rm -rf "$W"
"""
