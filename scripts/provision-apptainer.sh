#!/usr/bin/env bash
# Provide a working `apptainer` + `singularity` for cotainr-lumi builds and tests.
#
# Prints exactly ONE line on stdout: a directory to prepend to PATH so that
# `apptainer` and `singularity` (the name cotainr calls) resolve. All logs go to
# stderr.
#
# 1. A native apptainer (>= 1.3.4) or singularity-ce (>= 3.9.2) already on PATH
#    (and not one of our own wrappers) is used as is. If it lacks one of the two
#    names, a shim directory with a symlink for the missing name is printed.
# 2. Otherwise (root only) a Debian-unstable root filesystem with Debian's
#    apptainer is provisioned ONCE under
#        ${COTAINR_LUMI_CACHE_DIR:-/var/cache/cotainr-lumi}/apptainer-sid/
#            root/   the debootstrapped sid root
#            bin/    `apptainer` and `singularity` wrapper scripts
#            .stamp  written last; marks a complete provisioning
#    The wrappers enter private mount + PID namespaces, bind the host
#    directories the call needs into the root at the same paths, pivot_root
#    into it and exec its /usr/bin/apptainer. A user other than root gets
#    them in a user namespace where it is root, and runs apptainer as itself
#    again (in a nested one), so Apptainer runs unprivileged, through user
#    namespaces.
#
# Environment:
#   COTAINR_LUMI_CACHE_DIR       cache base directory (default /var/cache/cotainr-lumi)
#   COTAINR_LUMI_FORCE_WRAPPER=1 ignore a native apptainer/singularity
#   COTAINR_LUMI_DEBIAN_MIRROR   Debian mirror for debootstrap (default: from
#                                /etc/apt/sources*, else http://deb.debian.org/debian)
#   COTAINR_LUMI_HOST_BINDS      (wrapper, at run time) extra colon-separated host
#                                directories to make visible inside the root
set -euo pipefail

# Bump when the provisioned root or its configuration changes (forces a redo).
readonly PROVISION_VERSION=3
readonly WRAPPER_MARKER="cotainr-lumi-apptainer-wrapper"
readonly MIN_APPTAINER=1.3.4
readonly MIN_SINGULARITY_CE=3.9.2

log() { printf 'provision-apptainer: %s\n' "$*" >&2; }
die() {
    printf 'provision-apptainer: ERROR: %s\n' "$*" >&2
    exit 1
}
# shellcheck source=scripts/lib/debootstrap.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/debootstrap.sh"

CACHE_BASE="${COTAINR_LUMI_CACHE_DIR:-/var/cache/cotainr-lumi}"
CACHE_DIR="${CACHE_BASE}/apptainer-sid"
ROOT_DIR="${CACHE_DIR}/root"
BIN_DIR="${CACHE_DIR}/bin"
STAMP="${CACHE_DIR}/.stamp"

version_ge() { # version_ge A B: true when A >= B
    [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

is_our_wrapper() {
    # No `| grep -q`: under pipefail an early grep exit can SIGPIPE the writer.
    local head
    head="$(head -c 4096 "$1" 2>/dev/null | tr -d '\0')" || return 1
    [[ "$head" == *"$WRAPPER_MARKER"* ]]
}

# ---------------------------------------------------------------------------
# 1. Native apptainer / singularity
# ---------------------------------------------------------------------------
find_native() {
    local name cand out ver
    for name in apptainer singularity; do
        while IFS= read -r cand; do
            [[ -n "$cand" ]] || continue
            cand="$(readlink -f "$cand")" || continue
            is_our_wrapper "$cand" && continue
            out="$("$cand" --version 2>/dev/null | head -n1)" || continue
            ver="$(grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' <<<"$out" | head -n1)" || continue
            case "$out" in
            apptainer*)
                version_ge "$ver" "$MIN_APPTAINER" || {
                    log "ignoring $cand ($out): need apptainer >= $MIN_APPTAINER"
                    continue
                }
                ;;
            singularity-ce*)
                version_ge "$ver" "$MIN_SINGULARITY_CE" || {
                    log "ignoring $cand ($out): need singularity-ce >= $MIN_SINGULARITY_CE"
                    continue
                }
                ;;
            *)
                log "ignoring $cand ($out): not apptainer/singularity-ce"
                continue
                ;;
            esac
            printf '%s\n' "$cand"
            return 0
        done < <(type -ap "$name" 2>/dev/null || true)
    done
    return 1
}

