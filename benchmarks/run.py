"""All cotainr-lumi benchmarks in one command, side by side with baselines.

Sections (each a ratio measured in one run, on the same inputs):

1. stage overhead: ``cotainr build --system=<lumi-g-ext on the test base>``
   with no pip steps vs stock ``cotainr build --base-image`` (hook disabled)
   of the same base image; alternating runs, medians, ratio (target <= 1.05),
   and the time each stage took;
2. pruning scan: ``benchmarks/prune_scan.py`` (ours vs
   ``find | xargs readelf -V`` on a generated torch-ROCm-sized tree);
3. bytes saved on the ROCm-layout fixture: bytes de-duplicated vs bytes of
   the torch/lib entries that duplicate the base's ROCm (target 100%), and
   the .sif size with and without pruning (``--rocm-torch-base`` reuses a
   fixture image derived before, as the e2e tests' ``rocm_torch_base_image``);
4. cached rebuild: pip stage time of a first build (empty host cache) vs a
   second build (same requirements, warm cache) of a generated C-extension
   sdist served by a local index on 127.0.0.1 (its build dependency,
   setuptools, comes from PyPI) (target >= 3x);
5. stage overhead on a torch-sized env: a base laid out like the LUMI
   EasyBuild PyTorch images up to 20240209 (the env at
   ``/opt/miniconda3/envs/pytorch``, activated only by ``$WITH_CONDA``;
   ``tests/e2e/layouts.py``) whose env holds the real torch 2.13.0 wheel and a
   removable ``libstdc++``: stock ``cotainr build --base-image`` vs
   ``--system=<lumi-g-ext on it>`` (no pip steps), so the target env
   discovery and the pruning scans run on a real torch tree (target <= 1.05).
   Not in ``--quick`` (a 1 GB base image; several minutes per run).
6. layered stacked builds (issue 30): on a small base (the test base) and a
   ``--big-gb`` base (the test base plus that much random data in 10 MB
   files; 0: none), a first build with one pip step (whole, ``--flatten``),
   then on that image one more tiny package as a layer in a copy of the base
   (the default), as the layer alone (``--layer-only``) and squashed whole
   (``--flatten``); medians of ``--layer-runs`` (each alternating run on the
   same first image, so the base's sha256 is computed once and remembered:
   its cost is a row of its own), gzip as Apptainer's default, the ratio to
   the whole build (issue 30's target: <= 0.1x on ~3 GB, and the layered
   build growing <= 1.3x from the small base).
7. full builds at disk speed (issue 40): on a base holding ``--full-copies``
   copies of the real torch CPU wheel and its dependencies (pip from PyPI; each
   copy but the first with a line appended to every file, so that no file is
   stored once for all), in alternating runs: stock ``cotainr build
   --base-image`` (Apptainer: its copy of the sandbox, gzip) and
   ``--system --flatten`` with each of ``--compressors`` (``--full-runs``
   rounds, or the builds of ``--full-order``, e.g. ``stock,zstd:3,stock``);
   each build's time, SIF size and load average, then ``--import-runs``
   alternating rounds of the first ``import torch`` from each kind's last
   image (page cache dropped each time), then the medians
   (targets: the default <= 0.25x stock's time, its SIF <= 1.1x stock's gzip
   SIF, its import no slower). ``--full-base`` reuses a base made before.

8. uv vs pip (issue 42): the same pip step (the torch CPU wheel of
   ``/opt/wheels`` plus numpy, pyyaml and tqdm from PyPI, torch's
   dependencies from PyPI) on the test base as a layer (``--layer-only``),
   with ``pip.installer=pip`` and ``=uv``, each with an empty host cache
   (cold) and again with that cache (warm); medians of ``--uv-runs`` of the
   pip stage's time, the machine's load (``uptime``) before and after
   (target: uv <= 0.3x pip, cold and warm). ``--uv-compile no`` gives the
   step ``pip-args: [--no-compile]`` for both installers (no ``.pyc`` files,
   which the stage writes by default), ``both`` measures both ways. Not in
   ``--quick``.

Needs what the end-to-end tests need (root on Debian 12, or a native
Apptainer). ``--quick`` runs each section once on small inputs (used in CI
so this script cannot rot; no thresholds are asserted anywhere).

Sections 1 and 5 build whole images (``--flatten``), as stock cotainr does.

Usage: python benchmarks/run.py [--quick] [--runs N] [--sections 1,2,3,4,5,6,7,8]
"""

