"""The network layer of an image family (stages/lumi_env/network.py) in the stage."""

import json
import subprocess

from elfbuild import plain_lib
from planfakes import stage_context
import pytest
from test_lumi_env_stage import FakeSandbox, make_root, source_env

from cotainr_lumi.imagelayout import RUNTIME_FILE
from cotainr_lumi.pipeline.profiles import PACKAGED_PROFILE, load_systems
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
    stage = LumiEnvStage(settings=settings)
    context = stage_context(sandbox, image_path=tmp_path / "out" / "torch.sif")
    return root, stage.run(context=context), sandbox


def add_aif_plugin(root, name="librccl-net-ofi.so", *, decoy=True):
    """aws-ofi-nccl's ROCm build in the multiarch dir; `decoy`: a libnccl-net.so."""
    lib = root / MULTIARCH.lstrip("/")
    lib.mkdir(parents=True, exist_ok=True)
    (lib / name).write_bytes(b"")
    if decoy:
        (lib / "libnccl-net.so").write_bytes(b"")
    (root / "usr/libexec/rccl-tests").mkdir(parents=True, exist_ok=True)


def test_find_plugin_none_without_plugin_files(tmp_path):
    (tmp_path / "opt/aws-ofi-rccl").mkdir(parents=True)
    (tmp_path / "opt/aws-ofi-rccl/libfabric.so.1").write_bytes(b"")
    assert network.find_plugin(root=tmp_path, dirs=["/opt/aws-ofi-rccl"]) is None


def test_find_plugin_aws_ofi_rccl_loads_by_its_default_name(tmp_path):
    d = tmp_path / "opt/aws-ofi-rccl"
    d.mkdir(parents=True)
    (d / "librccl-net.so.0.0.0").write_bytes(b"")
    (d / "librccl-net.so").symlink_to("librccl-net.so.0.0.0")
    assert network.find_plugin(root=tmp_path, dirs=["/opt/aws-ofi-rccl"]) == {
        "generation": "aws-ofi-rccl",
        "dir": "/opt/aws-ofi-rccl",
        "files": ["librccl-net.so", "librccl-net.so.0.0.0"],
        "loads": True,
        "nccl-net-plugin": None,
    }


def test_find_plugin_aws_ofi_nccl_needs_its_name_and_the_nccl_decoy_loses(tmp_path):
    # The decoy libnccl-net.so is in the first directory: RCCL never loads it.
    add_aif_plugin(tmp_path)
    found = network.find_plugin(root=tmp_path, dirs=[MULTIARCH, "/opt/aws-ofi-rccl"])
    assert found == {
        "generation": "aws-ofi-nccl",
        "dir": MULTIARCH,
        "files": ["libnccl-net.so", "librccl-net-ofi.so"],
        "loads": True,
        "nccl-net-plugin": "ofi",
    }
    # A librccl-net.so link to it loads by default: no name needed.
    (tmp_path / MULTIARCH.lstrip("/") / "librccl-net.so").symlink_to(
        "librccl-net-ofi.so"
    )
    found = network.find_plugin(root=tmp_path, dirs=[MULTIARCH])
    assert (found["generation"], found["nccl-net-plugin"]) == ("aws-ofi-nccl", None)


def test_find_plugin_a_directory_rccl_loads_from_wins_over_an_nccl_only_one(tmp_path):
    lib = tmp_path / "usr/lib"
    lib.mkdir(parents=True)
    (lib / "librccl-net.so").write_bytes(b"")
    add_aif_plugin(tmp_path, "libnccl-net-ofi.so", decoy=False)
    found = network.find_plugin(root=tmp_path, dirs=[MULTIARCH, "/usr/lib"])
    assert (found["dir"], found["generation"]) == ("/usr/lib", "aws-ofi-rccl")
    only = network.find_plugin(root=tmp_path, dirs=[MULTIARCH])
    assert only["generation"] == "nccl" and only["nccl-net-plugin"] is None
    assert only["loads"] is False


def test_find_plugin_takes_the_name_the_profile_sets(tmp_path, caplog):
    add_aif_plugin(tmp_path, decoy=True)
    found = network.find_plugin(root=tmp_path, dirs=[MULTIARCH], named="libnccl-net.so")
    # Named so, RCCL loads NCCL's file: no warning that it loads none.
    assert (found["generation"], found["nccl-net-plugin"]) == ("nccl", None)
    assert found["loads"] is True and network.plugin_name_blocks(plugin=found) == []
    found = network.find_plugin(root=tmp_path, dirs=[MULTIARCH], named="ofi")
    assert (found["generation"], found["nccl-net-plugin"]) == ("aws-ofi-nccl", None)
    assert "will load no network plugin" not in caplog.text


