"""End-to-end tests of the prune stage: real Apptainer, LUMI-like base images.

Fixture content is created inside the container by scripts run with the
image's own tools (g++, ldconfig, the stub ROCm):

- ``LIBSTDCXX_SAFE``: a copy of the base image's own libstdc++ in the env's
  ``lib/`` and a C++ library there that needs it (safe to remove);
- ``LIBSTDCXX_NEWER``: a fabricated newer libstdc++ (GLIBCXX_3.4.99) and a
  library needing GLIBCXX_3.4.99 (must refuse);
- ``TORCH``: ``torch/lib`` in the env's site-packages with copies of the base
  image's ROCm libraries and ``rocblas/`` and a ``libtorch_hip.so`` needing
  them through ``$ORIGIN``, plus ``torch/version.py`` with ``hip = ...``.

Builds: (1) the stock ``cotainr build`` command on a base image derived from
the LUMI-like one with the safe libstdc++ and a matching torch (cases a + c);
(2) and (3) in-process through :func:`cotainr_lumi.build` (the same pipeline)
with a test-only stage that runs the fixture scripts: a newer libstdc++ must
stop the build (case b) and a ROCm 6.1 torch on the ROCm 6.0 base must be
left alone with a warning (case d).
"""

from dataclasses import dataclass
import json
import logging
import subprocess

from prune_fixtures import fixture_script
import pytest
import yaml

import cotainr_lumi
from cotainr_lumi import stages
from cotainr_lumi.engine.settings import StageSettings, setting
from cotainr_lumi.engine.stage import Stage, StageReport
from cotainr_lumi.errors import StageError

pytestmark = pytest.mark.e2e

ENV = "/opt/cotainr/conda/envs/conda_container_env"
SITE = f"{ENV}/lib/python3.11/site-packages"
MANIFEST = "/opt/cotainr-lumi/prune-manifest.json"


@dataclass(frozen=True)
class PruneFixtureSettings(StageSettings):
    cases: list[str] = setting([], doc="the fixture cases to create")
    hip: str = setting("6.1.40093-fixture", doc="torch.version.hip of the fixture")


class PruneFixtureStage(Stage):
    """Test-only stage: create prune fixture content in the env (e2e tests)."""

    name = "prune-e2e-fixture"
    settings_class = PruneFixtureSettings

    def run(self, *, context):
        """Run the fixture script in the container."""
        script = fixture_script(*self.settings.cases, hip=self.settings.hip)
        context.sandbox.run(["bash", "-c", script])
        return StageReport(name=self.name, summary="fixture content created")


def write_profile(path, systems):
    path.write_text(yaml.safe_dump({"systems": systems}))
    return path


def labels_of(apptainer_path, image):
    proc = subprocess.run(
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
    )
    data = json.loads(proc.stdout)
    return data["data"]["attributes"]["labels"]


# -- (a) + (c): stock `cotainr build` on a derived base image ------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory, rocm_torch_base_image, cotainr_build):
    """Build with the stock cotainr command; return (image, output, dry-run output)."""
    work = tmp_path_factory.mktemp("prune-e2e")
    image = work / "pruned.sif"
    prune = {"libstdcxx": True, "rocm-dedup": True}
    dry = cotainr_build(
        work,
        image,
        "--system=prune-e2e",
        "--dry-run",
        "--set=prune.strict=true",
        systems={
            "prune-e2e": {
                "base-image": rocm_torch_base_image,
                "settings": {"prune": prune},
            }
        },
        timeout=900,
    )
    proc = cotainr_build(work, image, "--system=prune-e2e", "--force", timeout=900)
    return image, proc.output, dry.stdout


def test_pruned_image_passes_verify(built, verify_image):
    image, _out, _dry = built
    code, rows, report = verify_image(image)
    assert code == 0 and report["failed"] == [], report
    assert rows["env-libstdcxx"] == rows["torch-rocm-duplicates"] == "PASS"
    assert rows["torch-rccl"] == rows["package-list"] == "PASS"


def test_dry_run_describes_the_checks(built):
    _image, _out, dry = built
    assert "libstdc++: remove <env>/lib/libstdc++.so*" in dry
    assert "torch.version.hip" in dry and "profile says 6.1" in dry
    assert "strict: true" in dry and MANIFEST in dry


