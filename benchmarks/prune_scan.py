"""Benchmark the prune stage's ELF scan against ``find | xargs readelf -V``.

Generates a torch-ROCm-sized tree (benchmarks/gen_torch_tree.py) unless one
is given, then runs, each in a fresh child process so wall time and peak
memory (``ru_maxrss`` from ``wait4``) are measured alike:

- ours: :func:`cotainr_lumi.engine.elfinfo.scan_elf_files` over the env, collecting
  SONAME, DT_NEEDED and version needs/definitions of every ELF file (what the
  libstdc++ check reads);
- baseline: ``find ENV -type f -print0 | xargs -0 readelf -V`` (version
  sections only, output discarded).

Usage::

    python benchmarks/prune_scan.py [--tree DIR] [--repeat 3] [--files 40000] [--elf 500] [--gb 6] [--functions-scale 1]

(``--files``, ``--elf``, ``--gb`` and ``--functions-scale``: the generated
tree, see gen_torch_tree.py.)
"""

import argparse
import os
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
import time

HERE = Path(__file__).resolve().parent

OURS = r"""
import sys
from cotainr_lumi.engine.elfinfo import scan_elf_files
n = needs = 0
for info in scan_elf_files(root=sys.argv[1], path="/opt/env"):
    n += 1
    needs += len(info.needs_from(prefix="libstdc++.so."))
print(n, needs)
"""


def measure(cmd):
    """Run `cmd`; return (wall seconds, peak RSS MiB of it and its descendants, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (
        0,
        123,
    ):  # xargs exits 123 when readelf complains about non-ELF files
        raise SystemExit(f"{cmd[0]} failed with {proc.returncode}")
    return wall, usage.ru_maxrss / 1024, out.decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree", help="an existing tree (sandbox root) from gen_torch_tree.py"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", type=int, default=40000)
    parser.add_argument("--elf", type=int, default=500)
    parser.add_argument("--gb", type=float, default=6.0)
    parser.add_argument("--functions-scale", type=float, default=1.0)
    args = parser.parse_args()

    tmp = None
    if args.tree:
        root = Path(args.tree)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="prune-bench-")
        root = Path(tmp.name)
        sys.path.insert(0, str(HERE))
        from gen_torch_tree import generate

        t0 = time.perf_counter()
        files, elf, apparent = generate(
            root,
            n_files=args.files,
            n_elf=args.elf,
            total_gb=args.gb,
            functions_scale=args.functions_scale,
        )
        print(
            f"tree: {files} files, {elf} ELF, {apparent / 1024**3:.1f} GiB apparent (generated in {time.perf_counter() - t0:.1f} s)"
        )
    env = root / "opt/env"
    ours_cmd = [sys.executable, "-c", OURS, str(root)]
    base_cmd = [
        "bash",
        "-c",
        f"find {env} -type f -print0 | xargs -0 readelf -V > /dev/null 2>&1",
    ]
    # Warm the page cache once so both sides read from memory.
    measure(base_cmd)
    results = {"ours (pyelftools scan)": [], "find | xargs readelf -V": []}
    for _ in range(args.repeat):
        for name, cmd in (
            ("ours (pyelftools scan)", ours_cmd),
            ("find | xargs readelf -V", base_cmd),
        ):
            results[name].append(measure(cmd))
    print(f"{'':28s}{'median s':>10s}{'min s':>10s}{'peak MiB':>10s}")
    for name, runs in results.items():
        walls = [w for w, _m, _o in runs]
        peak = max(m for _w, m, _o in runs)
        print(
            f"{name:28s}{statistics.median(walls):10.2f}{min(walls):10.2f}{peak:10.1f}"
        )
    n_elf, n_needs = results["ours (pyelftools scan)"][0][2].split()
    print(f"ours read {n_elf} ELF files ({n_needs} libstdc++ version needs in total)")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