def test_rccl_tries_each_name_in_every_directory_before_the_next_name(tmp_path):
    # NCCL_NET_PLUGIN=ofi: "ofi" nowhere, then librccl-net-ofi.so in either
    # directory; a librccl-net.so in the first directory is not a candidate.
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "librccl-net.so").write_bytes(b"")
    (second / "librccl-net-ofi.so").write_bytes(b"")
    found = network.find_plugin(root=tmp_path, dirs=["/first", "/second"], named="ofi")
    assert (found["dir"], found["generation"], found["loads"]) == (
        "/second",
        "aws-ofi-nccl",
        True,
    )


def test_an_nccl_only_plugin_is_a_warning_and_no_setting(tmp_path, caplog):
    add_aif_plugin(tmp_path, "libnccl-net-ofi.so", decoy=False)
    found = network.find_plugin(root=tmp_path, dirs=[MULTIARCH])
    assert network.plugin_name_blocks(plugin=found) == []
    assert "RCCL will load no network plugin from " + MULTIARCH in caplog.text
    assert "never NCCL's names" in caplog.text


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
    assert report.record["search-paths"]["aws-ofi-nccl"] == MULTIARCH
    # RCCL loads librccl-net-ofi.so only when named; a run-time value wins.
    assert env["NCCL_NET_PLUGIN"] == "ofi"
    assert (
        source_env(root, env={"NCCL_NET_PLUGIN": "mine"})["NCCL_NET_PLUGIN"] == "mine"
    )
    binds = report.labels["cotainr-lumi.binds"].split(",")
    assert "/opt/cray" not in binds and "/usr/lib64/libcxi.so.1" not in binds
    assert {"/pfs", "/scratch", "/projappl", "/var/spool/slurmd"} <= set(binds)
    record = json.loads((root / RUNTIME_FILE.lstrip("/")).read_text())
    assert record["libfabric"] == "image"
    assert record["nccl-net-gdr-level"] is None
    assert record["net-plugin"] == {
        "generation": "aws-ofi-nccl",
        "dir": MULTIARCH,
        "files": ["libnccl-net.so", "librccl-net-ofi.so"],
        "loads": True,
        "nccl-net-plugin": "ofi",
    }
    assert record["rccl-tests-found"] is True
    assert report.labels["cotainr-lumi.runtime"] == RUNTIME_FILE
    assert report.record["runtime"] == record


def test_rccl_tests_the_image_lacks_are_said(tmp_path, caplog):
    _, report, _ = run_stage(tmp_path, profile_settings("lumi-aif-torch"), ofi=False)
    assert report.record["runtime"]["rccl-tests-found"] is False
    assert "rccl-tests are in /usr/libexec/rccl-tests" in caplog.text


def test_2024_family_keeps_its_settings(tmp_path):
    settings = profile_settings("lumi-g-ext-rocm-6.2")
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
        ("lumi-g-ext-rocm-6.2", "NCCL_NET_GDR_LEVEL=3 unless you set it"),
    ):
        stage = LumiEnvStage(settings=profile_settings(name))
        lines = "\n".join(network.describe_lines(settings=stage.settings))
        assert gdr in lines


def test_a_2024_system_on_an_ai_factory_base_says_which_system_fits(tmp_path, caplog):
    root, report, _ = run_stage(
        tmp_path, profile_settings("lumi-g-ext-rocm-6.2"), aif=True, ofi=False
    )
    assert "aws-ofi-nccl" not in report.record["search-paths"]
    assert "has aws-ofi-nccl in /usr/lib/x86_64-linux-gnu" in caplog.text
    assert "--system=lumi-aif-torch" in caplog.text
    caplog.clear()
    run_stage(tmp_path / "b", profile_settings("lumi-aif-torch"), ofi=True)
    assert "--system=lumi-g-ext-rocm-6.2" in caplog.text


