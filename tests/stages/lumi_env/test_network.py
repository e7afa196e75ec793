"""The network layer of an image family (stages/lumi_env/network.py) in the stage."""

import json
from types import SimpleNamespace

import pytest
from test_lumi_env_stage import FakeSandbox, make_root, source_env

from cotainr_lumi.engine.profiles import PACKAGED_PROFILE, load_systems
from cotainr_lumi.engine.stage import StageContext
from cotainr_lumi.imagelayout import RUNTIME_FILE
from cotainr_lumi.stages.lumi_env import network
from cotainr_lumi.stages.lumi_env.settings import LumiEnvSettings
from cotainr_lumi.stages.lumi_env.stage import LumiEnvStage

MULTIARCH = "/usr/lib/x86_64-linux-gnu"


def profile_settings(name):
    systems = load_systems(files=[PACKAGED_PROFILE], include_stock=False)
    return systems[name].stage_settings("lumi-env")


def run_stage(tmp_path, settings, *, aif=False, ofi=True):
    """The stage on a fake sandbox; `aif`: the AI Factory's plugin and rccl-tests."""
    root = make_root(tmp_path, ofi=ofi)
    if aif:
        add_aif_plugin(root)
    sandbox = FakeSandbox(root, probe="prefix=/opt/env\nconda_prefix=\nconda_exe=\n")
    plan = SimpleNamespace(image_path=tmp_path / "out" / "torch.sif")
    stage = LumiEnvStage(settings=settings)
    return root, stage.run(context=StageContext(sandbox=sandbox, plan=plan)), sandbox


def add_aif_plugin(root, name="libnccl-net.so"):
    lib = root / MULTIARCH.lstrip("/")
    lib.mkdir(parents=True, exist_ok=True)
    (lib / name).write_bytes(b"")
    (root / "usr/libexec/rccl-tests").mkdir(parents=True)


def test_find_plugin_both_generations(tmp_path):
    resolve = lambda path: tmp_path / path.lstrip("/")  # noqa: E731
    assert network.find_plugin(root=resolve, dirs=["/opt/aws-ofi-rccl"]) is None
    (tmp_path / "opt/aws-ofi-rccl").mkdir(parents=True)
    (tmp_path / "opt/aws-ofi-rccl/librccl-net.so.0").write_bytes(b"")
    add_aif_plugin(tmp_path, "libnccl-net-ofi.so")
    assert network.find_plugin(root=resolve, dirs=[MULTIARCH, "/opt/aws-ofi-rccl"]) == {
        "generation": "aws-ofi-nccl",
        "dir": MULTIARCH,
        "files": ["libnccl-net-ofi.so"],
    }
    assert network.find_plugin(root=resolve, dirs=["/opt/aws-ofi-rccl"])[
        "generation"
    ] == ("aws-ofi-rccl")


@pytest.mark.parametrize("value", ["3", 3, "PHB", "SYS", None])
def test_gdr_levels(value):
    settings = LumiEnvSettings.complete({"nccl-net-gdr-level": value})
    assert settings.nccl_net_gdr_level == value


@pytest.mark.parametrize("value", ["7", "phb", "3; rm -rf /"])
def test_bad_gdr_levels_are_refused(value):
    spec = LumiEnvSettings.declared()["nccl-net-gdr-level"]
    with pytest.raises(ValueError, match="must be one of LOC, PIX, PXB, PHB, SYS"):
        spec.read(value, origin=None)


def test_aif_family_settings_in_the_image(tmp_path):
    root, report, _ = run_stage(
        tmp_path, profile_settings("lumi-aif-torch"), aif=True, ofi=False
    )
    env = source_env(root, env={"LD_LIBRARY_PATH": "/base"})
    # No host /opt/cray and no forced GDR; the runscript's default is "none".
    assert "NCCL_NET_GDR_LEVEL" not in env
    assert env[network.GDR_VARIABLE] == ""
    assert env[network.RCCL_TESTS_VARIABLE] == "/usr/libexec/rccl-tests"
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    # The plugin is in a directory the loader searches anyway.
    assert env["LD_LIBRARY_PATH"] == "/base:/opt/rocm/lib"
    assert report.details["search-paths"]["aws-ofi-nccl"] == MULTIARCH
    binds = report.labels["cotainr-lumi.binds"].split(",")
    assert "/opt/cray" not in binds and "/usr/lib64/libcxi.so.1" not in binds
    assert {"/pfs", "/scratch", "/projappl", "/var/spool/slurmd"} <= set(binds)
    record = json.loads((root / RUNTIME_FILE.lstrip("/")).read_text())
    assert record["libfabric"] == "image"
    assert record["nccl-net-gdr-level"] is None
    assert record["net-plugin"] == {
        "generation": "aws-ofi-nccl",
        "dir": MULTIARCH,
        "files": ["libnccl-net.so"],
    }
    assert record["rccl-tests-found"] is True
    assert report.labels["cotainr-lumi.runtime"] == RUNTIME_FILE
    assert report.details["runtime"] == record


def test_rccl_tests_the_image_lacks_are_said(tmp_path, caplog):
    _, report, _ = run_stage(tmp_path, profile_settings("lumi-aif-torch"), ofi=False)
    assert report.details["runtime"]["rccl-tests-found"] is False
    assert "rccl-tests are in /usr/libexec/rccl-tests" in caplog.text


def test_2024_family_keeps_its_settings(tmp_path):
    settings = profile_settings("lumi-g-ext")
    root, report, _ = run_stage(tmp_path, settings)
    env = source_env(root, env={"LD_LIBRARY_PATH": "/base"})
    assert env[network.GDR_VARIABLE] == "3"
    assert env["LD_LIBRARY_PATH"] == "/base:/opt/rocm/lib:/opt/aws-ofi-rccl"
    record = json.loads((root / RUNTIME_FILE.lstrip("/")).read_text())
    assert record["libfabric"] == "host"
    assert record["net-plugin"]["generation"] == "aws-ofi-rccl"
    assert "/opt/cray" in report.labels["cotainr-lumi.binds"].split(",")


def test_the_plan_says_where_the_plugin_is_and_the_gdr_default():
    for name, gdr in (
        ("lumi-aif-torch", "leaves NCCL_NET_GDR_LEVEL to RCCL"),
        ("lumi-g-ext", "NCCL_NET_GDR_LEVEL=3 unless you set it"),
    ):
        stage = LumiEnvStage(settings=profile_settings(name))
        lines = "\n".join(network.describe_lines(settings=stage.settings))
        assert gdr in lines


def test_a_2024_system_on_an_ai_factory_base_says_which_system_fits(tmp_path, caplog):
    root, report, _ = run_stage(
        tmp_path, profile_settings("lumi-g-ext"), aif=True, ofi=False
    )
    assert "aws-ofi-nccl" not in report.details["search-paths"]
    assert "has aws-ofi-nccl in /usr/lib/x86_64-linux-gnu" in caplog.text
    assert "--system=lumi-aif-torch" in caplog.text
    caplog.clear()
    run_stage(tmp_path / "b", profile_settings("lumi-aif-torch"), ofi=True)
    assert "--system=lumi-g-ext" in caplog.text
