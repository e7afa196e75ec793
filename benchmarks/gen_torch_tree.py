"""Generate a torch-ROCm-sized tree for the prune scan benchmark.

The tree imitates a conda env holding a ROCm torch wheel: about 40,000 files,
about 500 of them ELF shared objects, several GB in total. The ELF files are
copies of a few real C++ shared libraries compiled once here (with many
exported functions, so their symbol tables are torch-like, and with real
GLIBCXX version needs), extended to their target sizes with sparse holes
(``truncate``), so the tree takes little disk space. The other files are small
Python sources, headers and data files.

Usage::

    python benchmarks/gen_torch_tree.py OUT_DIR [--files 40000] [--elf 500] [--gb 6] [--functions-scale 1]

``--functions-scale`` scales the exported functions of the three compiled
templates (e.g. 0.1: 5, 200 and 2,000 instead of 50, 2,000 and 20,000; the
largest takes most of the generation time to compile).

The tree is ``OUT_DIR/opt/env`` (a sandbox root at ``OUT_DIR``).
"""

import argparse
import os
from pathlib import Path
import random
import subprocess
import tempfile

#: (exported functions, share of the ELF files) of the compiled templates.
TEMPLATES = [(50, 0.6), (2000, 0.3), (20000, 0.1)]


def compile_template(directory, n_functions, index):
    """A C++ shared library with `n_functions` exported functions."""
    src = Path(directory) / f"t{index}.cpp"
    lines = ["#include <string>", "#include <vector>", "#include <stdexcept>"]
    lines += [
        f'extern "C" int torch_fn_{index}_{i}(int x) {{ return x * {i % 7 + 1} + {i}; }}'
        for i in range(n_functions)
    ]
    lines.append(
        'extern "C" int uses_cxx(const char *s) { std::string t(s); std::vector<int> v(t.size());'
        ' if (v.empty()) throw std::runtime_error("empty"); return (int)t.size(); }'
    )
    src.write_text("\n".join(lines) + "\n")
    out = Path(directory) / f"libtemplate{index}.so"
    subprocess.run(
        [
            "g++",
            "-O0",
            "-shared",
            "-fPIC",
            "-o",
            str(out),
            str(src),
            f"-Wl,-soname,libtemplate{index}.so",
        ],
        check=True,
    )
    return out.read_bytes()


def generate(
    out, *, n_files=40000, n_elf=500, total_gb=6.0, functions_scale=1.0, seed=1
):
    """Write the tree; returns (files, elf files, apparent bytes)."""
    rng = random.Random(seed)
    env = Path(out) / "opt/env"
    site = env / "lib/python3.11/site-packages"
    with tempfile.TemporaryDirectory() as tmp:
        templates = [
            (compile_template(tmp, max(1, int(n * functions_scale)), i), share)
            for i, (n, share) in enumerate(TEMPLATES)
        ]
    # ELF sizes: a few huge ones (like libtorch_hip, librocblas, hipblaslt kernels), many small.
    total = int(total_gb * 1024**3)
    weights = [rng.paretovariate(1.2) for _ in range(n_elf)]
    scale = total / sum(weights)
    sizes = [int(w * scale) for w in weights]
    elf_dirs = [
        site / "torch/lib",
        site / "torch/lib/hipblaslt/library",
        env / "lib",
        site / "torchvision",
        site / "numpy/core",
    ]
    for d in elf_dirs:
        d.mkdir(parents=True, exist_ok=True)
    apparent = 0
    for i in range(n_elf):
        data = rng.choices(
            [t for t, _s in templates], weights=[s for _t, s in templates]
        )[0]
        d = elf_dirs[0] if i < n_elf * 0.6 else rng.choice(elf_dirs)
        path = d / f"lib_part{i}.so"
        path.write_bytes(data)
        size = max(sizes[i], len(data))
        os.truncate(path, size)
        apparent += size
    n_other = n_files - n_elf
    pkg_dirs = [
        site / "torch" / sub
        for sub in (
            "_inductor",
            "include/ATen/ops",
            "include/c10/util",
            "testing/_internal",
            "distributed",
            "nn/modules",
            "utils/data",
        )
    ]
    pkg_dirs += [site / f"pkg{k}" / "sub" for k in range(40)]
    for d in pkg_dirs:
        d.mkdir(parents=True, exist_ok=True)
    body = ("# generated\n" + "x = 1\n" * 200).encode()
    for i in range(n_other):
        d = pkg_dirs[i % len(pkg_dirs)]
        ext = (".py", ".pyi", ".h", ".json", ".dat")[i % 5]
        size = rng.randint(200, len(body))
        (d / f"f{i}{ext}").write_bytes(body[:size])
        apparent += size
    return n_files, n_elf, apparent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--files", type=int, default=40000)
    parser.add_argument("--elf", type=int, default=500)
    parser.add_argument("--gb", type=float, default=6.0)
    parser.add_argument("--functions-scale", type=float, default=1.0)
    args = parser.parse_args()
    files, elf, apparent = generate(
        args.out,
        n_files=args.files,
        n_elf=args.elf,
        total_gb=args.gb,
        functions_scale=args.functions_scale,
    )
    print(
        f"generated {files} files ({elf} ELF), {apparent / 1024**3:.1f} GiB apparent, in {args.out}"
    )


if __name__ == "__main__":
    main()
