import artefacts
import pytest
import yaml

from cotainr_lumi.pipeline.profiles import PACKAGED_PROFILE
from cotainr_lumi.verify.expectedenv import (
    DEFAULT_SYSTEM,
    expected_env,
)


def test_the_defaults_are_the_packaged_profile_values():
    data = yaml.safe_load(PACKAGED_PROFILE.read_text())
    written = data["systems"][DEFAULT_SYSTEM]["settings"]["lumi-env"]["env"]
    assert expected_env(system_name=None) == {k: str(v) for k, v in written.items()}
    # The settings of the hand-built images, as AMD's recipes wrote them.
    expected = expected_env(system_name=None)
    cxi = artefacts.load("amd-aws-ofi-rccl-cxi-env")
    for name, value in cxi.facts["env"].items():
        assert expected[name] == value, cxi.source.cite()
    # systems.yaml cites where those lines really were.
    assert cxi.facts["removed-by"][:7] in PACKAGED_PROFILE.read_text()
    network = artefacts.load("amd-lumi-containers-network-2025").facts["env"]
    assert expected["NCCL_SOCKET_IFNAME"] == network["NCCL_SOCKET_IFNAME"]
    assert expected["FI_MR_CACHE_MONITOR"] == network["FI_MR_CACHE_MONITOR"]


def test_user_files_do_not_change_the_defaults(isolated_config):
    user = isolated_config / "cotainr-lumi" / "systems.yaml"
    user.parent.mkdir()
    user.write_text(
        f"systems:\n  {DEFAULT_SYSTEM}:\n    settings:\n"
        "      lumi-env: {env: {CXI_FORK_SAFE: '7'}}\n"
    )
    assert expected_env(system_name=None)["CXI_FORK_SAFE"] == "1"
    assert expected_env(system_name=DEFAULT_SYSTEM)["CXI_FORK_SAFE"] == "7"


@pytest.mark.parametrize("name", [None, "", "not-a-profile-system"])
def test_no_or_unknown_system_expects_the_defaults(name):
    assert expected_env(system_name=name) == expected_env(system_name=None)


def test_a_system_adds_changes_and_removes_values(tmp_path, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text(
        "systems:\n"
        "  mine:\n"
        f"    extends: {DEFAULT_SYSTEM}\n"
        "    settings:\n"
        "      lumi-env:\n"
        "        env: {HOSTILE: 3, CXI_FORK_SAFE_HP: '2', RCCL_DEBUG: null}\n"
        "  no-lumi-env:\n"
        f"    extends: {DEFAULT_SYSTEM}\n"
        "    stages: [provenance]\n"
        "    settings:\n"
        "      lumi-env: {env: {CXI_FORK_SAFE: '9'}}\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(site))
    expected = expected_env(system_name="mine")
    assert expected["HOSTILE"] == "3" and expected["CXI_FORK_SAFE_HP"] == "2"
    assert "RCCL_DEBUG" not in expected
    assert expected["CXI_FORK_SAFE"] == expected_env(system_name=None)["CXI_FORK_SAFE"]
    # Settings of a stage the system does not run are not in its images.
    assert expected_env(system_name="no-lumi-env") == expected_env(system_name=None)


def test_unreadable_profiles_expect_the_defaults(tmp_path, monkeypatch):
    broken = tmp_path / "broken.yaml"
    broken.write_text("systems: [not, a, mapping]\n")
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(broken))
    assert expected_env(system_name="anything") == expected_env(system_name=None)