import argparse
import json
import os
from pathlib import Path
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

from cotainr_lumi.engine.digest import sha256_of_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "tests"))

import layouts  # noqa: E402
from pkgfixtures import make_sdist, make_wheel, serve_index  # noqa: E402
from prune_fixtures import derive_base_image  # noqa: E402

BIN = Path(sys.executable).parent
STAGE_RE = re.compile(r"Finished stage (\S+) in ([0-9.]+) s")


def sh(cmd, **kwargs):
    """Run a command, fail loudly with its output."""
    proc = subprocess.run(
        cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"command failed: {cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def setup():
    """Apptainer on PATH and the LUMI-like base image."""
    bin_dir = sh(["bash", str(REPO / "scripts/provision-apptainer.sh")]).stdout.strip()
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    os.environ.setdefault("APPTAINER_MKSQUASHFS_ARGS", "-comp lz4")
    base = sh(
        ["bash", str(REPO / "tests/e2e/base_image/build-base-image.sh")]
    ).stdout.strip()
    return Path(bin_dir), Path(base)


def profile(work, name, base, **extra):
    """A profile file with one system derived from lumi-g-ext."""
    path = work / f"{name}.yaml"
    system = {
        "extends": "lumi-g-ext",
        "base-image": str(base),
        "rocm-version": "6.1",
        **extra,
    }
    path.write_text(yaml.safe_dump({"systems": {name: system}}))
    return path


def build(image, args, *, env=None, cwd=None):
    """Time one cotainr build; return (seconds, stage times, output)."""
    image.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = sh(
        [str(BIN / "cotainr"), "build", str(image), *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    return seconds, {m[0]: float(m[1]) for m in STAGE_RE.findall(out)}, out


def section_overhead(work, base, runs):
    """1. lumi-g-ext (no pip steps) vs stock cotainr on the same base image."""
    prof = profile(work, "bench-lumi", base)
    ours, stock, stages = [], [], {}
    for _ in range(runs):
        t, st, _ = build(
            work / "ours.sif",
            ["--system=bench-lumi", "--flatten"],
            env={"COTAINR_LUMI_SYSTEMS": str(prof)},
        )
        ours.append(t)
        for k, v in st.items():
            stages.setdefault(k, []).append(v)
        t, _, _ = build(
            work / "stock.sif",
            [f"--base-image={base}"],
            env={"COTAINR_LUMI_DISABLE": "1"},
        )
        stock.append(t)
    mo, ms = statistics.median(ours), statistics.median(stock)
    rows = [
        ("stock cotainr --base-image", f"{ms:.1f} s", "1.00x"),
        (
            "cotainr --system=lumi-g-ext (test base)",
            f"{mo:.1f} s",
            f"{mo / ms:.2f}x  (target <= 1.05x)",
        ),
    ]
    for name, values in stages.items():
        rows.append(
            (f"  of which stage {name}", f"{statistics.median(values):.1f} s", "")
        )
    return rows


def section_scan(quick):
    """2. Pruning scan vs find | xargs readelf -V."""
    args = (
        ["--repeat", "1", "--files", "4000", "--elf", "50", "--gb", "0.5"]
        + ["--functions-scale", "0.01"]
        if quick
        else []
    )
    out = sh([sys.executable, str(REPO / "benchmarks/prune_scan.py"), *args]).stdout
    return [("", line, "") for line in out.strip().splitlines()]


def _torch_lib_duplicate_bytes(image):
    """Bytes of torch/lib entries whose names exist in the image's ROCm lib dirs."""
    script = (
        "import os, importlib.util\n"
        "t = os.path.join(list(importlib.util.find_spec('torch').submodule_search_locations)[0], 'lib')\n"
        "rocm = set(os.listdir(os.path.join(os.environ.get('ROCM_PATH', '/opt/rocm'), 'lib')))\n"
        "total = 0\n"
        "for n in os.listdir(t):\n"
        "    p = os.path.join(t, n)\n"
        "    if n not in rocm or os.path.islink(p): continue\n"
        "    if os.path.isdir(p):\n"
        "        total += sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(p) for f in fs)\n"
        "    else: total += os.lstat(p).st_size\n"
        "print(total)\n"
    )
    proc = sh(["apptainer", "exec", "--no-home", str(image), "python", "-c", script])
    return int(proc.stdout.strip().splitlines()[-1])


def section_bytes(work, base, given=None):
    """3. Bytes de-duplicated on the ROCm-layout fixture; .sif sizes."""
    if given:
        fixture = Path(given)
    else:
        fixture = derive_base_image(
            apptainer="apptainer",
            base_image=base,
            work=work,
            cases=("libstdcxx-safe", "torch"),
        )
    prof = profile(
        work,
        "bench-bytes",
        fixture,
        settings={"provenance": {"hash-base-image": False}},
    )
    env = {"COTAINR_LUMI_SYSTEMS": str(prof)}
    build(work / "pruned.sif", ["--system=bench-bytes"], env=env)
    build(
        work / "unpruned.sif", ["--system=bench-bytes", "--skip-stage=prune"], env=env
    )
    dup = _torch_lib_duplicate_bytes(work / "unpruned.sif")
    manifest = json.loads(
        sh(
            [
                "apptainer",
                "exec",
                "--no-home",
                str(work / "pruned.sif"),
                "cat",
                "/opt/cotainr-lumi/prune-manifest.json",
            ]
        ).stdout
    )
    rocm_saved = sum(
        e.get("bytes", e.get("size", 0))
        for e in manifest["entries"]
        if e.get("group") == "rocm-dedup"
    )
    left = _torch_lib_duplicate_bytes(work / "pruned.sif")
    sp, su = (
        (work / "pruned.sif").stat().st_size,
        (work / "unpruned.sif").stat().st_size,
    )
    return [
        ("torch/lib bytes duplicating the base's ROCm", f"{dup} B", ""),
        (
            "de-duplicated by the prune stage (manifest)",
            f"{rocm_saved} B",
            f"{100 * rocm_saved / dup:.0f}%  (target 100%)" if dup else "n/a",
        ),
        ("duplicate bytes left after pruning", f"{left} B", ""),
        (
            "total bytes saved (manifest, incl. libstdc++)",
            f"{manifest['bytes-saved']} B",
            "",
        ),
        (".sif without pruning", f"{su} B", "1.00x"),
        (".sif with pruning", f"{sp} B", f"{sp / su:.3f}x"),
    ]


def _cext_sdist(directory, *, functions):
    """An sdist whose C extension takes a while to compile (no such name on PyPI)."""
    name, version = "cotainr_lumi_bench_cext", "1.0"
    body = "\n".join(
        f"static double f{i}(double x) {{ double s = 0; for (int k = 0; k < {i % 17 + 3}; k++) "
        f"s += x * k / (k + {i % 7 + 1}.0); return s; }}"
        for i in range(functions)
    )
    calls = " + ".join(f"f{i}(x)" for i in range(functions))
    source = (
        "#include <Python.h>\n" + body + "\n"
        "static PyObject *total(PyObject *self, PyObject *arg) { double x = PyFloat_AsDouble(arg); "
        f"return PyFloat_FromDouble({calls}); }}\n"
        'static PyMethodDef methods[] = {{"total", total, METH_O, ""}, {NULL, NULL, 0, NULL}};\n'
        'static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_cext", "", -1, methods};\n'
        "PyMODINIT_FUNC PyInit__cext(void) { return PyModule_Create(&mod); }\n"
    )
    setup_py = (
        "from setuptools import Extension, setup\n"
        f'setup(ext_modules=[Extension("{name}._cext", ["cext.c"], extra_compile_args=["-O2"])])\n'
    )
    sdist = make_sdist(
        directory, name, version, extra_files={"setup.py": setup_py, "cext.c": source}
    )
    return name, version, sdist


def section_cache(work, base, functions):
    """4. pip stage: first build (empty cache) vs second build (warm cache)."""
    name, version, sdist = _cext_sdist(work, functions=functions)
    prof = profile(
        work, "bench-cache", base, settings={"provenance": {"hash-base-image": False}}
    )
    times = []
    with serve_index(work / "index", [sdist]) as (url, _requests):
        steps = work / "steps.yml"
        step = {"packages": [f"{name}=={version}"], "extra-index-urls": [url]}
        steps.write_text(
            yaml.safe_dump({"steps": [step], "cache-dir": str(work / "pip-cache")})
        )
        for n in (1, 2):
            _, stages, _ = build(
                work / f"cache{n}.sif",
                ["--system=bench-cache", f"--pip-steps={steps}"],
                env={"COTAINR_LUMI_SYSTEMS": str(prof)},
            )
            times.append(stages["pip"])
    return [
        (
            f"pip stage, first build (C extension sdist, {functions} functions)",
            f"{times[0]:.1f} s",
            "1.00x",
        ),
        (
            "pip stage, second build (warm host cache)",
            f"{times[1]:.1f} s",
            f"{times[0] / times[1]:.1f}x faster  (target >= 3x)",
        ),
    ]


#: The torch wheel this machine has (CPU build; torch's deps come from PyPI).
TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")


def section_torch_env(work, base, runs):
    """5. Stage overhead on a layout-1 base whose env holds the real torch."""
    if not TORCH_WHEEL.is_file():
        return [(f"skipped: {TORCH_WHEEL} is not on this machine", "", "")]
    shutil.copy(TORCH_WHEEL, work / TORCH_WHEEL.name)
    install = (
        f"{layouts.ENV}/bin/python -m pip install -q --no-cache-dir "
        f"{work / TORCH_WHEEL.name}\n"
    )
    t0 = time.perf_counter()
    torch_base = derive_base_image(
        apptainer="apptainer",
        base_image=base,
        work=work,
        cases=("libstdcxx-safe",),
        setup=layouts.LAYOUT1 + install,
        python=f"{layouts.ENV}/bin/python",
    )
    derive = time.perf_counter() - t0
    (work / TORCH_WHEEL.name).unlink()
    prof = profile(
        work,
        "bench-torch",
        torch_base,
        settings={"provenance": {"hash-base-image": False}},
    )
    ours, stock, stages, target = [], [], {}, ""
    for _ in range(runs):
        t, st, out = build(
            work / "ours.sif",
            ["--system=bench-torch", "--flatten"],
            env={"COTAINR_LUMI_SYSTEMS": str(prof)},
        )
        ours.append(t)
        for k, v in st.items():
            stages.setdefault(k, []).append(v)
        m = re.search(r"Target Python environment: (\S+)", out)
        target = m.group(1) if m else "?"
        t, _, _ = build(
            work / "stock.sif",
            [f"--base-image={torch_base}"],
            env={"COTAINR_LUMI_DISABLE": "1"},
        )
        stock.append(t)
    mo, ms = statistics.median(ours), statistics.median(stock)
    size = torch_base.stat().st_size
    rows = [
        (
            f"layout-1 base with torch 2.13.0 ({size / 1e9:.2f} GB .sif)",
            f"{derive:.1f} s",
            "to derive",
        ),
        ("stock cotainr --base-image", f"{ms:.1f} s", "1.00x"),
        (
            "cotainr --system=lumi-g-ext (layout-1 torch base)",
            f"{mo:.1f} s",
            f"{mo / ms:.2f}x  (target <= 1.05x)",
        ),
        (f"  target env found: {target}", "", "-"),
    ]
    for name, values in stages.items():
        rows.append(
            (f"  of which stage {name}", f"{statistics.median(values):.1f} s", "")
        )
    return rows


def _load():
    return sh(["uptime"]).stdout.split("load average:")[-1].strip()


def section_uv(work, base, runs, compile_modes=("yes",)):
    """8. The pip stage with pip and with uv, cold and warm host cache."""
    if not TORCH_WHEEL.is_file():
        return [(f"skipped: {TORCH_WHEEL} is not on this machine", "", "")]
    prof = profile(
        work, "bench-uv", base, settings={"provenance": {"hash-base-image": False}}
    )
    (work / "req.txt").write_text(f"{TORCH_WHEEL}\nnumpy\npyyaml\ntqdm\n")
    load = [_load()]
    times = {}
    for run in range(runs):
        for compiled in compile_modes:
            for installer in ("pip", "uv"):
                step = {"requirements": "req.txt"}
                if compiled == "no":
                    step["pip-args"] = ["--no-compile"]
                cache = work / f"{compiled}-{run}"
                steps = {"installer": installer, "steps": [step]}
                steps["cache-dir"] = str(cache / "pip")
                steps["uv-cache-dir"] = str(cache / "uv")
                (work / "steps.yml").write_text(yaml.safe_dump(steps))
                for state in ("cold", "warm"):
                    _, stages, _ = build(
                        work / "uv.sqfs",
                        ["--system=bench-uv", "--pip-steps=steps.yml", "--layer-only"],
                        env={"COTAINR_LUMI_SYSTEMS": str(prof)},
                        cwd=work,
                    )
                    key = (compiled, installer, state)
                    times.setdefault(key, []).append(stages["pip"])
    load.append(_load())
    rows = []
    for compiled in compile_modes:
        pyc = {"yes": ".pyc written", "no": "no .pyc (--no-compile)"}[compiled]
        for state in ("cold", "warm"):
            pip = statistics.median(times[(compiled, "pip", state)])
            uv = statistics.median(times[(compiled, "uv", state)])
            label = f"{state} cache, {pyc}"
            rows.append((f"pip stage with pip, {label}", f"{pip:.1f} s", "1.00x"))
            ratio = f"{uv / pip:.2f}x  (target <= 0.3x)"
            rows.append((f"pip stage with uv, {label}", f"{uv:.1f} s", ratio))
    rows.append((f"load before / after: {load[0]} / {load[1]}", "", ""))
    return rows


def section_layered(work, base, runs, big_gb):
    """6. First build, stacked layered build, stacked whole build; small and big base."""
    bases = [("small", base)]
    if big_gb:
        (work / "big").mkdir()
        files = int(big_gb * 1024 / 10)
        big = derive_base_image(
            apptainer="apptainer",
            base_image=base,
            work=work / "big",
            cases=(),
            setup=f"mkdir -p /opt/big && for i in $(seq {files}); do "
            "head -c 10M /dev/urandom > /opt/big/f$i; done",
        )
        bases.append(("big", big))
    for name in ("first", "added"):
        make_wheel(work, name, "1.0")
        (work / f"{name}.txt").write_text(f"./{name}-1.0-py3-none-any.whl\n")
    env = {"APPTAINER_MKSQUASHFS_ARGS": "-comp gzip"}  # Apptainer's default
    env["XDG_CACHE_HOME"] = str(work / "cache")
    rows, layered = [], {}
    kinds = {
        "layer": ("layer.sif", []),
        "only": ("only.sqfs", ["--layer-only"]),
        "whole": ("whole.sif", ["--flatten"]),
    }
    for label, image in bases:
        env["COTAINR_LUMI_SYSTEMS"] = str(profile(work, "bench-layer", image))
        first_args = [
            "--system=bench-layer",
            "--flatten",
            "--pip-requirements=first.txt",
        ]
        firsts = [build(work / "first.sif", first_args, env=env, cwd=work)[0]]
        for _ in range(runs - 1):
            firsts.append(build(work / "first.sif", first_args, env=env, cwd=work)[0])
        t0 = time.perf_counter()
        sha256_of_file(path=work / "first.sif")
        hashing = time.perf_counter() - t0
        lumi = ["--lumi-system=bench-layer", f"--base-image={work / 'first.sif'}"]
        times = {kind: [] for kind in kinds}
        for _ in range(runs):
            for kind, (image_name, args) in kinds.items():
                t, _, _ = build(
                    work / image_name,
                    [*lumi, *args, "--pip-requirements=added.txt"],
                    env=env,
                    cwd=work,
                )
                times[kind].append(t)
        layer, only, whole = (statistics.median(times[k]) for k in kinds)
        layered[label] = (layer, only)
        size = (work / "first.sif").stat().st_size / 1e9
        grown = (work / "layer.sif").stat().st_size - (
            work / "first.sif"
        ).stat().st_size
        target = "(target <= 0.1x on ~3 GB)"
        rows += [
            (
                f"{label}: first build ({size:.2f} GB .sif)",
                f"{statistics.median(firsts):.1f} s",
                "",
            ),
            ("  stacked, squashed whole (--flatten)", f"{whole:.1f} s", "1.00x"),
            (
                f"  stacked, a copy of the base + layer (+{grown / 1024:.0f} KiB)",
                f"{layer:.1f} s",
                f"{layer / whole:.3f}x {target}",
            ),
            (
                f"  stacked, the layer alone ({(work / 'only.sqfs').stat().st_size / 1024:.0f} KiB)",
                f"{only:.1f} s",
                f"{only / whole:.3f}x {target}",
            ),
            (
                "  sha256 of the base (once per base file, remembered)",
                f"{hashing:.1f} s",
                "",
            ),
        ]
    if "big" in layered:
        for i, kind in enumerate(("a copy of the base + layer", "the layer alone")):
            growth = layered["big"][i] / layered["small"][i]
            rows.append((f"{kind}: big / small base", "", f"{growth:.2f}x (<= 1.3x)"))
    return rows


#: What section 7 imports from the image (the first copy is the one untouched).
IMPORT_TORCH = "import sys; sys.path.insert(0, '/opt/torchlike/0'); import torch"
#: Section 7's copies of the torch tree: all but the first changed in every file.
TORCH_COPIES = r"""set -e
python3 -m pip install -q --no-cache-dir --target /opt/torchlike/0 {wheel}
python3 - <<'EOF'
import os, shutil
for k in range(1, {copies}):
    shutil.copytree("/opt/torchlike/0", f"/opt/torchlike/{{k}}", symlinks=True)
    for d, _, files in os.walk(f"/opt/torchlike/{{k}}"):
        for name in files:
            if not os.path.islink(os.path.join(d, name)):
                with open(os.path.join(d, name), "ab") as f:
                    f.write(f"\n# benchmark copy {{k}}\n".encode())
EOF
du -sb /opt/torchlike | cut -f1 > /opt/torchlike.bytes
"""


def _load():
    return Path("/proc/loadavg").read_text().split()[0]


def _first_import(image):
    """Seconds to the first ``import torch`` from `image`, page cache dropped."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    t0 = time.perf_counter()
    sh(["apptainer", "exec", "--no-home", str(image), "python3", "-c", IMPORT_TORCH])
    return time.perf_counter() - t0


def _full_builds(work, big, compressors):
    """Section 7's builds: {name: (cotainr build arguments, environment)}."""
    env = {k: v for k, v in os.environ.items() if "MKSQUASHFS" not in k}
    prof = profile(work, "bench-full", big)
    kinds = {
        "stock": (["--base-image", str(big)], {**env, "COTAINR_LUMI_DISABLE": "1"})
    }
    for name in compressors:
        args = ["--system=bench-full", "--flatten", f"--set=build.compression={name}"]
        kinds[name] = (args, {**env, "COTAINR_LUMI_SYSTEMS": str(prof)})
    return kinds


def _torch_base(work, base, copies, given):
    """Section 7's base (`given`, else derived) and the bytes of its torch tree."""
    big = Path(given) if given else None
    if big is None:
        wheel = shutil.copy(TORCH_WHEEL, work)  # /tmp: bound in the container
        setup = TORCH_COPIES.format(wheel=wheel, copies=copies)
        big = derive_base_image(
            apptainer="apptainer", base_image=base, work=work, cases=(), setup=setup
        )
    tree = sh(["apptainer", "exec", str(big), "cat", "/opt/torchlike.bytes"])
    return big, int(tree.stdout)


def section_full(work, base, order, copies, given=None, import_runs=3):
    """7. Full builds in `order` ("stock" or a compression): time, size, first import."""
    if not TORCH_WHEEL.is_file():
        return [(f"skipped: {TORCH_WHEEL} is not on this machine", "", "")]
    big, tree = _torch_base(work, base, copies, given)
    print(f"torch-like tree {tree / 1e9:.2f} GB in {big}", flush=True)
    kinds = _full_builds(work, big, [k for k in dict.fromkeys(order) if k != "stock"])
    times, imports, sizes, images = {}, {}, {}, {}
    for kind in order:
        args, env = kinds[kind]
        load = _load()
        image = images[kind] = work / f"full-{kind.replace(':', '-')}.sif"
        image.unlink(missing_ok=True)
        t0 = time.perf_counter()
        sh([str(BIN / "cotainr"), "build", str(image), *args], env=env)
        times.setdefault(kind, []).append(time.perf_counter() - t0)
        sizes[kind] = image.stat().st_size
        print(
            f"  {kind}: {times[kind][-1]:.1f} s, {sizes[kind]} B, "
            f"load {load} before, {_load()} after",
            flush=True,
        )
    # The first import from each kind's last image, alternating (page cache
    # dropped each time): what decompression costs at run time.
    for _ in range(import_runs):
        for kind, image in images.items():
            load = _load()
            imports.setdefault(kind, []).append(_first_import(image))
            print(
                f"  first import torch, {kind}: {imports[kind][-1]:.2f} s, "
                f"load {load} before",
                flush=True,
            )
    rows = [
        (f"torch-like tree {tree / 1e9:.2f} GB (real torch wheel content)", "", "-")
    ]
    for kind in times:
        t = statistics.median(times[kind])
        versus = f"{t / statistics.median(times['stock']):.3f}x stock, "
        versus += f"SIF {sizes[kind] / sizes['stock']:.3f}x stock's (gzip)"
        rows.append((f"{kind} (median of {len(times[kind])})", f"{t:.1f} s", versus))
        what = f"  SIF {sizes[kind] / 1e6:.0f} MB; first import torch"
        if imports:
            i = statistics.median(imports[kind])
            what += f" (median of {len(imports[kind])})"
            rows.append((what, f"{i:.2f} s", ""))
    return rows


def print_table(table):
    """Print rows as an aligned table."""
    width = max(len(r[0]) for r in table)
    for label, value, ratio in table:
        if value or ratio:
            print(f"{label:<{width}}  {value:>12}  {ratio}")
        else:
            print(f"\n{label}")
    sys.stdout.flush()


def main(argv=None):
    """Run the selected sections and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one run each, small inputs (CI)"
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="alternating runs for section 1"
    )
    parser.add_argument("--sections", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--uv-runs", type=int, default=3, help="runs of section 8")
    parser.add_argument(
        "--uv-compile",
        choices=("yes", "no", "both"),
        default="yes",
        help="section 8: .pyc files written (the default), not, or both ways",
    )
    parser.add_argument(
        "--layer-runs", type=int, default=3, help="runs of each build of section 6"
    )
    parser.add_argument(
        "--big-gb", type=float, default=3.0, help="the big base of section 6 (GB)"
    )
    parser.add_argument(
        "--cext-functions",
        type=int,
        default=3000,
        help="size of the generated C extension of section 4",
    )
    parser.add_argument(
        "--torch-runs",
        type=int,
        default=3,
        help="alternating runs for section 5 (torch-sized env)",
    )
    parser.add_argument(
        "--full-runs", type=int, default=3, help="runs of each build of section 7"
    )
    parser.add_argument(
        "--full-copies", type=int, default=5, help="torch copies in section 7's base"
    )
    parser.add_argument(
        "--full-order",
        default="",
        help="section 7's builds in order (stock, zstd:3 ...)",
    )
    parser.add_argument("--full-base", help="section 7's base (else derived)")
    parser.add_argument(
        "--rocm-torch-base",
        help="section 3's ROCm-layout fixture, made before from the test base "
        "(else derived)",
    )
    parser.add_argument(
        "--import-runs",
        type=int,
        default=3,
        help="section 7's first imports from each kind's image, alternating",
    )
    parser.add_argument(
        "--compressors",
        default="gzip,zstd:3,zstd:1,lz4",
        help="section 7's build.compression values (the first is the reference)",
    )
    args = parser.parse_args(argv)
    wanted = {int(s) for s in args.sections.split(",")}
    compile_modes = ("yes", "no") if args.uv_compile == "both" else (args.uv_compile,)
    print(
        f"cotainr-lumi benchmarks, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"
    )
    _, base = setup()
    sections = {
        1: (
            "1. stage overhead",
            lambda w: section_overhead(w, base, 1 if args.quick else args.runs),
        ),
        2: ("2. pruning scan", lambda w: section_scan(args.quick)),
        3: (
            "3. bytes saved (ROCm-layout fixture)",
            lambda w: section_bytes(w, base, args.rocm_torch_base),
        ),
        4: (
            "4. cached rebuild",
            lambda w: section_cache(
                w, base, 300 if args.quick else args.cext_functions
            ),
        ),
        5: (
            "5. stage overhead on a torch-sized env (layout 1)",
            lambda w: section_torch_env(w, base, args.torch_runs),
        ),
        6: (
            "6. layered stacked builds",
            lambda w: section_layered(
                w,
                base,
                1 if args.quick else args.layer_runs,
                0 if args.quick else args.big_gb,
            ),
        ),
        7: (
            "7. full builds (issue 40)",
            lambda w: section_full(
                w,
                base,
                [kind for kind in args.full_order.split(",") if kind]
                or ["stock", *args.compressors.split(",")] * args.full_runs,
                args.full_copies,
                args.full_base,
                args.import_runs,
            ),
        ),
        8: (
            "8. uv vs pip (torch wheel)",
            lambda w: section_uv(w, base, args.uv_runs, compile_modes),
        ),
    }
    if args.quick:
        # A 1 GB base image and minutes per build: not for CI's quick mode.
        wanted.discard(5)
        wanted.discard(7)
        wanted.discard(8)
    with tempfile.TemporaryDirectory(prefix="cotainr-lumi-bench-", dir="/tmp") as tmp:
        for number, (title, run) in sections.items():
            if number not in wanted:
                continue
            work = Path(tmp) / f"s{number}"
            work.mkdir()
            # Print each section as soon as it is measured.
            print_table([(title, "", ""), *run(work)])
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
