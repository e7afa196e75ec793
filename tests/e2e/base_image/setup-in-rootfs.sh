#!/bin/bash
# Runs INSIDE the debootstrapped Debian 12 rootfs (chroot) of the LUMI-like
# test base image; called by build-base-image.sh.
#
#   setup-in-rootfs.sh ROCM_VERSION RECIPE_DIR_IN_ROOTFS
#
# Creates:
#   /opt/rocm-<ver>     stub ROCm: real ELF libraries (compiled from tiny C
#                       sources) under ROCm's names, SONAMEs and symlink chains
#   /opt/rocm           -> /opt/rocm-<ver>
#   /opt/aws-ofi-rccl   stub RCCL network plugin (librccl-net.so)
#   /opt/cotainr/conda  cotainr's conda location with a venv as the
#                       "conda_container_env" environment
#   /.singularity.d/env/90-environment.sh  ROCm environment
#   /.singularity.d/env/92-cotainr-env.sh  what cotainr 2025.7.1 writes
#
# Every stub library exports
#   int <stem>_marker(void)                  a fixed, distinct number (below)
#   const char *<stem>_rocm_version(void)    e.g. "6.1.3"
#   int <stem>_rocm_version_number(void)     e.g. 60103
# and, when it has DT_NEEDED dependencies, int <stem>_deps_marker_sum(void)
# which calls the dependencies' markers.
set -euo pipefail

VER="$1"
RECIPE="$2"
IFS=. read -r MAJ MIN PAT <<<"$VER"
VNUM=$((MAJ * 10000 + MIN * 100 + PAT))
case "$VER" in
6.1.3) BUILD=122 ;;
6.0.3) BUILD=39 ;;
*) BUILD=1 ;;
esac
PREFIX="/opt/rocm-$VER"
LIB="$PREFIX/lib"

mkdir -p "$LIB" "$PREFIX/bin" "$PREFIX/llvm/bin" "$PREFIX/llvm/lib" "$PREFIX/include/hip" \
    "$PREFIX/.info" "$LIB/rocblas/library" "$LIB/hipblaslt/library" "$PREFIX/share/doc/rocm-stub"
echo "$VER-$BUILD" >"$PREFIX/.info/version"
ln -sfn "$PREFIX" /opt/rocm

# name | SONAME major | minor (library's own version) | marker | DT_NEEDED (comma-separated names)
# Order matters: dependencies first.
if [[ "$MIN" -ge 1 ]]; then m_hsa=13 m_hip=$MIN m_blas=1 m_blaslt=7 m_comgr=7 m_smi=2; else
    m_hsa=12 m_hip=$MIN m_blas=0 m_blaslt=6 m_comgr=6 m_smi=0
fi
LIBS=(
    "amd_comgr|2|$m_comgr|109|"
    "hsa-runtime64|1|$m_hsa|102|"
    "roctx64|4|1|107|"
    "rocm_smi64|7|$m_smi|108|"
    "amdhip64|$MAJ|$m_hip|101|hsa-runtime64,amd_comgr"
    "rocblas|4|$m_blas|104|amdhip64,roctx64"
    "hipblaslt|0|$m_blaslt|106|amdhip64"
    "rccl|1|0|103|amdhip64,hsa-runtime64,rocm_smi64"
    "MIOpen|1|0|105|amdhip64,rocblas,amd_comgr,roctx64"
)

src_dir="$(mktemp -d)"
trap 'rm -rf "$src_dir"' EXIT

stem_of() { # C identifier stem of a library name
    local s="${1//-/_}"
    printf '%s\n' "${s,,}"
}

write_source() { # write_source FILE STEM MARKER LIBNAME DEPS
    local file="$1" stem="$2" marker="$3" libname="$4" deps="$5" d dstem
    {
        echo "/* cotainr-lumi e2e stub of ROCm $VER $libname (not the real library) */"
        echo "__attribute__((used)) static const char ident[] = \"cotainr-lumi stub $libname ROCm $VER-$BUILD\";"
        echo "int ${stem}_marker(void) { return $marker; }"
        echo "const char *${stem}_rocm_version(void) { return \"$VER\"; }"
        echo "int ${stem}_rocm_version_number(void) { return $VNUM; }"
        if [[ -n "$deps" ]]; then
            IFS=, read -r -a dl <<<"$deps"
            for d in "${dl[@]}"; do
                echo "extern int $(stem_of "$d")_marker(void);"
            done
            printf 'int %s_deps_marker_sum(void) { return 0' "$stem"
            for d in "${dl[@]}"; do
                dstem="$(stem_of "$d")"
                printf ' + %s_marker()' "$dstem"
            done
            echo '; }'
        fi
    } >"$file"
}

for spec in "${LIBS[@]}"; do
    IFS='|' read -r name somaj minor marker deps <<<"$spec"
    stem="$(stem_of "$name")"
    real="lib$name.so.$somaj.$minor.$VNUM"
    soname="lib$name.so.$somaj"
    write_source "$src_dir/$name.c" "$stem" "$marker" "lib$name" "$deps"
    link=()
    if [[ -n "$deps" ]]; then
        IFS=, read -r -a dl <<<"$deps"
        for d in "${dl[@]}"; do link+=("-l$d"); done
    fi
    gcc -O1 -shared -fPIC -o "$LIB/$real" "$src_dir/$name.c" \
        -Wl,-soname,"$soname" -Wl,--no-as-needed -L"$LIB" "${link[@]}"
    ln -sfn "$real" "$LIB/$soname"
    ln -sfn "$soname" "$LIB/lib$name.so"
done