use_native() {
    local native="$1" dir shim
    dir="$(dirname "$native")"
    log "using native $("$native" --version 2>/dev/null | head -n1) at $native"
    if [[ -x "$dir/apptainer" && -x "$dir/singularity" ]] &&
        ! is_our_wrapper "$dir/apptainer" && ! is_our_wrapper "$dir/singularity"; then
        printf '%s\n' "$dir"
        return 0
    fi
    # One of the two names is missing next to the native binary: shim dir.
    if mkdir -p "$CACHE_BASE/native-bin" 2>/dev/null && [[ -w "$CACHE_BASE/native-bin" ]]; then
        shim="$CACHE_BASE/native-bin"
    else
        shim="${XDG_CACHE_HOME:-$HOME/.cache}/cotainr-lumi/native-bin"
        mkdir -p "$shim"
    fi
    ln -sfn "$native" "$shim/apptainer"
    ln -sfn "$native" "$shim/singularity"
    printf '%s\n' "$shim"
}

if [[ "${COTAINR_LUMI_FORCE_WRAPPER:-0}" != 1 ]]; then
    if native="$(find_native)"; then
        use_native "$native"
        exit 0
    fi
fi

# ---------------------------------------------------------------------------
# 2. Debian-unstable root + wrappers
# ---------------------------------------------------------------------------
[[ "$(id -u)" == 0 ]] ||
    die "no usable native apptainer (>= $MIN_APPTAINER) / singularity-ce (>= $MIN_SINGULARITY_CE) on PATH, and provisioning one needs root (uid is $(id -u))"
if ! command -v unshare >/dev/null || ! command -v pivot_root >/dev/null; then
    die "unshare/pivot_root (util-linux) not found"
fi
unshare --mount --propagation private --pid --fork true 2>/dev/null ||
    die "cannot create mount + PID namespaces (unshare --mount --pid --fork failed); is this a restricted container without CAP_SYS_ADMIN?"

mkdir -p "$CACHE_DIR"
exec 9>"${CACHE_BASE}/apptainer-sid.lock"
if ! flock -n 9; then
    log "waiting for another provisioning run (lock ${CACHE_BASE}/apptainer-sid.lock)"
    flock -w 1800 9 || die "timed out waiting for the provisioning lock"
fi

write_if_changed() { # write_if_changed FILE MODE  (content on stdin)
    local file="$1" mode="$2" tmp
    tmp="$(mktemp "${file}.XXXXXX")"
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f "$file" ]] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$file"
    fi
}

