# shellcheck shell=bash
# Helpers shared by scripts/provision-apptainer.sh and
# tests/e2e/base_image/build-base-image.sh (both debootstrap a root file
# system). Source it after defining `log` and `die`.

# The Debian mirror: COTAINR_LUMI_DEBIAN_MIRROR, else the host's apt
# sources, else deb.debian.org.
debian_mirror() {
    if [[ -n "${COTAINR_LUMI_DEBIAN_MIRROR:-}" ]]; then
        printf '%s\n' "$COTAINR_LUMI_DEBIAN_MIRROR"
        return
    fi
    local m
    m="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk 'tolower($1)=="uris:" { for (i = 2; i <= NF; i++) print $i }' |
        grep -E '^https?://[^ ]*/debian/?$' | head -n1 || true)"
    if [[ -z "$m" ]]; then
        m="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1=="deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; break } }' |
            grep -E '/debian/?$' | head -n1 || true)"
    fi
    printf '%s\n' "${m:-http://deb.debian.org/debian}"
}

# Unmount anything a crashed debootstrap left mounted below $1, then remove it.
remove_tree() {
    local dir="$1" mp
    [[ -e "$dir" ]] || return 0
    while IFS= read -r mp; do
        umount -l "$mp" 2>/dev/null || true
    done < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)
    rm -rf --one-file-system "$dir"
}

# Install debootstrap with apt-get when it is missing.
ensure_debootstrap() {
    command -v debootstrap >/dev/null && return 0
    command -v apt-get >/dev/null || die "debootstrap is missing and apt-get is unavailable"
    log "installing debootstrap with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >&2 ||
        die "apt-get install debootstrap failed"
}