def test_libstdcxx_removed_and_cxx_code_loads_against_the_base(built, apptainer_exec):
    image, out, _dry = built
    assert "removed" in out and "libstdc++" in out
    proc = apptainer_exec(
        image, "bash", "-c", f"ls {ENV}/lib/ | grep -c 'libstdc++' || true"
    )
    assert proc.stdout.strip() == "0", proc.stdout
    probe = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL('{ENV}/lib/libcxxdemo.so')\n"
        "print(lib.cxxdemo_len(b'abc'))\n"
        "maps = open('/proc/self/maps').read()\n"
        "print([l.split()[-1] for l in maps.splitlines() if 'libstdc++' in l][0])\n"
    )
    proc = apptainer_exec(image, "python", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    length, used = proc.stdout.split()
    assert length == "4"
    assert used.startswith("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"), used


def test_rocm_duplicates_linked_and_resolving(built, apptainer_exec, apptainer_path):
    image, out, _dry = built
    assert "replaced" in out and "saved" in out
    lib = f"{SITE}/torch/lib"
    proc = apptainer_exec(
        image,
        "bash",
        "-c",
        f'cd {lib} && for f in *; do printf \'%s %s\\n\' "$f" "$(readlink "$f" || echo FILE)"; done',
    )
    entries = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert entries["libtorch_hip.so"] == "FILE"
    for name in ("libamdhip64.so.6", "librccl.so.1", "librocblas.so.4", "rocblas"):
        assert entries[name].startswith("../") and entries[name].endswith(
            f"rocm-6.1.3/lib/{name}"
        ), entries
    # With the image's environment, torch's code loads and the base image's RCCL is mapped.
    probe = (
        "import ctypes\n"
        f"lib = ctypes.CDLL('{lib}/libtorch_hip.so')\n"
        "print(lib.torch_hip_probe())\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(sorted({l.split()[-1] for l in maps.splitlines() if 'rccl' in l}))\n"
    )
    proc = apptainer_exec(image, "python", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    value, mapped = proc.stdout.splitlines()
    assert value == "101103"
    assert mapped == "['/opt/rocm-6.1.3/lib/librccl.so.1.0.60103']"
    # Without LD_LIBRARY_PATH, torch's direct ROCm dependencies still resolve
    # through $ORIGIN (the links); the stub ROCm libraries themselves have no
    # RUNPATH, so their own dependencies need the image's LD_LIBRARY_PATH.
    proc = apptainer_exec(
        image, "env", "-u", "LD_LIBRARY_PATH", "ldd", f"{lib}/libtorch_hip.so"
    )
    assert f"librccl.so.1 => {lib}/librccl.so.1" in proc.stdout, proc.stdout
    assert f"libamdhip64.so.6 => {lib}/libamdhip64.so.6" in proc.stdout, proc.stdout
    proc = apptainer_exec(image, "bash", "-c", f"ls {lib}/rocblas/library | head -1")
    assert proc.stdout.startswith("Kernels") or proc.stdout.startswith("Tensile"), (
        proc.stdout
    )
    # Manifest and labels.
    labels = labels_of(apptainer_path, image)
    assert labels["cotainr-lumi.prune.manifest"] == MANIFEST
    manifest = json.loads(apptainer_exec(image, "cat", MANIFEST).stdout)
    assert manifest["bytes-saved"] == int(labels["cotainr-lumi.prune.bytes-saved"]) > 0
    paths = {e["path"]: e for e in manifest["entries"]}
    assert paths[f"{lib}/librccl.so.1"]["action"] == "symlinked"
    assert paths[f"{lib}/librccl.so.1"]["reason"].startswith("same SONAME librccl.so.1")
    assert paths[f"{ENV}/lib/libstdc++.so.6"]["action"] == "removed"
    assert manifest["facts"]["rocm-dedup"]["base-rocm"]["major-minor"] == "6.1"
    assert not [p for p in paths if ".cotainr-lumi-prune-backup" in p]


# -- (b) and (d): in-process builds with the test-only fixture stage -----------


def test_newer_libstdcxx_refuses_with_the_list(
    tmp_path, monkeypatch, lumi_like_base_image, caplog
):
    profile = write_profile(
        tmp_path / "systems.yaml",
        {
            "prune-e2e-b": {
                "extends": "lumi-g-ext-rocm-6.2",
                "base-image": str(lumi_like_base_image),
                "stages": ["prune-e2e-fixture", "prune", "provenance"],
                "settings": {"prune-e2e-fixture": {"cases": ["libstdcxx-newer"]}},
            }
        },
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(profile))
    monkeypatch.setattr(stages, "PIPELINE", (*stages.PIPELINE, PruneFixtureStage))
    image = tmp_path / "refused.sif"
    with pytest.raises(StageError) as info:
        cotainr_lumi.build(image_path=image, system="prune-e2e-b", force=True)
    text = str(info.value)
    assert info.value.stage == "prune"
    assert f"{SITE}/newcxx/_ext.so: needs GLIBCXX_3.4.99" in text
    assert (
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6" in text
        or "/lib/x86_64-linux-gnu/libstdc++.so.6" in text
    )
    assert "--set prune.libstdcxx=false" in text and "newer" in text
    assert not image.exists()
    assert not list(tmp_path.glob(".refused.sif.partial-*"))


def test_rocm_version_mismatch_is_left_alone(
    tmp_path, monkeypatch, lumi_like_base_image_rocm60, apptainer_exec, caplog
):
    profile = write_profile(
        tmp_path / "systems.yaml",
        {
            "prune-e2e-d": {
                "extends": "lumi-g-ext-rocm-6.2",
                "base-image": str(lumi_like_base_image_rocm60),
                "rocm-version": "6.0",
                "stages": ["prune-e2e-fixture", "prune", "provenance"],
                "settings": {
                    "prune-e2e-fixture": {
                        "cases": ["torch"],
                        "hip": "6.1.40093-fixture",
                    },
                    "provenance": {"hash-base-image": False},
                },
            }
        },
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(profile))
    monkeypatch.setattr(stages, "PIPELINE", (*stages.PIPELINE, PruneFixtureStage))
    image = tmp_path / "mismatch.sif"
    caplog.set_level(logging.WARNING, logger="cotainr")
    result = cotainr_lumi.build(image_path=image, system="prune-e2e-d", force=True)
    details = result.report("prune").record
    assert any(
        "ROCm version mismatch" in w and "6.1.40093" in w for w in details["warnings"]
    )
    assert "ROCm version mismatch" in caplog.text
    assert details["entries"] == []
    proc = apptainer_exec(image, "bash", "-c", f"find {SITE}/torch/lib -type l | wc -l")
    assert proc.stdout.strip() == "0"
    manifest = json.loads(apptainer_exec(image, "cat", MANIFEST).stdout)
    assert any("mismatch" in s["reason"] for s in manifest["skipped"])
