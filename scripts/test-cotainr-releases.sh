#!/usr/bin/env bash
# Run cotainr-lumi's unit tests against each supported cotainr release from
# the package index (a venv per release), i.e. the shim path (start-up hook +
# _cotainr/shim.py). The path through cotainr's own build hook is covered by
# scripts/check-upstream-series.sh.
#
# Usage: scripts/test-cotainr-releases.sh [VERSION[+BRANCH]...]
#        (default: 2025.3.0, the oldest release LUMI ships, 2025.7.1, and
#        2025.7.1+enhance_conda_env_installation: that release's sdist with
#        the vendored patch of cotainr's branch of that name applied, from
#        docs/upstream/cotainr-ci/branches/; --conda-env takes several files)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
releases=("$@")
[ ${#releases[@]} -gt 0 ] ||
    releases=(2025.3.0 2025.7.1 2025.7.1+enhance_conda_env_installation)
work=$(mktemp -d "${TMPDIR:-/tmp}/cotainr-releases.XXXXXX")
trap 'rm -rf "$work"' EXIT
quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

status=0
summary=()
for release in "${releases[@]}"; do
    echo "== cotainr $release"
    venv="$work/venv-$release"
    "$python" -m venv "$venv"
    version=${release%%+*}
    spec="cotainr==$version"
    if [ "$release" != "$version" ]; then # a release with a branch's patch
        quiet_pip "$venv/bin/python" -m pip download --quiet --no-deps \
            --no-binary :all: -d "$work/dl-$release" "$spec"
        mkdir "$work/tree-$release"
        tar -xzf "$work/dl-$release"/cotainr-*.tar.gz -C "$work/tree-$release" \
            --strip-components=1
        patch=$root/docs/upstream/cotainr-ci/branches/${release#*+}.patch
        (cd "$work/tree-$release" && git apply "$patch")
        spec=$work/tree-$release
    fi
    quiet_pip "$venv/bin/python" -m pip install --quiet "$spec"
    quiet_pip "$venv/bin/python" -m pip install --quiet "${root}[test]" "$spec"
    found=$("$venv/bin/python" -c "import cotainr; print(cotainr.__version__)")
    rc=0
    (cd "$root" && CI=true "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        -m "not e2e" tests >"$work/$release.log" 2>&1) || rc=$?
    line=$(tail -n 1 "$work/$release.log")
    summary+=("cotainr $found ($release): $line")
    if [ "$rc" != 0 ]; then
        grep -E "^(FAILED|ERROR)" "$work/$release.log" || tail -n 30 "$work/$release.log"
        status=1
    fi
done
printf '%s\n' "${summary[@]}"
exit "$status"
