"""Tests of the prune stage (cotainr_lumi.stages.prune.stage) with a fake sandbox.

The sandbox root is a real directory tree with real ELF files; only the two
commands the stage runs in the container (the probe and the loader check) are
answered by the fake. The real container runs are in tests/e2e/test_pruning.py.
"""

import json
import os
from pathlib import Path
import shutil
import subprocess

import elfbuild
from planfakes import plan_text, stage_context
import pytest
from targetenv_fakes import is_probe, probe_stdout
from test_libstdcxx import DEB_DIR, install_lib
from test_rocm import make_rocm

from cotainr_lumi.errors import InputError, ProfileError, StageError
from cotainr_lumi.imagelayout import LABEL_PRUNE_MANIFEST as MANIFEST_LABEL
from cotainr_lumi.imagelayout import PRUNE_MANIFEST_FILE as MANIFEST_PATH
from cotainr_lumi.pipeline.plan import BuildRequest, make_plan
from cotainr_lumi.pipeline.profiles import load_systems
from cotainr_lumi.processes import CommandError
from cotainr_lumi.stages import PIPELINE
from cotainr_lumi.stages.prune.rocm import VERIFY_SCRIPT
from cotainr_lumi.stages.prune.stage import PruneSettings, PruneStage

ENV = "/opt/cotainr/conda/envs/conda_container_env"
SITE = f"{ENV}/lib/python3.11/site-packages"
DONE = "COTAINR_LUMI_VERIFY_DONE\n"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return elfbuild.Kit(tmp_path_factory.mktemp("kit"))


class FakeSandbox:
    """Answers the stage's probe and loader-check commands."""

    def __init__(
        self, root, *, prefix=ENV, site=(SITE,), rocm_path="/opt/rocm", verify=None
    ):
        self.root = root
        self.prefix = prefix
        self.site = list(site)
        self.rocm_path = rocm_path
        self.verify = verify or (lambda objects: DONE)
        self.verified = []
        self.commands = []

    def run(self, args, *, env=None, timeout=None):
        self.commands.append(list(args))
        if is_probe(args):
            out = probe_stdout(
                self.prefix or None,
                site=self.site,
                rocm_path=self.rocm_path,
                ldcache=[
                    "\tlibstdc++.so.6 (libc6,x86-64) => "
                    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
                ],
            )
            return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")
        assert args[:2] == ["bash", "-c"]
        if args[2] == VERIFY_SCRIPT:
            objects = args[4:]
            self.verified.append(objects)
            return subprocess.CompletedProcess(
                args, 0, stdout=self.verify(objects), stderr=""
            )
        raise AssertionError(f"unexpected command {args}")


def context_for(sandbox, rocm_version="6.1"):
    return stage_context(sandbox, rocm_version=rocm_version, system="lumi-test")


@pytest.fixture
def root(tmp_path, kit):
    root = tmp_path / "sandbox"
    make_rocm(root, kit)
    install_lib(root / DEB_DIR, kit.sys_lib)
    env = root / ENV.lstrip("/")
    install_lib(env / "lib", kit.env_lib)
    shutil.copy2(kit.old_user, env / "lib/libold.so")
    torch = root / SITE.lstrip("/") / "torch"
    (torch / "lib/rocblas/library").mkdir(parents=True)
    shutil.copy2(kit.hip, torch / "lib/libamdhip64.so.6")
    shutil.copy2(kit.rccl, torch / "lib/librccl.so.1")
    shutil.copy2(kit.torch_hip_user, torch / "lib/libtorch_hip.so")
    (torch / "lib/rocblas/library/kernels.dat").write_bytes(b"k" * 5000)
    (torch / "version.py").write_text("hip: Optional[str] = '6.1.40091-a8dbc0c19'\n")
    return root


def torch_lib(root):
    return root / SITE.lstrip("/") / "torch/lib"


def read_manifest(root):
    return json.loads((root / MANIFEST_PATH.lstrip("/")).read_text())