def _plugin_needing_libfabric(root, tmp_path, *, fabric_dir=None, runpath=None):
    """aws-ofi-rccl in /opt/aws-ofi-rccl needing libfabric.so.1 (2024/2025 layout)."""
    fabric = plain_lib(tmp_path / "build/libfabric.so.1", soname="libfabric.so.1")
    plugin = root / "opt/aws-ofi-rccl/librccl-net.so"
    plain_lib(plugin, soname="librccl-net.so", needed=[fabric], runpath=runpath)
    if fabric_dir:
        (root / fabric_dir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        fabric.rename(root / fabric_dir.lstrip("/") / "libfabric.so.1")


@pytest.mark.parametrize(
    ("fabric_dir", "runpath", "ld_path", "family"),
    [
        (None, None, "/opt/cray/libfabric/1.15.2.0/lib64", "host"),  # 2024 images
        ("/opt/libfabric/lib", None, "/opt/libfabric/lib:/opt/shs-libcxi/lib", "image"),
        ("/opt/libfabric/lib", "/opt/libfabric/lib", "", "image"),  # its RUNPATH
        ("/opt/libfabric/lib", None, "", "host"),  # in the image, never searched
    ],
)
def test_auto_decides_the_family_from_where_the_plugin_finds_libfabric(
    tmp_path, fabric_dir, runpath, ld_path, family
):
    root = tmp_path / "root"
    _plugin_needing_libfabric(root, tmp_path, fabric_dir=fabric_dir, runpath=runpath)
    settings = LumiEnvSettings.complete(profile_settings("lumi-g-ext-pytorch"))
    assert settings.libfabric == "auto"
    asked = []
    decided = network.decide_libfabric(
        settings=settings, root=root, image_ld_path=lambda: asked.append(1) or ld_path
    )
    assert decided == family and asked == [1]
    # An explicit value wins; no plugin: host, and the image is not asked.
    fixed = LumiEnvSettings.complete({"libfabric": "host"})
    assert network.decide_libfabric(settings=fixed, root=root) == "host"
    none = LumiEnvSettings.complete({"net-plugin-dirs": ["/nowhere"]})
    assert (
        network.decide_libfabric(settings=none, root=root, image_ld_path=None) == "host"
    )


def test_the_image_family_gets_no_host_libfabric_binds(tmp_path):
    settings = profile_settings("lumi-g-ext-pytorch")
    root = make_root(tmp_path, ofi=False)
    _plugin_needing_libfabric(root, tmp_path, fabric_dir="/usr/lib64")
    sandbox = FakeSandbox(root, probe="prefix=/opt/env\nconda_prefix=\nconda_exe=\n")
    report = LumiEnvStage(settings=settings).run(
        context=stage_context(sandbox, image_path=tmp_path / "out" / "torch.sif")
    )
    binds = report.labels["cotainr-lumi.binds"].split(",")
    assert "/opt/cray" not in binds and "/usr/lib64/libcxi.so.1" not in binds
    record = json.loads((root / RUNTIME_FILE.lstrip("/")).read_text())
    assert record["libfabric"] == "image"


@pytest.mark.parametrize("family", ["host", "image"])
def test_the_host_family_finds_the_hosts_newest_libfabric_when_the_images_is_gone(
    tmp_path, family
):
    # LUMI after January 2026: 1.22.0 installed, 1.15.2.0 (which 2024 images
    # name) gone; 1.9.0 sorts after 1.22.0 as text, not as a version.
    cray = tmp_path / "cray"
    for version in ("1.9.0", "1.22.0"):
        (cray / f"libfabric/{version}/lib64").mkdir(parents=True)
        (cray / f"libfabric/{version}/lib64/libfabric.so.1").write_text("")
    (cray / "libfabric/2.0.0/lib64").mkdir(parents=True)  # without the library
    settings = LumiEnvSettings.complete({})
    blocks = network.env_blocks(settings=settings, libfabric=family, cray=str(cray))
    script = "\n".join(blocks) + '\nprintf "%s" "$LD_LIBRARY_PATH"'
    stale = "/opt/cray/libfabric/1.15.2.0/lib64:/opt/rocm/lib"

    def ld_path(value):
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": value}
        proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True)
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        return proc.stdout.decode()

    new = f"{cray}/libfabric/1.22.0/lib64"
    assert ld_path(stale) == (f"{stale}:{new}" if family == "host" else stale)
    # The image's entry is there: it stays the one used.
    kept = f"{cray}/libfabric/1.9.0/lib64:/opt/rocm/lib"
    assert ld_path(kept) == kept
