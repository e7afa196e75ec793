"""End-to-end tests of the pip stage: real Apptainer, real torch, real builds.

The torch layer (real torch 2.13.0 CPU from this machine's disk, its
dependencies from PyPI) is built once per module and used as the base image
override of the later builds:

- a torch C++ extension built with ``no-build-isolation`` against the
  installed torch, and a local wheel depending on plain ``torch``: the
  extension runs in the final image and torch is untouched;
- a step pinning another torch version stops with the protection error;
- torch and the extension in one step fail with "No module named 'torch'";
- a small sdist from a local index is installed by two builds: the second
  takes the wheel built by the first from the host pip cache;
- uv as the installer (``pip.installer=uv``): the torch layer's step gives the
  same packages as with pip, nothing of uv stays in the image, the protected
  torch cannot be replaced through uv, and an option uv lacks is refused at
  plan time.
"""

from __future__ import annotations

import json
from pathlib import Path
import re
import shutil
import subprocess

from errorlines import error_lines
from hosttools import need_file
from packaging.utils import canonicalize_name
from pkgfixtures import make_sdist, make_wheel, serve_index
import pytest
import yaml

pytestmark = pytest.mark.e2e

TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
TORCHEXT = Path(__file__).parent / "data" / "pip" / "torchext"
SYSTEM = "pip-e2e"


@pytest.fixture(scope="module")
def work(tmp_path_factory, lumi_like_base_image, write_systems):
    """A work dir with a test system profile and its own pip cache."""
    need_file(
        TORCH_WHEEL,
        install="a real torch CPU wheel: pip download --no-deps "
        f"--only-binary :all: -d {TORCH_WHEEL.parent} 'torch==2.13.0+cpu' "
        "--index-url https://download.pytorch.org/whl/cpu",
    )
    work = tmp_path_factory.mktemp("pip-e2e")
    write_systems(work / "systems.yaml", {SYSTEM: {"base-image": lumi_like_base_image}})
    return work


@pytest.fixture(scope="module")
def build(work, cotainr_build, build_times):
    """``build(image, *args, name, **keywords)``: the test system's build.

    ``--lumi-system`` with ``--base-image``, else ``--system``; not checked
    (`keywords` go to ``cotainr_build``). The pip stage's time goes to
    ``build_times`` too.
    """

    def run(image, *args, name, **keywords):
        with_base = "--base-image" in map(str, args)
        system = ["--lumi-system", SYSTEM] if with_base else [f"--system={SYSTEM}"]
        proc = cotainr_build(
            work, image, *system, "--force", *args, ok=False, name=name, **keywords
        )
        m = re.search(r"Finished stage pip in ([0-9.]+) s", proc.output)
        if m:
            build_times[f"{name} (pip stage)"] = float(m.group(1))
        return proc

    return run


def _inputs_for_torch(work):
    (work / "wheels").mkdir(exist_ok=True)
    link = work / "wheels" / TORCH_WHEEL.name
    if not link.exists():
        link.symlink_to(TORCH_WHEEL)
    (work / "common.txt").write_text("wheel  # needed to build without isolation\n")
    (work / "torch.txt").write_text(f"-r common.txt\n./wheels/{TORCH_WHEEL.name}\n")


@pytest.fixture(scope="module")
def torch_image(work, build):
    """The torch layer, built once: base image + torch 2.13.0+cpu + wheel."""
    _inputs_for_torch(work)
    image = work / "torch.sif"
    proc = build(image, "--pip-requirements", "torch.txt", name="torch layer")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return image