def test_run_prunes_both_and_writes_manifest(root, caplog):
    sandbox = FakeSandbox(root)
    caplog.set_level("INFO", logger="cotainr")
    report = PruneStage().run(context=context_for(sandbox))
    # One probe of the image (the build's), then only the loader check.
    assert [is_probe(c) for c in sandbox.commands] == [True, False]
    assert sandbox.commands[1][2] == VERIFY_SCRIPT
    lib = torch_lib(root)
    assert not list((root / ENV.lstrip("/") / "lib").glob("libstdc++.so*"))
    assert all(
        os.path.islink(lib / n) for n in ("libamdhip64.so.6", "librccl.so.1", "rocblas")
    )
    assert not os.path.islink(lib / "libtorch_hip.so")
    assert report.labels[MANIFEST_LABEL] == MANIFEST_PATH
    manifest = read_manifest(root)
    actions = {(e["path"].rsplit("/", 1)[1], e["action"]) for e in manifest["entries"]}
    assert actions == {
        ("libstdc++.so.6", "removed"),
        ("libstdc++.so.6.0.30", "removed"),
        ("libamdhip64.so.6", "symlinked"),
        ("librccl.so.1", "symlinked"),
        ("rocblas", "symlinked"),
    }
    assert all(e["reason"] and e["size"] >= 0 for e in manifest["entries"])
    assert (
        manifest["bytes-saved"]
        == int(report.labels["cotainr-lumi.prune.bytes-saved"])
        > 5000
    )
    assert manifest["facts"]["rocm-dedup"]["base-rocm"]["major-minor"] == "6.1"
    assert "saved" in report.summary and "replaced 3" in report.summary
    # One loader check, covering every ELF object under torch (links included).
    (objects,) = sandbox.verified
    assert (
        f"{SITE}/torch/lib/libtorch_hip.so" in objects
        and f"{SITE}/torch/lib/librccl.so.1" in objects
    )
    assert "Prune summary" in caplog.text


@pytest.mark.parametrize("strict", [False, True])
def test_rocm_version_mismatch_skips_or_fails(root, strict, caplog):
    (torch_lib(root).parent / "version.py").write_text("hip = '6.0.32830-d62f6a171'\n")
    stage = PruneStage(settings={"strict": strict})
    if strict:
        with pytest.raises(StageError, match="ROCm version mismatch"):
            stage.run(context=context_for(FakeSandbox(root)))
        return
    report = stage.run(context=context_for(FakeSandbox(root)))
    assert not any(p.is_symlink() for p in torch_lib(root).iterdir())
    assert "ROCm version mismatch" in caplog.text and "6.0.32830" in caplog.text
    assert any("mismatch" in w for w in report.record["warnings"])
    assert any(
        s["group"] == "rocm-dedup" and "mismatch" in s["reason"]
        for s in read_manifest(root)["skipped"]
    )


def test_profile_version_used_when_image_has_none(root):
    os.unlink(root / "opt/rocm-6.1.3/.info/version")
    PruneStage().run(context=context_for(FakeSandbox(root), rocm_version="6.1"))
    assert (torch_lib(root) / "librccl.so.1").is_symlink()
    assert (
        read_manifest(root)["facts"]["rocm-dedup"]["base-rocm"]["source"]
        == "the profile's rocm-version"
    )


@pytest.mark.parametrize("strict", [False, True])
def test_unresolved_after_dedup_rolls_back(root, strict, kit):
    original = (torch_lib(root) / "librccl.so.1").read_bytes()

    def verify(objects):
        lines = ""
        if os.path.islink(torch_lib(root) / "librccl.so.1"):
            lines = f"COTAINR_LUMI_NOTFOUND\t{SITE}/torch/lib/libtorch_hip.so\t\tlibhsa-runtime64.so.1 => not found\n"
        return lines + DONE

    sandbox = FakeSandbox(root, verify=verify)
    stage = PruneStage(settings={"strict": strict, "libstdcxx": False})
    if strict:
        with pytest.raises(StageError, match="libhsa-runtime64.so.1 not found"):
            stage.run(context=context_for(sandbox))
    else:
        report = stage.run(context=context_for(sandbox))
        assert "could not resolve" in report.record["warnings"][0]
    lib = torch_lib(root)
    assert not any(p.is_symlink() for p in lib.iterdir())
    assert (lib / "librccl.so.1").read_bytes() == original
    assert not [p for p in lib.iterdir() if p.name.startswith(".cotainr-lumi")]
    assert len(sandbox.verified) == 2


