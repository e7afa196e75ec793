"""Fixture content for prune/verify e2e tests, created inside images.

Each script runs with the image's own tools (g++, ldconfig, the stub ROCm):

- ``LIBSTDCXX_SAFE``: a copy of the base image's own libstdc++ in the env's
  ``lib/`` and a C++ library there that needs it (safe to remove);
- ``LIBSTDCXX_NEWER``: a fabricated newer libstdc++ (GLIBCXX_3.4.99) and a
  library needing GLIBCXX_3.4.99 (must refuse);
- ``TORCH``: ``torch/lib`` in the env's site-packages with copies of the base
  image's ROCm libraries and ``rocblas/`` and a ``libtorch_hip.so`` needing
  them through ``$ORIGIN``, plus ``torch/version.py`` with ``hip = ...``.
"""

import shlex
import subprocess

PRELUDE = r"""
set -euo pipefail
trap 'echo "fixture script: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
PY="${PY:-python}"
P="$("$PY" -c 'import sys; print(sys.prefix)')"
SP="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
W="$(mktemp -d)"
"""

LIBSTDCXX_SAFE = r"""
# No early `exit` in awk: under pipefail, ldconfig would die of SIGPIPE.
SYS="$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ && !f {print $NF; f = 1}')"
REAL="$(readlink -f "$SYS")"
mkdir -p "$P/lib"
cp "$REAL" "$P/lib/$(basename "$REAL")"
ln -sfn "$(basename "$REAL")" "$P/lib/libstdc++.so.6"
ln -sfn libstdc++.so.6 "$P/lib/libstdc++.so"
cat >"$W/cxxdemo.cpp" <<'EOF'
#include <sstream>
#include <string>
extern "C" int cxxdemo_len(const char *s) {
    std::ostringstream out;
    out << std::string(s) << "!";
    return static_cast<int>(out.str().size());
}
EOF
g++ -shared -fPIC -o "$P/lib/libcxxdemo.so" "$W/cxxdemo.cpp" -L"$P/lib" -Wl,-rpath,'$ORIGIN'
"""

LIBSTDCXX_NEWER = r"""
mkdir -p "$P/lib"
cat >"$W/newstd.c" <<'EOF'
int glibcxx_new_feature(void) { return 99; }
EOF
printf 'GLIBCXX_3.4 { global: *; };\nGLIBCXX_3.4.99 { global: glibcxx_new_feature; } GLIBCXX_3.4;\n' >"$W/newstd.map"
gcc -shared -fPIC -o "$P/lib/libstdc++.so.6.0.99" "$W/newstd.c" -Wl,-soname,libstdc++.so.6 \
    -Wl,--version-script="$W/newstd.map"
ln -sfn libstdc++.so.6.0.99 "$P/lib/libstdc++.so.6"
cat >"$W/user.c" <<'EOF'
extern int glibcxx_new_feature(void);
int needs_new_libstdcxx(void) { return glibcxx_new_feature(); }
EOF
mkdir -p "$SP/newcxx"
gcc -shared -fPIC -o "$SP/newcxx/_ext.so" "$W/user.c" -L"$P/lib" -l:libstdc++.so.6.0.99 -Wl,-rpath,'$ORIGIN/../../..'
"""

TORCH = r"""
T="$SP/torch"
R=/opt/rocm/lib
mkdir -p "$T/lib"
for n in libamdhip64.so.6 libhsa-runtime64.so.1 libamd_comgr.so.2 librccl.so.1 librocm_smi64.so.7 \
         librocblas.so.4 libroctx64.so.4; do
    cp -L "$R/$n" "$T/lib/$n"
done
cp -rL "$R/rocblas" "$T/lib/rocblas"
cat >"$W/th.c" <<'EOF'
extern int amdhip64_marker(void);
extern int rccl_marker(void);
int torch_hip_probe(void) { return amdhip64_marker() * 1000 + rccl_marker(); }
EOF
gcc -shared -fPIC -o "$T/lib/libtorch_hip.so" "$W/th.c" -Wl,-soname,libtorch_hip.so \
    -L"$T/lib" -l:libamdhip64.so.6 -l:librccl.so.1 -Wl,-rpath,'$ORIGIN',--enable-new-dtags
printf 'from typing import Optional\n__version__ = "2.4.1+fixture"\nhip: Optional[str] = "%s"\n' "$HIP" >"$T/version.py"
: >"$T/__init__.py"
"""

SCRIPTS = {
    "libstdcxx-safe": LIBSTDCXX_SAFE,
    "libstdcxx-newer": LIBSTDCXX_NEWER,
    "torch": TORCH,
}


def fixture_script(*cases, hip="6.1.40093-fixture", python="python"):
    """One bash script creating the fixture content of `cases` in `python`'s env."""
    return (
        f"HIP={shlex.quote(hip)}\nPY={shlex.quote(python)}\n"
        + PRELUDE
        + "".join(SCRIPTS[c] for c in cases)
    )


def derive_base_image(
    *,
    apptainer,
    base_image,
    work,
    cases,
    hip="6.1.40093-fixture",
    setup="",
    python="python",
):
    """Build `work`/derived-base.sif: `base_image`, a `setup` script, then the
    fixture content in the env of `python`."""
    sandbox = work / "sandbox"
    # cwd=work (under /tmp, bound by default): a writable sandbox has no
    # mount point for an arbitrary caller's directory.
    run = dict(
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=900,
        cwd=work,
    )
    proc = subprocess.run(
        [apptainer, "build", "--sandbox", str(sandbox), str(base_image)], **run
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    script = setup + "\n" + fixture_script(*cases, hip=hip, python=python)
    proc = subprocess.run(
        [
            apptainer,
            "exec",
            "--writable",
            "--no-home",
            str(sandbox),
            "bash",
            "-c",
            script,
        ],
        **run,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    image = work / "derived-base.sif"
    proc = subprocess.run(
        [apptainer, "build", "--force", str(image), str(sandbox)], **run
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    subprocess.run(["rm", "-rf", str(sandbox)], check=False)
    return image
