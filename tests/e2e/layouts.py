"""Test bases laid out like the LUMI PyTorch images (for the target env e2e).

Derived from the cached LUMI-like base (Debian 12, stub ROCm 6.1.3): cotainr's
pre-activated env is removed, and a fake Miniconda is laid out at conda's
paths (Python venvs, no conda download): ``/opt/miniconda3`` is "conda base"
(a decoy python), ``/opt/miniconda3/envs/pytorch`` the env, and
``/opt/miniconda3/bin/activate NAME`` activates it as conda's does
(``CONDA_PREFIX``, ``PATH``). ``/usr/bin/python3`` (Debian's) is the system
python decoy in every layout.

- ``LAYOUT1``: EasyBuild images up to 20240209: the env is activated only by
  ``WITH_CONDA="source /opt/miniconda3/bin/activate pytorch"`` (plus a second
  line, ``export LAYOUT1_CHAINED=yes``); conda base's
  python is on PATH.
- ``LAYOUT2``: 2025 refresh: conda pre-activated through ``CONDA_*``/``PATH``
  in the image's env file, ``WITH_CONDA=true``.
- ``LAYOUT3``: from 20240315: a venv ``/user-software/venv/pytorch`` with
  system-site-packages over the conda env (a ``.pth`` stands in for the
  inheritance, as the fake conda env is itself a venv), activated by the
  image's env file.
- ``LAYOUT5``: only the system python, nothing activated.
- ``LIBFABRIC_2025``: the network layer of AMD's 2025 PyTorch images
  (sfantao/LUMI-containers ``RecipesDocker/common/Dockerfile.libfabric``
  L19-77 and ``Dockerfile.aws-ofi-rccl`` L14-16, 5e0fe911): stub
  ``/opt/shs-libcxi/lib/libcxi.so.1`` and ``/opt/libfabric/lib/libfabric.so.1``
  first on ``LD_LIBRARY_PATH`` (before the base's ``/opt/cray`` entries, as
  there), the aws-ofi-rccl stub relinked against them.
"""

CONDA = "/opt/miniconda3"
ENV = f"{CONDA}/envs/pytorch"
VENV = "/user-software/venv/pytorch"
SITE = "lib/python3.11/site-packages"

_COMMON = r"""
set -euo pipefail
rm -f /.singularity.d/env/92-cotainr-env.sh
rm -rf /opt/cotainr
"""

_CONDA = rf"""
/usr/bin/python3 -m venv {CONDA}
/usr/bin/python3 -m venv {ENV}
cat >{CONDA}/bin/activate <<'EOF'
# fake conda activate (cotainr-lumi e2e): source {CONDA}/bin/activate [NAME]
_n="${{1:-base}}"
if [ "$_n" = base ]; then _p={CONDA}; else _p={CONDA}/envs/$_n; fi
if [ ! -d "$_p" ]; then echo "Could not find conda environment: $_n" >&2; unset _n _p; return 1; fi
export CONDA_PREFIX="$_p" CONDA_DEFAULT_ENV="$_n" CONDA_SHLVL=1
export PATH="$_p/bin:$PATH"
unset _n _p
EOF
mkdir -p {CONDA}/condabin
"""

_ENV_FILE = "/.singularity.d/env/90-environment.sh"

LAYOUT1 = (
    _COMMON
    + _CONDA
    + rf"""
cat >>{_ENV_FILE} <<'EOF'
# layout 1: conda base on PATH, the env only through $WITH_CONDA (two
# lines: the second must survive the chaining, not become arguments)
export PATH="{CONDA}/bin:$PATH"
export WITH_CONDA="source {CONDA}/bin/activate pytorch
export LAYOUT1_CHAINED=yes"
EOF
"""
)

_PREACTIVATED = rf"""
export CONDA_PREFIX={ENV}
export CONDA_DEFAULT_ENV=pytorch
export CONDA_SHLVL=1
export PATH="{ENV}/bin:{CONDA}/condabin:$PATH"
export WITH_CONDA=true
"""

LAYOUT2 = (
    _COMMON
    + _CONDA
    + f"""
cat >>{_ENV_FILE} <<'EOF'
# layout 2: conda pre-activated by the image's env, WITH_CONDA a no-op
{_PREACTIVATED}
EOF
"""
)

LAYOUT3 = (
    _COMMON
    + _CONDA
    + rf"""
/usr/bin/python3 -m venv --system-site-packages {VENV}
echo {ENV}/{SITE} >{VENV}/{SITE}/_conda_env_pytorch.pth
cat >>{_ENV_FILE} <<'EOF'
# layout 3: a venv over the conda env, activated by the image's env
{_PREACTIVATED}
export VIRTUAL_ENV={VENV}
export PATH="{VENV}/bin:$PATH"
EOF
"""
)

LAYOUT5 = _COMMON

LIBFABRIC_2025 = r"""
set -euo pipefail
W="$(mktemp -d)"
mkdir -p /opt/shs-libcxi/lib /opt/libfabric/lib
echo 'int cxi_marker(void) { return 1; }' >"$W/cxi.c"
gcc -O1 -shared -fPIC -o /opt/shs-libcxi/lib/libcxi.so.1 "$W/cxi.c" -Wl,-soname,libcxi.so.1
echo 'int fabric_marker(void) { return 1; }' >"$W/fabric.c"
gcc -O1 -shared -fPIC -o /opt/libfabric/lib/libfabric.so.1 "$W/fabric.c" \
    -Wl,-soname,libfabric.so.1 -Wl,--no-as-needed -L/opt/shs-libcxi/lib -l:libcxi.so.1
printf '%s\n' 'struct stub_net_plugin { const char *name; int version; };' \
    'const struct stub_net_plugin ncclNetPlugin_v6 = { "AWS Libfabric (2025 stub)", 6 };' \
    >"$W/net.c"
gcc -O1 -shared -fPIC -o /opt/aws-ofi-rccl/librccl-net.so.0.0.0 "$W/net.c" \
    -Wl,-soname,librccl-net.so.0 -Wl,--no-as-needed \
    -L/opt/libfabric/lib -l:libfabric.so.1 -L/opt/shs-libcxi/lib -l:libcxi.so.1
echo 'export LD_LIBRARY_PATH="/opt/libfabric/lib:/opt/shs-libcxi/lib:$LD_LIBRARY_PATH"' \
    >>/.singularity.d/env/90-environment.sh
rm -rf "$W"
"""
