"""End-to-end: today's LUMI images, the LUMI AI Factory containers (issue 19).

A test base laid out like the AI Factory torch image (``aif_layout.py``) is
extended with the stock ``cotainr build --system=...`` and real Apptainer
using a system that extends the shipped ``lumi-aif-torch`` profile (only the
base image path is the test's); then the image is extended again. The tests
inspect the produced ``.sif`` files: the pip step went into ``/opt/venv``
(not the system python decoy), torch's bundled ROCm 7 libraries were linked
to the base's, the family's runtime settings (no host ``/opt/cray``, no
forced ``NCCL_NET_GDR_LEVEL``, ``FI_MR_CACHE_MONITOR``), the module drop-in in
real Lmod beside a bindings module, ``cotainr-lumi verify`` with no FAIL, the
SBOMs, and a second build on top of the first. The first build also adds a
system package (``system-packages: [jq]``) with the base's apt-get under
proot's fake root (Debian's proot): the AI Factory images are Ubuntu, this
machine reaches Debian's mirrors but not Ubuntu's, so the AI Factory-like
base here is Debian 12 (``aif_layout.py``) with its Debian sources.

One derived base and two builds per session (~4 minutes on a shared 2-core
machine).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time

import aif_layout
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
import entrypoints
from errorlines import error_lines
from hosttools import need_lmod, need_proot
from pkgfixtures import make_wheel, serve_index
from prune_fixtures import derive_base_image
import pytest
import yaml

from cotainr_lumi.apptainer import SIF_OVERLAY, SIF_PARTITION, SIF_SYSTEM, sif_objects

pytestmark = pytest.mark.e2e

SYSTEM = "aif-e2e"
DIGEST = "u24r70f21m50t210"


@pytest.fixture(scope="module")
def work(
    tmp_path_factory, lumi_like_base_image, apptainer_path, build_times, write_systems
):
    """The derived AI Factory-like base, the test system and the wheels."""
    need_proot()  # the first build's system package
    work = tmp_path_factory.mktemp("aif")
    t0 = time.time()
    apptainer = str(apptainer_path / "apptainer")
    oci = aif_layout.oci_entrypoint(apptainer=apptainer, work=work)
    base = derive_base_image(
        apptainer=apptainer,
        base_image=lumi_like_base_image,
        work=work,
        cases=(),
        setup=aif_layout.setup(oci_sandbox=oci),
        python=f"{aif_layout.VENV}/bin/python",
    )
    build_times["aif: derive base"] = time.time() - t0
    # LAIF's release layout (systems.yaml): the base as the torch variant of
    # the newest release behind the `lumi-multitorch` link, an older release
    # as a decoy; the system names the glob the shipped profiles name.
    containers = work / "appl/laifs/containers"
    for tag in ("20260415_130625", "20260807_115122"):
        release = containers / f"lumi-multitorch-{DIGEST}-{tag}"
        release.mkdir(parents=True)
        for variant in ("torch", "full"):
            (release / f"lumi-multitorch-{variant}-{DIGEST}-{tag}.sif").symlink_to(base)
    (containers / "lumi-multitorch").symlink_to(release.name)
    glob = f"{containers}/lumi-multitorch/lumi-multitorch-torch-*.sif"
    write_systems(
        work / "systems.yaml",
        {SYSTEM: {"extends": "lumi-aif-torch", "base-image": glob}},
    )
    (work / "wheels").mkdir()
    first = make_wheel(work / "wheels", "basepkg", "1.0")
    swap = make_wheel(work / "wheels", "aifswap", "2.0")
    (work / "first.txt").write_text(f"./wheels/{first.name}\n./wheels/{swap.name}\n")
    step = {"requirements": "first.txt", "allow-changes": ["aifswap"]}
    steps = {"system-packages": ["jq"], "steps": [step]}
    (work / "first.yml").write_text(yaml.safe_dump(steps))
    return work, base


@pytest.fixture(scope="module")
def first(work, cotainr_build):
    """The AI Factory-like base extended with one pip step (and its module).

    It adds jq (a system package), basepkg 1.0 and replaces the base's aifswap
    1.0 by 2.0 (which has no ``aifswap/old.py``), as a layer on the base.
    """
    work, _base = work
    image = work / "first.sif"
    proc = cotainr_build(
        work,
        image,
        f"--system={SYSTEM}",
        "--pip-steps",
        "first.yml",
        f"--set=lumi-env.module-dir={work / 'modules'}",
        name="aif: first cotainr build",
    )
    return image, proc.output


@pytest.fixture(scope="module")
def second(work, first, cotainr_build):
    """The first image as the base of a build with pip steps only.

    ``addpkg`` needs torch and basepkg; a local index offers newer ones of
    both (torch 9.9.9, basepkg 2.0): nothing installed may be downloaded or
    replaced.
    """
    work, _base = work
    image, _ = first
    index_files = work / "index-files"
    index_files.mkdir()
    wheels = [
        make_wheel(index_files, "addpkg", "1.0", requires=("torch", "basepkg")),
        make_wheel(index_files, "basepkg", "2.0"),
        make_wheel(index_files, "torch", "9.9.9"),
    ]
    with serve_index(work / "index", wheels) as (url, requests):
        (work / "steps.yml").write_text(
            yaml.safe_dump({"steps": [{"packages": ["addpkg"], "index-url": url}]})
        )
        log = cotainr_build(
            work,
            work / "second.sif",
            "--system=aif-e2e-again",
            "--pip-steps",
            "steps.yml",
            "--set=lumi-env.module-file=false",
            systems={"aif-e2e-again": {"extends": SYSTEM, "base-image": image}},
            name="aif: second cotainr build (on the first)",
        ).output
        return work / "second.sif", log, list(requests)


def cat_json(apptainer_exec, image, path):
    proc = apptainer_exec(image, "cat", path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_dry_run_finds_the_venv_by_rule_5_and_checks_the_rocm(
    work, e2e_facts, cotainr_build
):
    work, _base = work
    # The profile names /opt/venv; without it discovery finds it itself.
    out = cotainr_build(
        work,
        work / "dry.sif",
        f"--system={SYSTEM}",
        "--dry-run",
        "--set=target-env.prefix=null",
    ).output
    line = next(ln for ln in out.splitlines() if "target env:" in ln)
    assert f"target env: {aif_layout.VENV} (python 3.11" in line
    assert "[rule 5, path-env]" in line and "is a venv" in line
    assert "not the target: /usr/bin/python3" not in out  # the venv is first
    rocm = next(ln for ln in out.splitlines() if "rocm:" in ln)
    assert "base image ROCm 7.0.2-56, torch 2.10.0+rocm7.0" in rocm
    assert "supports ROCm 6.1-7.0" in rocm and "WARNING" not in out
    assert "libfabric: the image's own" in out
    assert "leaves NCCL_NET_GDR_LEVEL to RCCL" in out
    e2e_facts["AI Factory torch layout, dry run"] = line.strip()
    e2e_facts["AI Factory torch layout, dry run rocm"] = rocm.strip()


def test_a_rocm_outside_the_window_warns_and_strict_stops(work, cotainr_build):
    work, _base = work
    # The same base against a window that ends before ROCm 7: a warning in
    # the dry run; with rocm.strict one error and a non-zero exit.
    window = ("--set=rocm.supported=6.1-6.4", "--set=lumi-env.module-file=false")
    dry = (work, work / "dry.sif", f"--system={SYSTEM}", "--dry-run")
    out = cotainr_build(*dry, *window).output
    assert "WARNING: " in out and "6.1-6.4" in out, out[-3000:]
    out = cotainr_build(*dry, "--set=rocm.strict=true", *window).output
    assert "ERROR (strict): " in out and "the build would stop here (strict)" in out
    proc = cotainr_build(
        work,
        work / "strict.sif",
        f"--system={SYSTEM}",
        "--set=rocm.strict=true",
        *window,
        ok=False,
    )
    output = proc.output
    assert proc.returncode != 0 and "Traceback" not in output, output[-3000:]
    assert len(error_lines(output)) == 1, output[-3000:]
    assert "7.0.2" in output and "strict" in output, output[-3000:]
    assert not list(work.glob("strict.sif*")), list(work.glob("strict.sif*"))


def test_the_pip_step_lands_in_the_venv_and_torch_is_pruned(first, apptainer_exec):
    image, log = first
    assert f"Target Python environment: {aif_layout.VENV}" in log
    assert "system Python" not in log
    script = (
        f"test -f {aif_layout.SITE}/basepkg/__init__.py && echo landed; "
        "test -e /usr/lib/python3/dist-packages/basepkg && echo decoy; "
        "python -c 'import basepkg, sys; print(sys.prefix)'"
    )
    proc = apptainer_exec(image, "bash", "-c", script)
    assert proc.stdout.split() == ["landed", aif_layout.VENV], proc.stderr
    manifest = cat_json(apptainer_exec, image, "/opt/cotainr-lumi/prune-manifest.json")
    torch_lib = f"{aif_layout.SITE}/torch/lib"
    linked = {e["path"] for e in manifest["entries"] if e["action"] == "symlinked"}
    assert f"{torch_lib}/librccl.so.1" in linked
    proc = apptainer_exec(image, "readlink", "-f", f"{torch_lib}/librccl.so.1")
    assert proc.stdout.strip().startswith(f"{aif_layout.ROCM}/lib/")


def test_the_first_build_is_a_layer_that_adds_replaces_and_removes(
    work, first, apptainer_exec
):
    _work, base = work
    image, log = first
    parts = {
        sif: [o for o in sif_objects(sif) if o.datatype == SIF_PARTITION]
        for sif in (image, base)
    }
    assert [o.parttype for o in parts[base]] == [SIF_SYSTEM]
    assert sorted(o.parttype for o in parts[image]) == [SIF_SYSTEM, SIF_OVERLAY]
    assert "Layered image: " in log
    # The system package is in the layer and runs; the record lists it.
    proc = apptainer_exec(image, "jq", "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("jq-"), proc.stderr
    record = cat_json(apptainer_exec, image, "/opt/cotainr-lumi/system-packages.json")
    assert record["manager"] == "apt" and record["requested"] == ["jq"]
    assert "jq" in {p["name"] for p in record["added"]}
    contents = []
    for sif in (image, base):  # the base's squashfs, byte for byte
        system = [o for o in parts[sif] if o.parttype == SIF_SYSTEM][0]
        with open(sif, "rb") as f:
            f.seek(system.offset)
            contents.append(f.read(system.size))
    assert contents[0] == contents[1]
    script = (
        "import aifswap, basepkg, importlib.metadata as m, importlib.util as u; "
        "print(aifswap.VERSION, basepkg.VERSION, u.find_spec('aifswap.old'), "
        "*sorted(d.version for d in m.distributions() if d.metadata['Name'] == 'aifswap'))"
    )
    proc = apptainer_exec(image, "python", "-c", script)
    assert proc.stdout.split() == ["2.0", "1.0", "None", "2.0"], proc.stderr
    proc = apptainer_exec(image, "ls", aif_layout.SITE)
    assert "aifswap-1.0.dist-info" not in proc.stdout.split(), proc.stdout


def test_the_familys_runtime_settings(first, image_runtime):
    image, _ = first
    labels, env, runtime = image_runtime("AI Factory image", image)
    binds = labels["cotainr-lumi.binds"].split(",")
    assert "/opt/cray" not in binds and "/usr/lib64/libcxi.so.1" not in binds
    assert labels["cotainr-lumi.mpi"] == "container"  # its MPICH speaks CXI
    assert labels["cotainr-lumi.rocm.version"] == "7.0.2-56"
    assert labels["cotainr-lumi.rocm.torch"] == "7.0"
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert "NCCL_NET_GDR_LEVEL" not in env
    assert env["COTAINR_LUMI_NCCL_NET_GDR_LEVEL"] == ""
    assert env["COTAINR_LUMI_RCCL_TESTS"] == "/usr/libexec/rccl-tests"
    assert env["MPIR_CVAR_ENABLE_GPU"] == "1"  # the image's own settings stay
    assert "/opt/cray" not in env.get("LD_LIBRARY_PATH", "")
    assert env["PATH"].split(":")[0] == f"{aif_layout.VENV}/bin"
    assert runtime["libfabric"] == "image"
    assert runtime["net-plugin"]["generation"] == "aws-ofi-nccl"
    assert runtime["net-plugin"]["dir"] == aif_layout.MULTIARCH
    # RCCL loads aws-ofi-nccl's ROCm build only by name; the decoy never.
    assert runtime["net-plugin"]["nccl-net-plugin"] == "ofi"
    assert env["NCCL_NET_PLUGIN"] == "ofi"


def test_a_user_venv_on_the_image_finds_its_own_packages_first(
    first, apptainer_exec, tmp_path, e2e_facts
):
    # LUST's user-software workflow on an AI Factory image: /opt/venv is on
    # PYTHONPATH, which comes before a venv's own site-packages, so a package
    # the user installs again into the user venv must still win.
    image, _ = first
    user = tmp_path / "user-software"
    user.mkdir()
    bind = {"APPTAINER_BIND": f"{user}:/user-software"}
    made = apptainer_exec(
        image,
        "bash",
        "-c",
        'source /runscripts/init-user-venv && echo "$VIRTUAL_ENV"',
        env=bind,
    )
    assert made.returncode == 0, made.stderr
    venv = made.stdout.strip().splitlines()[-1]
    assert venv.startswith("/user-software/venv/"), made.stdout
    (site,) = (user / venv[len("/user-software/") :]).glob("lib/python*/site-packages")
    (site / "basepkg").mkdir()
    (site / "basepkg" / "__init__.py").write_text("VERSION = 'user'\n")
    probe = (
        "import basepkg, os, sys; print(basepkg.__file__); "
        "print(os.environ['PYTHONPATH']); print(sys.prefix)"
    )
    proc = apptainer_exec(image, "python", "-c", probe, env=bind)
    assert proc.returncode == 0, proc.stderr
    module, pythonpath, prefix = proc.stdout.strip().splitlines()[-3:]
    assert module.startswith(f"{venv}/lib/"), proc.stdout
    assert pythonpath.split(":")[:2] == [
        f"{venv}/lib/{site.parent.name}/site-packages",
        aif_layout.SITE,
    ]
    assert prefix == venv
    e2e_facts["AI Factory image, user venv PYTHONPATH"] = pythonpath


def _lmod(modules, script, env=None):
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"source {shlex.quote(str(need_lmod()))} && module use "
            f"{shlex.quote(str(modules))} && {script}",
        ],
        env={"PATH": os.environ["PATH"], "HOME": str(modules), **(env or {})},
        cwd=modules,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


#: Keeps the binds whose host path exists here (LUMI's do not), then runs the
#: command: the /user-software bind of the module stays.
EXISTING_BINDS = (
    'keep=(); IFS=, read -ra all <<<"$SINGULARITY_BIND"; '
    'for b in "${all[@]}"; do [ -e "${b%%:*}" ] && keep+=("$b"); done; '
    'export SINGULARITY_BIND="$(IFS=,; echo "${keep[*]}")"; '
)


def test_the_module_does_the_bindings_modules_job_or_works_beside_it(
    work, first, apptainer_path
):
    work, _ = work
    modules = work / "modules"
    family = ["/var/spool/slurmd", "/pfs", "/scratch", "/projappl", "/project"]
    alone = _lmod(
        modules,
        'module load first && echo "$SINGULARITY_BIND" && echo "$SLURM_MPI_TYPE"'
        ' && module unload first && echo "after:${SLURM_MPI_TYPE-unset}"',
    )
    binds = alone.split("\n")[0].strip().split(",")
    assert set(family) <= set(binds) and "/opt/cray" not in binds
    # The image keeps its own MPICH (it speaks CXI): srun --mpi=pmi2 by
    # default while the module is loaded, as the AI Factory's module sets it.
    assert alone.split("\n")[1:3] == ["pmi2", "after:unset"], alone
    assert any(b.endswith(":/user-software") for b in binds)
    # Beside LUST's bindings module (loaded first): no bind twice.
    (work / "laifs").mkdir()
    (work / "laifs" / "lumi-aif-singularity-bindings.lua").write_text(
        'setenv("SINGULARITY_BIND", '
        '"/var/spool/slurmd,/pfs,/scratch,/projappl,/project,/flash,/appl")\n'
    )
    beside = _lmod(
        modules,
        f"module use {work / 'laifs'} && module load lumi-aif-singularity-bindings"
        ' && module load first && echo "$SINGULARITY_BIND"',
    )
    binds = beside.strip().split(",")
    assert len(binds) == len(set(binds)) and any(
        b.endswith(":/user-software") for b in binds
    )
    # Run through the module: the distributed runscript forces no GDR level.
    probe = (
        "import os; print(os.environ.get('NCCL_NET_GDR_LEVEL'), "
        "os.environ['FI_MR_CACHE_MONITOR'], os.environ['RANK'])"
    )
    out = _lmod(
        modules,
        "module load first && "
        + EXISTING_BINDS
        + f'singularity exec "$SIF" conda-python-distributed -c {shlex.quote(probe)}',
        env={
            "SLURM_NODELIST": "nid[005252-005254]",
            "SLURM_JOB_ID": "4242",
            "SLURM_PROCID": "5",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS": "16",
            "PATH": f"{apptainer_path}:{os.environ['PATH']}",
        },
    )
    assert out.splitlines()[-1] == "None userfaultfd 5"


def test_verify_has_no_fail_on_the_ai_factory_image(
    work, first, verify_image, e2e_facts
):
    work, _ = work
    image, _ = first
    code, rows, report = verify_image(
        image, env={"COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml")}
    )
    assert code == 0 and report["failed"] == [], json.dumps(report, indent=1)
    for check in (
        "target-env",
        "net-plugin",
        "net-plugin-deps",
        "image-libfabric",
        "rccl-tests",
        "rocm-driver",
        "torch-rocm-duplicates",
        "torch-rccl",
        "with-conda",
        "package-list",
        "env:FI_MR_CACHE_MONITOR",
    ):
        assert rows[check] == "PASS", (check, report)
    assert "cray-libfabric" not in rows and "env:NCCL_NET_GDR_LEVEL" not in rows
    plugin = next(r for r in report["results"] if r["check"] == "net-plugin")
    # (Debian's ld.so.conf names the merged /lib/x86_64-linux-gnu first.)
    assert re.match(
        r"aws-ofi-nccl: (/usr)?/lib/x86_64-linux-gnu/librccl-net-ofi\.so \(on the "
        r"loader's path, named by NCCL_NET_PLUGIN=ofi\)",
        plugin["evidence"],
    ), plugin
    (work / "verify-first.json").write_text(json.dumps(report, indent=1))
    e2e_facts["AI Factory image, verify"] = ", ".join(
        f"{check} {status}" for check, status in rows.items()
    )
    e2e_facts["AI Factory image, net-plugin"] = plugin["evidence"]


def test_the_sboms_record_what_the_build_added(work, first, apptainer_exec):
    work, base = work
    image, _ = first
    before = cat_json(apptainer_exec, base, "/.sbom.json")
    after = cat_json(apptainer_exec, image, "/.sbom.json")
    record = cat_json(apptainer_exec, image, "/opt/cotainr-lumi/system-packages.json")
    added = [{"name": p["name"], "version": p["version"]} for p in record["added"]]
    assert set(after) == {"apt", "pip"} and after["apt"] == before["apt"] + added
    assert "jq" in {p["name"] for p in added}
    names = {p["name"] for p in after["pip"]}
    assert names == {p["name"] for p in before["pip"]} | {"basepkg"}
    proc = apptainer_exec(image, "cat", "/opt/cotainr-lumi/sbom.cdx.json")
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(proc.stdout) is None
    cdx = json.loads(proc.stdout)
    origins = {c["name"]: c["properties"][0]["value"] for c in cdx["components"]}
    assert origins["basepkg"] == "build" and origins["torch"] == "base"
    jq = [c for c in cdx["components"] if c["name"] == "jq"][0]
    assert jq["purl"].startswith("pkg:deb/debian/jq@") and origins["jq"] == "build"
    labels = json.loads(
        apptainer_exec(image, "cat", "/.singularity.d/labels.json").stdout
    )
    assert labels["cotainr-lumi.sbom"] == "/opt/cotainr-lumi/sbom.cdx.json"


def test_a_second_build_on_the_first_adds_and_replaces_nothing_else(
    first, second, apptainer_exec, verify_image, work
):
    work, _ = work
    image1, _ = first
    image2, log, requests = second
    # Nothing installed was downloaded: only addpkg came from the index.
    assert [r for r in requests if r.endswith(".whl")] == [
        "/files/addpkg-1.0-py3-none-any.whl"
    ], requests
    old = cat_json(apptainer_exec, image1, "/opt/cotainr-lumi/pip/packages.json")
    new = cat_json(apptainer_exec, image2, "/opt/cotainr-lumi/pip/packages.json")
    assert {(p["name"], p["version"]) for p in new} == {
        (p["name"], p["version"]) for p in old
    } | {("addpkg", "1.0")}
    versions = {p["name"]: p["version"] for p in new}
    assert (
        versions["torch"] == aif_layout.TORCH_VERSION and versions["basepkg"] == "1.0"
    )
    # The first build's records are kept apart; this build's are its own.
    labels = json.loads(
        apptainer_exec(image2, "cat", "/.singularity.d/labels.json").stdout
    )
    assert labels["cotainr-lumi.history"] == "1"
    # The first build's entry-point env file did not mislead this build's run.
    first_labels = cat_json(apptainer_exec, image1, "/.singularity.d/labels.json")
    entry = "cotainr-lumi.oci-entrypoint"
    assert labels[entry] == first_labels[entry] and "FI_HMEM" in labels[entry]
    first_provenance = cat_json(
        apptainer_exec, image2, "/opt/cotainr-lumi/history/1/provenance.json"
    )
    assert first_provenance == cat_json(
        apptainer_exec, image1, "/opt/cotainr-lumi/provenance.json"
    )
    cdx = cat_json(apptainer_exec, image2, "/opt/cotainr-lumi/sbom.cdx.json")
    origins = {c["name"]: c["properties"][0]["value"] for c in cdx["components"]}
    assert origins["addpkg"] == "build" and origins["basepkg"] == "base"
    aif = cat_json(apptainer_exec, image2, "/.sbom.json")
    assert {"addpkg", "basepkg", "torch"} <= {p["name"] for p in aif["pip"]}
    code, _rows, report = verify_image(
        image2, env={"COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml")}
    )
    assert code == 0 and report["failed"] == [], json.dumps(report, indent=1)
    # Issue 30: the AI Factory-like base extended as layers, one per build.
    parts = [o for o in sif_objects(image2) if o.datatype == SIF_PARTITION]
    assert [o.parttype for o in parts].count(SIF_OVERLAY) == 2, parts
    assert "Layered image: " in log


def test_the_glob_base_resolves_in_the_latest_release_and_is_recorded(
    work, first, apptainer_exec, cotainr_build
):
    work, base = work
    image, _ = first
    newest = work / "appl/laifs/containers/lumi-multitorch"
    matched = f"{newest}/lumi-multitorch-torch-{DIGEST}-20260807_115122.sif"
    record = cat_json(apptainer_exec, image, "/opt/cotainr-lumi/provenance.json")
    assert record["base-image"]["given"] == matched
    assert record["base-image"]["pattern"] == f"{newest}/lumi-multitorch-torch-*.sif"
    assert record["base-image"]["resolved"] == str(base)
    # A glob matching both variants is one error naming them and --base-image.
    proc = cotainr_build(
        work,
        work / "any.sif",
        "--system=aif-e2e-any",
        "--dry-run",
        systems={
            "aif-e2e-any": {
                "extends": SYSTEM,
                "base-image": f"{newest}/lumi-multitorch-*.sif",
            }
        },
        ok=False,
    )
    output = proc.output
    assert proc.returncode != 0 and "Traceback" not in output, output[-3000:]
    assert len(error_lines(output)) == 1, output[-3000:]
    assert "matches 2 files: " in output and "lumi-multitorch-full-" in output
    assert "--lumi-system aif-e2e-any --base-image FILE" in output


#: Job environments as Slurm sets them (ROCR_VISIBLE_DEVICES for a GPU job),
#: plus the entry point's opt-ins, which users export themselves.
JOBS = {
    "no job": {},
    "one node, CPU": {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
    },
    "two nodes, 8 GPUs each, rank 11": {
        "SLURM_JOB_ID": "4243",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "16",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "11",
        "SLURM_LOCALID": "3",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_JOB_NODELIST": "nid[005252-005253]",
        "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "ROCR_USE_SLURM_LOCALID": "1",
        "MAP_HIP_TO_ROCR_VISIBLE_DEVICES": "1",
    },
}
SHOWN = ("FI_HMEM_DISABLE_P2P", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _seen(apptainer_path, action, image, env):
    """What `apptainer ACTION image env` prints of SHOWN (no $: run's eval)."""
    proc = subprocess.run(
        [str(apptainer_path / "apptainer"), action, "--no-home", str(image), "env"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return {name: found.get(name, "unset") for name in SHOWN}, proc.stderr


@pytest.mark.parametrize("job", sorted(JOBS))
def test_exec_and_run_agree_on_the_entry_points_environment(
    first, apptainer_path, apptainer_exec, job
):
    # Issue 37: today's AI Factory entry point (#!/usr/bin/env bash, GPU
    # binding), run by Apptainer's own runscript; exec gets what run gets.
    image, log = first
    env = JOBS[job]
    ran, _ = _seen(apptainer_path, "run", image, env)
    execed, err = _seen(apptainer_path, "exec", image, env)
    assert execed == ran and "cotainr-lumi" not in err, err[-2000:]
    want = {name: env.get(name, "unset") for name in SHOWN}
    assert ran == {**want, **entrypoints.expected(aif_layout.RELEASE, env)}
    labels = cat_json(apptainer_exec, image, "/.singularity.d/labels.json")
    assert labels["cotainr-lumi.oci-entrypoint"] == (
        "applied at each start but run's: /.singularity.d/runscript runs "
        "/opt/cotainr-lumi/entrypoint-env and the variables it changed are set "
        "(in a one-node job: FI_HMEM_DISABLE_P2P)"
    )
    assert "exec gets the environment /.singularity.d/runscript prepares" in log
