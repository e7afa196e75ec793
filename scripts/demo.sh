#!/usr/bin/env bash
# Try cotainr-lumi locally: provision Apptainer and a LUMI-like base image,
# build an example lumi-g-ext-rocm-6.2 image with the stock `cotainr build`, verify it
# and print how to run it. Usage: scripts/demo.sh [OUT.sif]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$repo/build/demo/demo.sif}")
mkdir -p "$(dirname "$out")"
py=${PYTHON:-python3}

bin_dir=$("$repo/scripts/provision-apptainer.sh")
export PATH="$bin_dir:$PATH"
base=$("$repo/tests/e2e/base_image/build-base-image.sh")

# The demo system: lumi-g-ext-rocm-6.2 with the LUMI-like test base image.
profile=$(mktemp --suffix=.yaml)
trap 'rm -f "$profile"' EXIT
cat >"$profile" <<YAML
systems:
  lumi-demo:
    extends: lumi-g-ext-rocm-6.2
    description: lumi-g-ext-rocm-6.2 on the local LUMI-like test base image
    base-image: $base
    rocm-version: "6.1"
YAML
export COTAINR_LUMI_SYSTEMS="$profile"

cotainr=$(dirname "$(command -v "$py")")/cotainr
[ -x "$cotainr" ] || cotainr=$(command -v cotainr)
"$cotainr" build "$out" --system=lumi-demo --force --no-color \
    --pip-requirements "$repo/examples/demo/requirements.txt"
"$(dirname "$cotainr")/cotainr-lumi" verify "$out" || true

cat <<EOT

Built $out. Try it:
  export PATH="$bin_dir:\$PATH"
  apptainer inspect --labels $out
  apptainer exec $out python -c 'import tqdm, sys; print(sys.prefix, tqdm.__version__)'
  apptainer exec $out get-master 'nid[005252-005254,005256],nid007000'
On LUMI, build with --system=lumi-g-ext-rocm-6.2 and run with the module file written
next to the image (module use DIR; module load NAME).
EOT
