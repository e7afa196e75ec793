#!/usr/bin/env bash
# Build (or reuse) the LUMI-like test base image for cotainr-lumi's e2e tests.
#
#   tests/e2e/base_image/build-base-image.sh [--rocm 6.1.3|6.0.3]
#
# Prints the path of the cached .sif on stdout (one line); logs go to stderr.
# The image is cached at
#   ${COTAINR_LUMI_CACHE_DIR:-/var/cache/cotainr-lumi}/base-images/
#       lumi-like-rocm-<ver>-<recipe hash>.sif
# where the recipe hash covers every file in this directory, so editing the
# recipe triggers a rebuild. The debootstrapped Debian 12 rootfs is cached
# separately as rootfs-bookworm-<package hash>.tar, so other ROCm variants
# only redo the ROCm/venv part and the `apptainer build`.
#
# Needs root (debootstrap, chroot). Gets apptainer from
# scripts/provision-apptainer.sh.
set -euo pipefail

log() { printf 'build-base-image: [%3ds] %s\n' "$SECONDS" "$*" >&2; }
die() {
    printf 'build-base-image: ERROR: %s\n' "$*" >&2
    exit 1
}

ROCM_VER=6.1.3
while (($#)); do
    case "$1" in
    --rocm)
        (($# >= 2)) || die "--rocm needs a version"
        ROCM_VER="$2"
        shift 2
        ;;
    --rocm=*)
        ROCM_VER="${1#--rocm=}"
        shift
        ;;
    -h | --help)
        sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
        exit 0
        ;;
    *) die "unknown argument: $1 (usage: build-base-image.sh [--rocm 6.1.3|6.0.3])" ;;
    esac
done
[[ "$ROCM_VER" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "invalid ROCm version '$ROCM_VER' (expected e.g. 6.1.3)"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
# shellcheck source=scripts/lib/debootstrap.sh
. "$REPO/scripts/lib/debootstrap.sh"
CACHE_BASE="${COTAINR_LUMI_CACHE_DIR:-/var/cache/cotainr-lumi}"
OUT_DIR="$CACHE_BASE/base-images"

SUITE=bookworm
PACKAGES=(python3 python3-venv python3-pip python3-dev g++ make binutils ca-certificates
    bash coreutils findutils procps)

recipe_hash() {
    local f
    (
        cd "$HERE"
        find . -type f ! -name '*~' ! -name '*.swp' ! -name '*.pyc' | LC_ALL=C sort |
            while IFS= read -r f; do
                printf '%s\n' "$f"
                sha256sum <"$f"
            done
    ) | sha256sum | cut -c1-12
}

HASH="$(recipe_hash)"
OUT="$OUT_DIR/lumi-like-rocm-$ROCM_VER-$HASH.sif"
if [[ -s "$OUT" ]]; then
    log "cached: $OUT"
    printf '%s\n' "$OUT"
    exit 0
fi

[[ "$(id -u)" == 0 ]] || die "building the base image needs root (debootstrap/chroot); uid is $(id -u)"
mkdir -p "$OUT_DIR"
exec 9>"$OUT_DIR/.build.lock"
if ! flock -n 9; then
    log "waiting for another base image build (lock $OUT_DIR/.build.lock)"
    flock -w 3600 9 || die "timed out waiting for the build lock"
fi
if [[ -s "$OUT" ]]; then # built by whoever held the lock
    printf '%s\n' "$OUT"
    exit 0
fi

t0=$SECONDS
APPTAINER_DIR="$("$REPO/scripts/provision-apptainer.sh")" || die "scripts/provision-apptainer.sh failed"
APPTAINER="$APPTAINER_DIR/apptainer"

WORK="$(mktemp -d "$OUT_DIR/work.XXXXXX")"
cleanup() { remove_tree "$WORK"; }
trap cleanup EXIT
# Work dirs of killed builds (no lock holder can be using them now).
for stale in "$OUT_DIR"/work.*; do
    [[ "$stale" == "$WORK" || ! -d "$stale" ]] || remove_tree "$stale"
done
rm -f "$OUT_DIR"/*.partial

# 1. Debian 12 rootfs, cached as a tarball keyed by suite + packages.
MIRROR="$(debian_mirror)"
ROOTFS_KEY="$(printf '%s\n' "$SUITE" "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
ROOTFS_TAR="$OUT_DIR/rootfs-$SUITE-$ROOTFS_KEY.tar"
ROOTFS="$WORK/rootfs"
if [[ ! -s "$ROOTFS_TAR" ]]; then
    ensure_debootstrap
    log "debootstrap $SUITE from $MIRROR (~1 min)"
    include="$(
        IFS=,
        echo "${PACKAGES[*]}"
    )"
    if ! debootstrap --variant=minbase --include="$include" "$SUITE" "$ROOTFS" "$MIRROR" \
        >"$WORK/debootstrap.log" 2>&1; then
        tail -n 20 "$WORK/debootstrap.log" >&2 || true
        cp "$WORK/debootstrap.log" "$OUT_DIR/debootstrap-failed.log" 2>/dev/null || true
        die "debootstrap of $SUITE failed (log: $OUT_DIR/debootstrap-failed.log)"
    fi
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
    tar -C "$ROOTFS" --numeric-owner -cf "$ROOTFS_TAR.partial" .
    mv "$ROOTFS_TAR.partial" "$ROOTFS_TAR"
    # Drop rootfs tarballs of older package lists.
    for old in "$OUT_DIR"/rootfs-"$SUITE"-*.tar; do
        [[ "$old" == "$ROOTFS_TAR" ]] || rm -f "$old"
    done
    log "rootfs cached as $ROOTFS_TAR ($((SECONDS - t0)) s)"
else
    log "using cached rootfs $ROOTFS_TAR"
    mkdir -p "$ROOTFS"
    tar -C "$ROOTFS" --numeric-owner -xf "$ROOTFS_TAR"
fi

# 2. ROCm stub, venv, environment (inside the rootfs, private mount namespace).
RECIPE_IN="/tmp/cotainr-lumi-recipe"
mkdir -p "$ROOTFS$RECIPE_IN"
cp -a "$HERE"/. "$ROOTFS$RECIPE_IN"/
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    rm -f "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
    cat /etc/ssl/certs/ca-certificates.crt >"$ROOTFS/etc/ssl/certs/ca-certificates.crt"
fi
log "installing ROCm $ROCM_VER stub, venv and environment"
# shellcheck disable=SC2016 # expanded by the inner bash
unshare --mount --propagation private --pid --fork /bin/bash -euc '
    mount --rbind /dev "$1/dev"
    mount -t proc proc "$1/proc"
    exec chroot "$1" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 /bin/bash "$2/setup-in-rootfs.sh" "$3" "$2"
' _ "$ROOTFS" "$RECIPE_IN" "$ROCM_VER" >&2 || die "setup-in-rootfs.sh failed"
rm -rf "$ROOTFS$RECIPE_IN"

# 3. SIF.
log "apptainer build $OUT"
# lz4: ~3x faster to build and to unpack than the default gzip; size is irrelevant here.
"$APPTAINER" build --force --mksquashfs-args "-comp lz4" "$OUT.partial" "$ROOTFS" >&2 ||
    die "apptainer build failed"
mv -f "$OUT.partial" "$OUT"
for old in "$OUT_DIR"/lumi-like-rocm-"$ROCM_VER"-*.sif; do
    [[ "$old" == "$OUT" ]] || rm -f "$old"
done
log "built $OUT in $((SECONDS - t0)) s"
printf '%s\n' "$OUT"