# Data directories the way rocBLAS / hipBLASLt ship their Tensile kernels.
for arch in gfx90a gfx908 gfx942; do
    printf 'cotainr-lumi stub rocBLAS Tensile library for %s (ROCm %s)\n' "$arch" "$VER" \
        >"$LIB/rocblas/library/TensileLibrary_lazy_$arch.dat"
    printf 'stub kernels %s ROCm %s\n' "$arch" "$VER" \
        >"$LIB/rocblas/library/Kernels.so-000-$arch.hsaco"
    printf 'cotainr-lumi stub hipBLASLt library for %s (ROCm %s)\n' "$arch" "$VER" \
        >"$LIB/hipblaslt/library/TensileLibrary_lazy_$arch.dat"
done
printf 'stub extop library (ROCm %s)\n' "$VER" >"$LIB/hipblaslt/library/hipblasltExtOpLibrary.dat"

cat >"$PREFIX/include/hip/hip_version.h" <<EOF
// cotainr-lumi stub of ROCm $VER hip_version.h
#pragma once
#define HIP_VERSION_MAJOR $MAJ
#define HIP_VERSION_MINOR $MIN
#define HIP_VERSION_PATCH $PAT
#define HIP_VERSION ($MAJ * 10000000 + $MIN * 100000 + $PAT)
EOF

cat >"$PREFIX/bin/rocm-smi" <<EOF
#!/bin/sh
# cotainr-lumi stub of rocm-smi (ROCm $VER)
echo "========================= ROCm System Management Interface ========================="
echo "cotainr-lumi stub rocm-smi, ROCm $VER-$BUILD: no AMD GPUs visible"
echo "====================================================================================="
exit 0
EOF
cat >"$PREFIX/bin/hipconfig" <<EOF
#!/bin/sh
# cotainr-lumi stub of hipconfig (ROCm $VER)
case "\${1:-}" in
--version | -v) echo "$MAJ.$MIN.$VNUM-stub" ;;
--rocmpath | -R) echo "$PREFIX" ;;
*) echo "HIP version: $MAJ.$MIN.$VNUM-stub"; echo "ROCM_PATH: $PREFIX" ;;
esac
EOF
chmod 0755 "$PREFIX/bin/rocm-smi" "$PREFIX/bin/hipconfig"
echo "stub ROCm $VER for cotainr-lumi end-to-end tests; not AMD software" \
    >"$PREFIX/share/doc/rocm-stub/README"

# aws-ofi-rccl network plugin.
mkdir -p /opt/aws-ofi-rccl
cat >"$src_dir/rccl_net.c" <<EOF
/* cotainr-lumi e2e stub of the aws-ofi-rccl plugin (built for ROCm $VER) */
__attribute__((used)) static const char ident[] = "cotainr-lumi stub librccl-net ROCm $VER";
int rccl_net_marker(void) { return 110; }
const char *rccl_net_rocm_version(void) { return "$VER"; }
int rccl_net_rocm_version_number(void) { return $VNUM; }
struct stub_net_plugin { const char *name; int version; };
const struct stub_net_plugin ncclNetPlugin_v6 = { "AWS Libfabric (cotainr-lumi stub)", 6 };
EOF
gcc -O1 -shared -fPIC -o /opt/aws-ofi-rccl/librccl-net.so.0.0.0 "$src_dir/rccl_net.c" \
    -Wl,-soname,librccl-net.so.0
ln -sfn librccl-net.so.0.0.0 /opt/aws-ofi-rccl/librccl-net.so.0
ln -sfn librccl-net.so.0 /opt/aws-ofi-rccl/librccl-net.so

# cotainr's conda location, with a venv standing in for the conda env.
CONDA=/opt/cotainr/conda
mkdir -p "$CONDA/bin" "$CONDA/condabin" "$CONDA/etc/profile.d" "$CONDA/envs" "$CONDA/conda-meta"
install -m 0755 "$RECIPE/conda" "$CONDA/bin/conda"
ln -sfn ../bin/conda "$CONDA/condabin/conda"
install -m 0644 "$RECIPE/conda.sh" "$CONDA/etc/profile.d/conda.sh"
python3 -m venv "$CONDA/envs/conda_container_env"
"$CONDA/envs/conda_container_env/bin/python" -m pip --version >/dev/null

# Container environment.
mkdir -p /.singularity.d/env
cat >/.singularity.d/env/90-environment.sh <<EOF
#!/bin/sh
# LUMI-like ROCm environment (cotainr-lumi e2e base image)
export ROCM_PATH=/opt/rocm
export ROCM_RELEASE=$VER
export PATH="\$ROCM_PATH/bin:\$ROCM_PATH/llvm/bin:\$PATH"
# Like the LUMI base images: the host's Cray libraries first (/opt/cray is
# bound at run time, absent from the image), then ROCm, then the plugin.
export LD_LIBRARY_PATH="/opt/cray/libfabric/1.15.2.0/lib64:/opt/cray/pe/lib64:\$ROCM_PATH/lib:/opt/aws-ofi-rccl\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
printf '%s\n' "source $CONDA/etc/profile.d/conda.sh" "conda activate conda_container_env" \
    >/.singularity.d/env/92-cotainr-env.sh
chmod 0755 /.singularity.d/env/90-environment.sh /.singularity.d/env/92-cotainr-env.sh

# Slim down.
rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /root/.cache /tmp/* \
    /usr/share/doc/* /usr/share/man/* /usr/share/info/* 2>/dev/null || true
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
echo "setup-in-rootfs: ROCm $VER-$BUILD stub, venv and environment ready" >&2
