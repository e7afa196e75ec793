#!/usr/bin/env bash
# Run end-to-end tests (real Apptainer) with cotainr-lumi on a cotainr that
# has the whole upstream series applied (docs/upstream/series/ on the release
# in BASE), i.e. through cotainr's own build hook instead of cotainr-lumi's
# shim. scripts/check-upstream-series.sh runs cotainr-lumi's unit tests on
# each prefix; this drives real builds through the hook: module files,
# labels, the stock command.
#
# Usage: scripts/e2e-on-series.sh [PYTEST-ARGS...]
#        (default: tests/e2e/test_lumi_env.py)
#
# The seam guard (issue 41: cotainr-lumi touches only the cotainr names
# docs/upstream/seam-api.md lists, during a real layered build; marker
# seam_guard, which the README's command deselects because it needs the
# series) runs in scripts/check-upstream-series.sh on the whole series, or:
#        scripts/e2e-on-series.sh -m seam_guard tests/e2e/test_seam_guard.py
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
series=$root/docs/upstream/series
version=$(sed -n 's/^base-release: *//p' "$series/BASE")
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/e2e/test_lumi_env.py)
work=$(mktemp -d "${TMPDIR:-/tmp}/cotainr-series-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT
quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

echo "== cotainr $version with the series, and cotainr-lumi's e2e tests: ${tests[*]}"
quiet_pip "$python" -m pip download --quiet --no-deps --no-binary :all: \
    -d "$work/dl" "cotainr==$version"
mkdir "$work/tree"
tar -xzf "$work"/dl/cotainr-*.tar.gz -C "$work/tree" --strip-components=1
for patch in "$series"/[0-9][0-9][0-9][0-9]-*.patch; do
    (cd "$work/tree" && git apply "$patch")
done
"$python" -m venv "$work/venv"
quiet_pip "$work/venv/bin/python" -m pip install --quiet "$work/tree"
quiet_pip "$work/venv/bin/python" -m pip install --quiet "${root}[test]" "$work/tree"
"$work/venv/bin/python" -c "from cotainr_lumi import _cotainr
assert _cotainr.NATIVE, 'the series gave cotainr no build hook'"
(cd "$root" && "$work/venv/bin/python" -m pytest -q -p no:cacheprovider \
    --basetemp="$work/pytest" "${tests[@]}")