@pytest.fixture(scope="module")
def extension_image(work, torch_image, build):
    """torch layer + the C++ extension (no build isolation) + a torch user."""
    shutil.copytree(TORCHEXT, work / "torchext", dirs_exist_ok=True)
    make_wheel(work, "needs-torch", "1.0", requires=["torch"])
    (work / "needs.txt").write_text("./needs_torch-1.0-py3-none-any.whl\n")
    (work / "steps.yml").write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {
                        "name": "torch extension",
                        "packages": ["./torchext"],
                        "no-build-isolation": True,
                        "env": {"MAX_JOBS": 2, "CXX": "g++"},
                    },
                    {"requirements": "needs.txt"},
                ]
            }
        )
    )
    image = work / "ext.sif"
    proc = build(
        image,
        "--base-image",
        torch_image,
        "--pip-steps",
        "steps.yml",
        # A LUMI bindings module left loaded must not break the build.
        env={"SINGULARITY_BIND": "/var/spool/slurmd"},
        name="extension build",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return image, proc


def test_torch_layer_has_torch_and_its_records(torch_image, apptainer_exec):
    proc = apptainer_exec(
        torch_image,
        "bash",
        "-c",
        "python -c 'import torch; print(torch.__version__)'; "
        "cat /opt/cotainr-lumi/pip/step1/torch.txt /opt/cotainr-lumi/pip/step1/common.txt; "
        "ls -a /opt/cotainr-lumi",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "2.13.0+cpu"
    # The -r include and the local wheel were staged and rewritten.
    assert lines[1].startswith("-r /opt/cotainr-lumi/pip/step1/common.txt")
    assert lines[2].startswith(
        f"/opt/cotainr-lumi/.pip-work/staging/step1/1/{TORCH_WHEEL.name}  # cotainr-lumi: was ./wheels/"
    )
    assert lines[3].startswith("wheel")
    # No staging dir or pip cache left in the image.
    assert ".pip-work" not in lines[4:]


def test_extension_builds_against_installed_torch_and_runs(
    extension_image, apptainer_exec
):
    image, build = extension_image
    assert "Ignoring SINGULARITY_BIND" in build.stdout + build.stderr
    assert "pip steps install into /opt/cotainr/conda/envs/conda_container_env" in (
        build.stdout + build.stderr
    )
    proc = apptainer_exec(
        image,
        "python",
        "-c",
        "import json, torch, torchext, needs_torch; "
        "print(json.dumps([torchext.add_one(torch.zeros(3)).tolist(), "
        "torchext.built_with_torch(), torch.__version__, needs_torch.VERSION]))",
    )
    assert proc.returncode == 0, proc.stderr
    added, built_with, torch_version, needs = json.loads(proc.stdout.splitlines()[-1])
    assert added == [1.0, 1.0, 1.0]
    assert built_with == "2.13.0"
    # The plain `torch` dependency of step 2 left the installed torch alone.
    assert torch_version == "2.13.0+cpu"
    assert needs == "1.0"


def test_package_list_and_labels_are_in_the_image(
    extension_image, apptainer_exec, apptainer_path
):
    image, _ = extension_image
    labels = subprocess.run(
        [
            str(apptainer_path / "apptainer"),
            "inspect",
            "--labels",
            "--json",
            str(image),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        '"cotainr-lumi.pip.packages": "/opt/cotainr-lumi/pip/packages.json"' in labels
    )
    proc = apptainer_exec(
        image,
        "bash",
        "-c",
        "cat /opt/cotainr-lumi/pip/packages.json; echo ===; "
        "cat /opt/cotainr-lumi/pip/steps.json; echo ===; "
        "cat /opt/cotainr-lumi/pip/step2/protected-constraints.txt; echo ===; "
        "ls -a /opt/cotainr-lumi",
    )
    assert proc.returncode == 0, proc.stderr
    packages, steps, constraints, listing = proc.stdout.split("===\n")
    versions = {p["name"].lower(): p["version"] for p in json.loads(packages)}
    assert versions["torch"] == "2.13.0+cpu"
    assert versions["torchext"] == "0.1.0"
    assert versions["needs-torch"] == "1.0"
    steps = json.loads(steps)
    sources = [s["source"] for s in steps["steps"]]
    assert sources[0].endswith("steps.yml, step 1"), sources
    assert sources[1].endswith("steps.yml, step 2"), sources
    assert "--no-build-isolation" in steps["steps"][0]["command"]
    assert steps["steps"][0]["env"] == {"MAX_JOBS": "2", "CXX": "g++"}
    assert "torch==2.13.0+cpu" in constraints.splitlines()
    assert "torchext==0.1.0" in constraints.splitlines()
    assert ".pip-work" not in listing.split()


def test_layered_image_passes_verify(extension_image, verify_image):
    # A real but CPU torch: the ROCm torch rows do not apply.
    image, _ = extension_image
    code, rows, report = verify_image(image)
    assert code == 0 and report["failed"] == [], report
    assert rows["torch-rocm-duplicates"] == rows["torch-rccl"] == "N/A"
    assert rows["package-list"] == rows["with-conda"] == "PASS"


def test_step_wanting_another_torch_stops_the_build(work, torch_image, build):
    (work / "pin.txt").write_text("torch==2.12.0\n")
    image = work / "pinned.sif"
    proc = build(
        image,
        "--base-image",
        torch_image,
        "--pip-requirements",
        "pin.txt",
        name="protection failure",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "step 1 (pin.txt) would change protected package(s) torch" in output
    assert "torch 2.13.0+cpu is installed (before this step) and protected" in output
    assert "torch==2.12.0" in output
    assert "allow-changes: [torch]" in output
    assert not image.exists()


def test_torch_and_extension_in_one_step_fail(work, lumi_like_base_image, build):
    _inputs_for_torch(work)
    shutil.copytree(TORCHEXT, work / "torchext", dirs_exist_ok=True)
    (work / "one-step.txt").write_text(f"./wheels/{TORCH_WHEEL.name}\n./torchext\n")
    image = work / "one-step.sif"
    proc = build(image, "--pip-requirements", "one-step.txt", name="one-step failure")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "pip install failed in step 1 (one-step.txt)" in output
    assert "No module named 'torch'" in output
    assert "No image was written" in output
    assert not image.exists()


@pytest.fixture
def local_index(tmp_path):
    """A local package index (plain HTTP) serving the sdist cachedemo 1.0."""
    sdist = make_sdist(tmp_path, "cachedemo", "1.0")
    with serve_index(tmp_path / "index", [sdist]) as served:
        yield served


def test_host_pip_cache_is_reused_and_not_in_the_image(
    work, lumi_like_base_image, local_index, apptainer_exec, build
):
    """The wheel pip builds from an sdist is reused by the next build.

    (pip caches HTTP downloads only from HTTPS indexes that send caching
    headers; this machine's PyPI proxy sends none, so the wheel cache is what
    can be shown here. On LUMI, PyPI downloads are cached as well.)
    """
    index_url, requests = local_index
    cache_dir = work / "cache-test-cache"
    (work / "cache-steps.yml").write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {"packages": ["cachedemo==1.0"], "extra-index-urls": [index_url]}
                ],
                "cache-dir": "cache-test-cache",
            }
        )
    )
    image = work / "cache.sif"
    for n in (1, 2):
        proc = build(image, "--pip-steps", "cache-steps.yml", name=f"cache build {n}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        downloads = [r for r in requests if r.endswith(".tar.gz")]
        # The second build used the wheel cached on the host by the first.
        assert len(downloads) == 1, requests
    assert [p.name for p in (cache_dir / "wheels").rglob("*.whl")] == [
        "cachedemo-1.0-py3-none-any.whl"
    ]
    proc = apptainer_exec(
        image,
        "bash",
        "-c",
        "python -c 'import cachedemo; print(cachedemo.VERSION)'; ls -a /opt/cotainr-lumi",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "1.0"
    assert ".pip-work" not in proc.stdout


def test_host_find_links_missing_in_the_container_is_said_once(
    work, lumi_like_base_image, local_index, build
):
    """A host PIP_FIND_LINKS pointing nowhere in the container: one warning.

    pip warned "Location ... is ignored" for every package it looked up and in
    every isolated build; the pip stage leaves such entries out and says so
    once.
    """
    index_url, _ = local_index
    (work / "links-steps.yml").write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {"packages": ["cachedemo==1.0"], "extra-index-urls": [index_url]}
                ]
            }
        )
    )
    missing = "/no/such/host/wheelhouse"
    proc = build(
        work / "links.sif",
        "--pip-steps",
        "links-steps.yml",
        "-vv",
        env={"PIP_FIND_LINKS": missing},
        name="host PIP_FIND_LINKS",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert output.count(f"PIP_FIND_LINKS={missing} is set on this machine") == 1
    assert "is ignored" not in output


def test_credentials_and_build_secrets_leave_no_trace(
    work, lumi_like_base_image, tmp_path, apptainer_exec, apptainer_path, build
):
    """An index that checks its credentials and a step's HF_TOKEN (issue 29).

    pip gets the credentials (the package installs from the index that
    refuses requests without them); the image (every file, its labels), the
    build log at pip's debug verbosity, the log files, the module files and
    the dry run hold neither the password nor the token. A token for the
    image's env is refused at dry run.
    """
    secrets = ("s3cret", "hf_abc")
    wheel = make_wheel(tmp_path, "privdemo", "1.0")
    with serve_index(tmp_path / "index", [wheel], auth="user:s3cret") as served:
        url, requests = served
        private = url.replace("http://", "http://user:s3cret@")
        (work / "nested.txt").write_text(f"--extra-index-url {private}\nprivdemo\n")
        (work / "private.txt").write_text("-r nested.txt\n")
        (work / "secret-steps.yml").write_text(
            yaml.safe_dump(
                {
                    "steps": [
                        {
                            "requirements": "private.txt",
                            "packages": ["privdemo==1.0"],
                            "index-url": private,
                            "env": {"HF_TOKEN": "hf_abc"},
                        }
                    ]
                }
            )
        )
        image = work / "secret.sif"
        args = ("--pip-steps", work / "secret-steps.yml")
        dry = build(image, *args, "--dry-run", name="secrets dry run")
        logs = work / "secret-logs"
        logs.mkdir()
        proc = build(
            image,
            *args,
            "-vvvv",
            "--log-to-file",
            cwd=logs,
            name="secrets build (-vvvv)",
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert any(r.endswith(".whl") for r in requests), requests
    assert dry.returncode == 0, dry.stderr
    assert "--index-url http://user:***@127.0.0.1:" in dry.stdout
    assert "HF_TOKEN='***'" in dry.stdout
    # pip's own output went through the redaction too (pip writes user:****).
    assert "Looking in indexes: http://user:***@127.0.0.1:" in output
    installed = apptainer_exec(
        image,
        "bash",
        "-c",
        "python -c 'import privdemo; print(privdemo.VERSION)'; "
        "cat /opt/cotainr-lumi/pip/step1/nested.txt",
    )
    assert installed.stdout.splitlines()[:2] == [
        "1.0",
        f"--extra-index-url {private.replace('s3cret', '***')}",
    ]
    everywhere = subprocess.run(
        [apptainer_path / "apptainer", "exec", "--containall", image]
        + ["grep", "-rlF", "-e", secrets[0], "-e", secrets[1], "/"]
        + [f"--exclude-dir={d}" for d in ("proc", "sys", "dev")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert everywhere.returncode == 1, everywhere.stdout + everywhere.stderr[-2000:]
    labels = subprocess.run(
        [apptainer_path / "apptainer", "inspect", "--labels", "--json", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "cotainr-lumi.pip.steps" in labels
    log_files = sorted(logs.glob("cotainr_build_*"))
    assert log_files
    host_texts = [dry.stdout + dry.stderr, output, labels] + [
        p.read_text() for p in (*log_files, work / "secret.lua", work / "secret.sh")
    ]
    for text in host_texts:
        assert not [s for s in secrets if s in text]
    # A token for the image's env: one error at dry run, saying what to do.
    refused = build(
        image, "--env", "HF_TOKEN=x", "--dry-run", name="secret env refused"
    )
    assert refused.returncode == 2
    assert len(error_lines(refused.stderr)) == 1, refused.stderr
    assert "export SINGULARITYENV_HF_TOKEN=..." in refused.stderr
    assert "lumi-env.allow-secret-env=[HF_TOKEN]" in refused.stderr


def test_pip_check_reports_broken_requirements_and_strict_stops(
    work, lumi_like_base_image, apptainer_exec, build
):
    """A later step downgrades what an earlier step's package needs (allowed).

    pip's resolver does not look at the other installed packages, so the step
    succeeds; ``pip check`` after it names both packages (a warning), and
    ``pip.check=strict`` stops the build without an image.
    """
    wheels = work / "check-wheels"
    wheels.mkdir(exist_ok=True)
    for version in ("1.0", "2.0"):
        make_wheel(wheels, "checkdep", version)
    make_wheel(wheels, "checkuser", "1.0", requires=["checkdep>=2"])
    (work / "check-steps.yml").write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {
                        "packages": [
                            "./check-wheels/checkuser-1.0-py3-none-any.whl",
                            "./check-wheels/checkdep-2.0-py3-none-any.whl",
                        ]
                    },
                    {
                        "packages": ["./check-wheels/checkdep-1.0-py3-none-any.whl"],
                        "allow-changes": ["checkdep"],
                    },
                ]
            }
        )
    )
    broken = "checkuser 1.0 has requirement checkdep>=2, but you have checkdep 1.0"
    image = work / "check.sif"
    proc = build(image, "--pip-steps", "check-steps.yml", name="check")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "broken requirements of checkuser, checkdep:" in output
    assert f"  {broken}\n" in output
    proc = apptainer_exec(image, "cat", "/opt/cotainr-lumi/pip/pip-check.txt")
    assert proc.returncode == 0 and f"{broken}." in proc.stdout, proc.stderr

    strict = work / "check-strict.sif"
    proc = build(
        strict,
        "--pip-steps",
        "check-steps.yml",
        "--set",
        "pip.check=strict",
        name="check strict",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert output.count("broken requirements of checkuser, checkdep:") == 1, output
    assert f"  {broken}\n" in output and "Or build anyway: pip.check=warn." in output
    assert "No image was written" in output
    assert not strict.exists()


def _packages(apptainer_exec, image):
    proc = apptainer_exec(image, "cat", "/opt/cotainr-lumi/pip/packages.json")
    assert proc.returncode == 0, proc.stderr
    return {
        (canonicalize_name(p["name"]), p["version"]) for p in json.loads(proc.stdout)
    }


def test_uv_installs_what_pip_installs_and_leaves_nothing(
    work, torch_image, apptainer_exec, build
):
    image = work / "uv-torch.sif"
    proc = build(
        image,
        "--pip-requirements",
        "torch.txt",
        "--set",
        "pip.installer=uv",
        name="torch layer with uv",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert _packages(apptainer_exec, image) == _packages(apptainer_exec, torch_image)
    script = (
        "cat /opt/cotainr-lumi/pip/steps.json; echo ===; "
        "cat /opt/cotainr-lumi/pip/pip-check.txt; echo ===; ls -a /opt/cotainr-lumi; "
        "command -v uv || echo no-uv; python -c 'import torch; print(torch.__version__)'"
    )
    proc = apptainer_exec(image, "bash", "-c", script)
    steps, check, rest = proc.stdout.split("===\n")
    step = json.loads(steps)["steps"][0]
    assert step["installer"] == "uv" and "--compile-bytecode" in step["command"]
    assert "All installed packages are compatible" in check
    assert ".pip-work" not in rest.split() and rest.split()[-2:] == [
        "no-uv",
        "2.13.0+cpu",
    ]


def test_uv_cannot_replace_protected_torch_nor_take_what_it_lacks(
    work, torch_image, build
):
    (work / "pin.txt").write_text("torch==2.12.0\n")
    image = work / "uv-pinned.sif"
    args = ("--base-image", torch_image, "--set", "pip.installer=uv")
    proc = build(image, *args, "--pip-requirements", "pin.txt", name="uv protection")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not image.exists()
    assert "step 1 (pin.txt) would change protected package(s) torch" in output
    assert "you require torch==2.12.0 and torch==2.13.0+cpu" in output
    assert len(error_lines(output)) == 1, output
    # An option uv does not do as pip does: refused by the dry run.
    (work / "prefer.yml").write_text(
        yaml.safe_dump(
            {"steps": [{"packages": ["six"], "pip-args": ["--prefer-binary"]}]}
        )
    )
    proc = build(
        image, *args, "--pip-steps", "prefer.yml", "--dry-run", name="uv refusal"
    )
    assert proc.returncode == 2 and not image.exists()
    assert "uv does not do --prefer-binary (pip-args) as pip does" in proc.stderr
    assert "add 'installer: pip' to the step" in proc.stderr