# The wrapper. ROOT is substituted at install time.
wrapper_source() {
    cat <<'WRAPPER_EOF' | sed "s|@ROOT@|${ROOT_DIR}|g"
#!/bin/bash
# cotainr-lumi-apptainer-wrapper: runs Debian-unstable's apptainer from a
# provisioned root (see scripts/provision-apptainer.sh in cotainr-lumi).
set -euo pipefail
ROOT='@ROOT@'
if [[ "${_COTAINR_LUMI_WRAPPER_STAGE:-}" != inner ]]; then
    [[ -x "$ROOT/usr/bin/apptainer" ]] || {
        echo "apptainer wrapper: $ROOT is not provisioned; run scripts/provision-apptainer.sh" >&2
        exit 127
    }
    userns=()
    if [[ "$(id -u)" != 0 ]]; then # root in a user namespace for the mounts
        userns=(--user --map-root-user)
        export _COTAINR_LUMI_WRAPPER_USER="$(id -u):$(id -g)"
    fi
    _COTAINR_LUMI_WRAPPER_STAGE=inner _COTAINR_LUMI_WRAPPER_CWD="$PWD" \
        exec unshare "${userns[@]}" --mount --propagation private --pid --fork \
        --kill-child /bin/bash "${BASH_SOURCE[0]}" "$@"
fi
unset _COTAINR_LUMI_WRAPPER_STAGE
PATH="$PATH:/usr/sbin:/sbin" # pivot_root, also on a user's PATH
cwd="${_COTAINR_LUMI_WRAPPER_CWD:-/}"
unset _COTAINR_LUMI_WRAPPER_CWD

# Collect host directories to make visible at the same path.
cands=(/tmp /var/tmp "${HOME:-}" "$cwd" /opt/wheels)
for v in TMPDIR APPTAINER_TMPDIR APPTAINER_CACHEDIR SINGULARITY_TMPDIR SINGULARITY_CACHEDIR; do
    cands+=("${!v:-}")
done
if [[ -n "${COTAINR_LUMI_HOST_BINDS:-}" ]]; then
    IFS=: read -r -a extra <<<"$COTAINR_LUMI_HOST_BINDS"
    cands+=("${extra[@]}")
fi
add_path_arg() { # absolute path (or one ending a bind spec) -> nearest existing dir
    local p="$1" r
    [[ "$p" == /* ]] || return 0
    while [[ "$p" != / && ! -e "$p" ]]; do p="${p%/*}"; p="${p:-/}"; done
    if [[ -d "$p" ]]; then cands+=("$p"); else cands+=("${p%/*}"); fi
    if [[ -L "$1" || "$p" != "$1" ]]; then
        r="$(readlink -f -- "$p" 2>/dev/null)" || return 0
        if [[ -d "$r" ]]; then cands+=("$r"); else cands+=("${r%/*}"); fi
    elif [[ -e "$p" ]]; then
        r="$(readlink -f -- "$p" 2>/dev/null)" || return 0
        [[ "$r" == "$p" ]] || { if [[ -d "$r" ]]; then cands+=("$r"); else cands+=("${r%/*}"); fi; }
    fi
}
for a in "$@"; do
    [[ "$a" == *=* ]] && a="${a#*=}"
    case "$a" in
    /*) ;;
    *) continue ;;
    esac
    IFS=':,' read -r -a parts <<<"$a"
    for p in "${parts[@]}"; do add_path_arg "$p"; done
done

is_system_dir() {
    case "$1" in
    / | /usr | /usr/* | /etc | /etc/* | /proc | /proc/* | /sys | /sys/* | /dev | /dev/* | \
        /bin | /bin/* | /sbin | /sbin/* | /lib | /lib/* | /lib32 | /lib32/* | /lib64 | /lib64/* | \
        /libx32 | /libx32/* | /run | /run/* | /boot | /boot/* | /var | /var/lib | /var/lib/* | \
        /var/run | /var/run/* | /var/lock | /var/lock/* | /var/cache | /var/spool | /var/log)
        return 0
        ;;
    esac
    return 1
}
# Normalise, drop system dirs, dirs inside ROOT, missing dirs; sort; drop nested.
norm=()
for d in "${cands[@]}"; do
    [[ -n "$d" && "$d" == /* && -d "$d" ]] || continue
    while [[ "$d" == *//* ]]; do d="${d//\/\//\/}"; done
    while [[ "$d" == */./* ]]; do d="${d//\/.\//\/}"; done
    [[ "$d" == */. ]] && d="${d%/.}"
    [[ "$d" == */.. || "$d" == */../* ]] && d="$(readlink -f -- "$d")"
    [[ "$d" != / ]] && d="${d%/}"
    is_system_dir "$d" && continue
    [[ "$d" == "$ROOT" || "$d" == "$ROOT"/* ]] && continue
    norm+=("$d")
done
binds=()
if ((${#norm[@]})); then
    prev=""
    while IFS= read -r d; do
        [[ -n "$prev" && ("$d" == "$prev" || "$d" == "$prev"/*) ]] && continue
        binds+=("$d")
        prev="$d"
    done < <(printf '%s\n' "${norm[@]}" | LC_ALL=C sort -u)
fi

safe_target() { # true when no component of ROOT/$1 is a symlink (mkdir -p would escape)
    local rel="${1#/}" cur="$ROOT" comp
    IFS=/ read -r -a comps <<<"$rel"
    for comp in "${comps[@]}"; do
        cur="$cur/$comp"
        [[ -L "$cur" ]] && return 1
        [[ -e "$cur" ]] || return 0
    done
    return 0
}

mount --make-rprivate / 2>/dev/null || true
mount --bind "$ROOT" "$ROOT"
for d in "${binds[@]}"; do
    if ! safe_target "$d"; then
        echo "apptainer wrapper: not binding $d (symlink inside the apptainer root)" >&2
        continue
    fi
    mkdir -p "$ROOT$d"
    mount --rbind "$d" "$ROOT$d"
done
for f in /etc/hosts /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt; do
    if [[ -f "$f" && -f "$ROOT$f" && ! -L "$ROOT$f" ]]; then
        mount --bind "$f" "$ROOT$f"
    fi
done
if [[ -n "${_COTAINR_LUMI_WRAPPER_USER:-}" ]]; then # apptainer looks the user up
    mount --bind /etc/passwd "$ROOT/etc/passwd"
    mount --bind /etc/group "$ROOT/etc/group"
fi
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
mkdir -p "$ROOT/.oldroot"
cd "$ROOT"
pivot_root . .oldroot
umount -l /.oldroot
cd "$cwd" 2>/dev/null || {
    echo "apptainer wrapper: warning: $cwd is not visible inside the apptainer root; running in /" >&2
    cd /
}
if [[ -n "${_COTAINR_LUMI_WRAPPER_USER:-}" ]]; then # the user again, unprivileged
    ids="$_COTAINR_LUMI_WRAPPER_USER"
    unset _COTAINR_LUMI_WRAPPER_USER
    exec unshare --user --map-user="${ids%:*}" --map-group="${ids#*:}" \
        /usr/bin/apptainer "$@"
fi
exec /usr/bin/apptainer "$@"
WRAPPER_EOF
}

install_wrappers() {
    mkdir -p "$BIN_DIR"
    wrapper_source | write_if_changed "$BIN_DIR/apptainer" 0755
    wrapper_source | write_if_changed "$BIN_DIR/singularity" 0755
}

# Capability names indexed by number (linux/capability.h).
CAP_NAMES=(CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL
    CAP_SETGID CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE
    CAP_NET_BROADCAST CAP_NET_ADMIN CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE
    CAP_SYS_RAWIO CAP_SYS_CHROOT CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT
    CAP_SYS_NICE CAP_SYS_RESOURCE CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE
    CAP_AUDIT_WRITE CAP_AUDIT_CONTROL CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG
    CAP_WAKE_ALARM CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE)

bounding_caps() { # comma-separated names of the capabilities in our bounding set
    local hex i names=()
    hex="$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)"
    for i in "${!CAP_NAMES[@]}"; do
        if (((16#$hex >> i) & 1)); then names+=("${CAP_NAMES[$i]}"); fi
    done
    local IFS=,
    printf '%s\n' "${names[*]}"
}

provision() {
    local mirror tmp_root conf caps t0
    t0=$SECONDS
    mirror="$(debian_mirror)"
    log "provisioning Debian-unstable apptainer root in $ROOT_DIR (mirror $mirror)"
    rm -f "$STAMP"
    remove_tree "$ROOT_DIR"
    remove_tree "$ROOT_DIR.partial"
    rm -rf "$BIN_DIR"

    ensure_debootstrap

    tmp_root="$ROOT_DIR.partial"
    mkdir -p "$tmp_root"
    log "debootstrap sid (this takes ~1 min)"
    if ! debootstrap --variant=minbase --include=apptainer,ca-certificates,mount \
        sid "$tmp_root" "$mirror" >"$CACHE_DIR/debootstrap.log" 2>&1; then
        tail -n 20 "$CACHE_DIR/debootstrap.log" >&2 || true
        remove_tree "$tmp_root"
        die "debootstrap of Debian unstable failed (full log: $CACHE_DIR/debootstrap.log)"
    fi
    [[ -x "$tmp_root/usr/bin/apptainer" ]] || die "debootstrap finished but $tmp_root/usr/bin/apptainer is missing"

    # Host files the wrapper bind-mounts over (they must exist as regular files).
    for f in /etc/hosts /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt; do
        if [[ -f "$f" ]]; then
            rm -f "$tmp_root$f"
            cat "$f" >"$tmp_root$f"
        fi
    done
    conf="$tmp_root/etc/apptainer/apptainer.conf"
    [[ -f "$conf" ]] || die "$conf missing"
    if grep -qE '^[[:space:]]*root default capabilities' "$conf"; then
        sed -i -E 's/^[[:space:]]*root default capabilities.*/root default capabilities = file/' "$conf"
    else
        echo 'root default capabilities = file' >>"$conf"
    fi
    apt_clean "$tmp_root"

    mv "$tmp_root" "$ROOT_DIR"
    install_wrappers

    caps="$(bounding_caps)"
    log "granting root the capabilities of the bounding set (file-based): $caps"
    if ! "$BIN_DIR/apptainer" capability add --user root "$caps" >"$CACHE_DIR/capability.log" 2>&1; then
        cat "$CACHE_DIR/capability.log" >&2
        die "apptainer capability add failed"
    fi
    "$BIN_DIR/apptainer" --version >/dev/null ||
        die "the provisioned apptainer does not run"
    echo "$PROVISION_VERSION" >"$STAMP"
    log "provisioned in $((SECONDS - t0)) s"
}

apt_clean() {
    rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* 2>/dev/null || true
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PROVISION_VERSION" && -x "$ROOT_DIR/usr/bin/apptainer" ]]; then
    install_wrappers
else
    [[ -e "$STAMP" || -e "$ROOT_DIR" || -e "$ROOT_DIR.partial" ]] && log "stale or partial provisioning found; redoing it"
    provision
fi

if ! version_out="$("$BIN_DIR/apptainer" --version 2>&1)"; then
    die "the provisioned apptainer wrapper fails: $version_out"
fi
log "ready: $version_out (wrappers in $BIN_DIR)"
printf '%s\n' "$BIN_DIR"