def test_preexisting_unresolved_does_not_block(root, caplog):
    def verify(objects):
        return (
            f"COTAINR_LUMI_NOTFOUND\t{SITE}/torch/lib/libtorch_hip.so\t\tlibfoo.so.9 => not found\n"
            + DONE
        )

    sandbox = FakeSandbox(root, verify=verify)
    PruneStage(settings={"libstdcxx": False}).run(context=context_for(sandbox))
    assert (torch_lib(root) / "librccl.so.1").is_symlink()
    assert "exist with or without de-duplication" in caplog.text
    assert not [
        p for p in torch_lib(root).iterdir() if p.name.startswith(".cotainr-lumi")
    ]


def test_failed_check_command_rolls_back(root, mocker):
    sandbox = FakeSandbox(root)

    def failing(objects):
        raise CommandError(cmd=["bash"], returncode=1, stdout="", stderr="ERROR: boom")

    sandbox.verify = failing
    with pytest.raises(StageError, match="were restored"):
        PruneStage(settings={"libstdcxx": False}).run(context=context_for(sandbox))
    assert not any(p.is_symlink() for p in torch_lib(root).iterdir())


def test_unsafe_libstdcxx_stops_the_build(root, kit):
    shutil.copy2(kit.new_user, root / ENV.lstrip("/") / "lib/libnew.so")
    with pytest.raises(StageError) as info:
        PruneStage().run(context=context_for(FakeSandbox(root)))
    text = str(info.value)
    assert f"{ENV}/lib/libnew.so: needs CXXABI_1.3.13, GLIBCXX_3.4.30" in text
    assert "--set prune.libstdcxx=false" in text and "newer" in text
    assert (root / ENV.lstrip("/") / "lib/libstdc++.so.6.0.30").is_file()
    assert not (root / MANIFEST_PATH.lstrip("/")).exists()


def test_switches_keep_everything(root):
    report = PruneStage(settings={"libstdcxx": False, "rocm-dedup": False}).run(
        context=context_for(FakeSandbox(root))
    )
    assert (root / ENV.lstrip("/") / "lib/libstdc++.so.6.0.30").is_file()
    assert not any(p.is_symlink() for p in torch_lib(root).iterdir())
    assert report.record["entries"] == [] and len(report.record["skipped"]) == 2
    assert not PruneStage(settings={"libstdcxx": False, "rocm-dedup": False}).enabled()


def test_rocm_sdk_layout_is_reported(root, caplog):
    (root / SITE.lstrip("/") / "_rocm_sdk_libraries_gfx90X/lib").mkdir(parents=True)
    report = PruneStage().run(context=context_for(FakeSandbox(root)))
    assert any("_rocm_sdk_" in w for w in report.record["warnings"])
    assert "newer ROCm wheel layout" in caplog.text
    assert read_manifest(root)["facts"]["rocm-dedup"]["rocm-sdk-packages"] == [
        f"{SITE}/_rocm_sdk_libraries_gfx90X"
    ]


def test_no_python_in_image(root):
    report = PruneStage().run(
        context=context_for(FakeSandbox(root, prefix="", site=()))
    )
    assert "no Python environment" in report.record["warnings"][0]
    with pytest.raises(StageError, match="strict"):
        PruneStage(settings={"strict": True}).run(
            context=context_for(FakeSandbox(root, prefix="", site=()))
        )


