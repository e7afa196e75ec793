"""The target env on the bases LUMI users really have (stock ``cotainr build``).

Each layout (see ``layouts.py``) is built with one pip step (a small local
wheel) through the stock ``cotainr build --system=...`` and real Apptainer;
the tests check where the package landed (in the env, not in the decoys),
that ``$WITH_CONDA; python`` imports it, that the ROCm-torch-like tree in
that env was pruned, and the verify rows. Layout 5 (only a system python)
must stop early with one clear error and leave no image.
"""

from __future__ import annotations

import json
import time

import layouts
from pkgfixtures import make_wheel
import pytest

pytestmark = pytest.mark.e2e

PKG = "layoutpkg"

#: layout -> (setup script, env python for the fixtures, expected target,
#: fixture cases)
LAYOUTS = {
    "layout1": (
        layouts.LAYOUT1,
        f"{layouts.ENV}/bin/python",
        layouts.ENV,
        ("libstdcxx-safe", "torch"),
    ),
    "layout2": (
        layouts.LAYOUT2,
        f"{layouts.ENV}/bin/python",
        layouts.ENV,
        ("libstdcxx-safe", "torch"),
    ),
    "layout3": (
        layouts.LAYOUT3,
        f"{layouts.ENV}/bin/python",
        layouts.VENV,
        ("torch",),
    ),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("layouts")
    (work / "wheels").mkdir()
    wheel = make_wheel(work / "wheels", PKG, "1.0")
    (work / "req.txt").write_text(f"./wheels/{wheel.name}\n")
    return work


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def built(request, work, derived_base, build_times, cotainr_build):
    """(layout, image, systems file, expected target, build output)."""
    name = request.param
    setup, python, expected, cases = LAYOUTS[name]
    sub = work / name
    sub.mkdir()
    t0 = time.time()
    base = derived_base(f"{name}-layouts", cases=cases, setup=setup, python=python)
    build_times[f"{name}: derive base"] = time.time() - t0
    systems = work / f"{name}-e2e.yaml"
    image = sub / f"{name}.sif"
    proc = cotainr_build(
        work,
        image,
        f"--system={name}-e2e",
        "--force",
        "--pip-requirements",
        "req.txt",
        systems={f"{name}-e2e": {"base-image": base}},
        systems_file=systems,
        name=f"{name}: cotainr build",
    )
    return name, image, systems, expected, proc.output


def test_dry_run_names_the_env_and_why(built, work, e2e_facts, cotainr_build):
    name, image, systems, expected, _ = built
    proc = cotainr_build(
        work,
        work / "dry.sif",
        f"--system={name}-e2e",
        "--dry-run",
        systems_file=systems,
    )
    line = next(ln for ln in proc.stdout.splitlines() if "target env:" in ln)
    e2e_facts[f"{name}, dry run"] = line.strip()
    assert f"target env: {expected} (python 3.11" in line
    if name == "layout1":
        assert "from the base image's $WITH_CONDA" in line
        assert f"not the target: {layouts.CONDA}/bin/python" in proc.stdout
        # The explicit setting wins (and needs no probe to be described).
        proc = cotainr_build(
            work,
            work / "dry.sif",
            f"--system={name}-e2e",
            "--dry-run",
            f"--set=target-env.prefix={layouts.VENV}",
            systems_file=systems,
            ok=False,
        )
        assert f"target env: {layouts.VENV} (named explicitly" in proc.stdout
    else:
        assert "already active in its environment" in line or "active in" in line


def test_package_lands_in_the_env_not_in_the_decoys(built, apptainer_exec):
    name, image, _systems_file, expected, log = built
    assert f"Target Python environment: {expected}" in log
    site = f"{expected}/{layouts.SITE}"
    decoys = [
        f"{layouts.CONDA}/{layouts.SITE}",
        "/usr/lib/python3/dist-packages",
        "/usr/local/lib/python3.11/dist-packages",
    ]
    if name == "layout3":
        decoys.append(f"{layouts.ENV}/{layouts.SITE}")
    script = f"test -f {site}/{PKG}/__init__.py && echo landed; " + "; ".join(
        f"test -e {d}/{PKG} && echo decoy:{d}" for d in decoys
    )
    proc = apptainer_exec(image, "bash", "-c", script + "; true")
    assert proc.stdout.split() == ["landed"], proc.stdout + proc.stderr
    record = json.loads(
        apptainer_exec(image, "cat", "/opt/cotainr-lumi/target-env.json").stdout
    )
    assert record["prefix"] == expected


def test_with_conda_then_python_imports_the_package(built, apptainer_exec):
    name, image, _s, expected, _ = built
    proc = apptainer_exec(
        image,
        "bash",
        "-c",
        f'$WITH_CONDA; python -c "import {PKG}, sys; print(sys.prefix, {PKG}.VERSION)"',
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [expected, "1.0"]
    if name == "layout1":
        # The base's two-line $WITH_CONDA runs as two lines (issue 22).
        proc = apptainer_exec(
            image, "bash", "-c", '$WITH_CONDA; echo "$LAYOUT1_CHAINED"'
        )
        assert proc.stdout.strip() == "yes", proc.stderr[-2000:]
    # The runscript the module file uses runs the same env.
    proc = apptainer_exec(
        image, "conda-python-simple", "-c", f"import {PKG}, sys; print(sys.prefix)"
    )
    assert proc.stdout.strip() == expected, proc.stderr[-2000:]


def test_torch_tree_in_the_env_is_pruned(built, apptainer_exec):
    name, image, _s, _expected, _ = built
    manifest = json.loads(
        apptainer_exec(image, "cat", "/opt/cotainr-lumi/prune-manifest.json").stdout
    )
    torch_lib = f"{layouts.ENV}/{layouts.SITE}/torch/lib"
    linked = [
        e["path"]
        for e in manifest["entries"]
        if e["action"] == "symlinked" and e["path"].startswith(torch_lib)
    ]
    assert f"{torch_lib}/librccl.so.1" in linked
    proc = apptainer_exec(image, "readlink", "-f", f"{torch_lib}/librccl.so.1")
    assert proc.stdout.strip().startswith("/opt/rocm-6.1.3/lib/"), proc.stdout
    if name != "layout3":
        removed = [
            e["path"]
            for e in manifest["entries"]
            if e["action"] == "removed" and "libstdc++" in e["path"]
        ]
        assert removed and all(p.startswith(f"{layouts.ENV}/lib/") for p in removed)


def test_verify_passes_the_env_rows(built, verify_image, e2e_facts):
    name, image, systems, expected, _ = built
    _rc, rows, report = verify_image(image, env={"COTAINR_LUMI_SYSTEMS": str(systems)})
    e2e_facts[f"{name}, verify"] = ", ".join(f"{c} {s}" for c, s in rows.items())
    for check in (
        "target-env",
        "with-conda",
        "env-libstdcxx",
        "torch-rocm-duplicates",
        "torch-rccl",
        "runscripts",
    ):
        assert rows[check] == "PASS", (check, report)
    target_row = next(r for r in report["results"] if r["check"] == "target-env")
    assert target_row["evidence"].startswith(expected)


@pytest.fixture(scope="module")
def system_python_base(work, derived_base, write_systems):
    base = derived_base(
        "layout5-bare", cases=(), setup=layouts.LAYOUT5, python="/usr/bin/python3"
    )
    return base, write_systems(
        work / "layout5-e2e.yaml", {"layout5-e2e": {"base-image": base}}
    )


def test_layout5_system_python_only_stops_early_with_one_error(
    work, system_python_base, cotainr_build
):
    _base, systems = system_python_base
    image = work / "layout5-never.sif"
    args = (work, image, "--system=layout5-e2e", "--pip-requirements", "req.txt")
    proc = cotainr_build(*args, "--dry-run", systems_file=systems)
    assert "target env: none: the base image has no Python environment" in proc.stdout
    proc = cotainr_build(
        *args, systems_file=systems, ok=False, name="layout5: failing build"
    )
    out = proc.output
    assert proc.returncode != 0
    assert "the base image has no Python environment to install into" in out
    assert "/usr/bin/python3 (prefix /usr), a system Python" in out
    assert "--conda-env" in out and "--set target-env.prefix=" in out
    assert "Traceback" not in out
    # Neither the image nor a partial one (cotainr's or cotainr-lumi's name)
    assert not [p for p in image.parent.iterdir() if image.name in p.name]