def test_settings():
    stage = PruneStage(settings={"libstdcxx": True, "strict": False})
    assert stage.settings == PruneSettings(libstdcxx=True, strict=False)
    with pytest.raises(InputError) as info:
        PruneStage(settings={"bogus": 1})
    assert str(info.value) == (
        "Invalid setting prune.bogus: unknown setting (known: libstdcxx, "
        "rocm-dedup, strict)"
    )
    with pytest.raises(InputError, match="prune.libstdcxx: must be true or false"):
        PruneStage(settings={"libstdcxx": "yes"})
    assert PruneStage in PIPELINE


def test_profile_settings_and_dry_run_description(tmp_path, monkeypatch):
    base = tmp_path / "base.sif"
    base.write_bytes(b"sif")
    profile = tmp_path / "systems.yaml"
    profile.write_text(
        "systems:\n  prune-test:\n    extends: lumi-g-ext\n"
        f"    base-image: {base}\n    rocm-version: '6.1'\n"
        "    stages: [prune, provenance]\n"
        "    settings:\n      prune: {libstdcxx: false, strict: true}\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(profile))
    systems = load_systems()
    plan = make_plan(
        request=BuildRequest(
            image_path=tmp_path / "out.sif",
            system="prune-test",
            settings={"prune": {"strict": False}},
        ),
        systems=systems,
    )
    (stage,) = [s for s in plan.stages if s.name == "prune"]
    assert stage.settings.to_dict() == {
        "libstdcxx": False,
        "rocm-dedup": True,
        "strict": False,
    }
    text = "\n".join(stage.describe(build=plan.facts))
    assert "libstdc++: kept" in text
    assert (
        "torch.version.hip" in text
        and "profile says 6.1" in text
        and "SONAMEs match" in text
    )
    assert MANIFEST_PATH in text and "skip with a warning" in text
    assert "prune" in plan_text(plan)
    bad = tmp_path / "bad.yaml"
    bad.write_text(profile.read_text().replace("strict: true", "strict: maybe"))
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(bad))
    with pytest.raises(ProfileError, match="line 8, .*settings.prune.strict"):
        load_systems()


def test_manifest_is_written_into_the_root_not_through_links(root, tmp_path):
    host = tmp_path / "host-opt"
    host.mkdir()
    (root / "opt/cotainr-lumi").symlink_to(
        host
    )  # absolute host path: means the image's
    PruneStage(settings={"libstdcxx": False, "rocm-dedup": False}).run(
        context=context_for(FakeSandbox(root))
    )
    assert not list(host.iterdir())
    assert Path(root / str(host).lstrip("/") / "prune-manifest.json").is_file()


def _make_loop(root, where):
    """Replace the env prefix, <env>/lib or the site-packages dir by a self-loop."""
    path = {
        "prefix": root / ENV.lstrip("/"),
        "lib": root / ENV.lstrip("/") / "lib",
        "site": root / SITE.lstrip("/"),
    }[where]
    shutil.rmtree(path)
    path.symlink_to(path.name)
    return path


@pytest.mark.parametrize("where", ["prefix", "lib", "site"])
def test_symlink_loop_in_the_env_is_skipped_with_a_warning(root, where, caplog):
    _make_loop(root, where)
    caplog.set_level("WARNING", logger="cotainr")
    report = PruneStage().run(context=context_for(FakeSandbox(root)))
    assert "symlink loop" in caplog.text
    assert any("symlink loop" in w for w in report.record["warnings"])
    manifest = read_manifest(root)
    assert any("symlink loop" in skip["reason"] for skip in manifest["skipped"])
    entries = manifest["entries"]
    assert not [e for e in entries if e["group"] != "libstdcxx"]
    if where != "site":  # the loop hides <env>/lib: nothing removed there
        assert entries == []
    # The base image's ROCm is untouched.
    assert (root / "opt/rocm-6.1.3/lib").is_dir()


@pytest.mark.parametrize("where", ["prefix", "lib", "site"])
def test_symlink_loop_in_the_env_fails_a_strict_build(root, where):
    _make_loop(root, where)
    with pytest.raises(StageError, match="symlink loop.*strict"):
        PruneStage(settings={"strict": True}).run(
            context=context_for(FakeSandbox(root))
        )
