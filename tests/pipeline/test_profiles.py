import pytest

from cotainr_lumi.errors import ProfileError, UnknownSystemError
from cotainr_lumi.pipeline import profiles


def write(path, text):
    path.write_text(text)
    return path


def test_packaged_profile_defines_lumi_g_ext_and_rocm_variants():
    systems = profiles.load_systems(
        files=[profiles.PACKAGED_PROFILE], include_stock=False
    )
    assert {"lumi-g-ext", "lumi-g-ext-rocm-6.1", "lumi-g-ext-rocm-6.2"} <= set(systems)
    ext = systems["lumi-g-ext"]
    assert ext.rocm_version == "6.2"
    assert ext.base_image.startswith("/appl/local/containers/cotainr-baseimages/")
    assert ext.stages[-1] == "provenance"
    old = systems["lumi-g-ext-rocm-6.1"]
    assert old.rocm_version == "6.1" and "6.1.3" in old.base_image
    # variants inherit the stage list and settings
    assert old.stages == ext.stages and old.settings == ext.settings
    assert "lumi-g-ext-rocm-6.0" not in systems
    assert "rocm-6.1" in systems.removed["lumi-g-ext-rocm-6.0"]


def test_a_removed_system_is_one_error_naming_the_replacement():
    with pytest.raises(UnknownSystemError) as info:
        profiles.get_system(name="lumi-g-ext-rocm-6.0")
    text = str(info.value)
    assert text.startswith("System 'lumi-g-ext-rocm-6.0' was removed: ROCm 6.0.3")
    assert "--system=lumi-g-ext-rocm-6.1" in text and info.value.exit_code == 2


def test_removed_drops_a_system_and_null_defines_it_again(tmp_path):
    site = write(
        tmp_path / "site.yaml",
        "removed: {lumi-g-ext-rocm-6.1: 'use 6.2'}\n",
    )
    systems = profiles.load_systems(
        files=[profiles.PACKAGED_PROFILE, site], include_stock=False
    )
    assert "lumi-g-ext-rocm-6.1" not in systems
    back = write(
        tmp_path / "back.yaml",
        "removed: {lumi-g-ext-rocm-6.0: null}\nsystems:\n  lumi-g-ext-rocm-6.0:"
        "\n    extends: lumi-g-ext\n",
    )
    systems = profiles.load_systems(
        files=[profiles.PACKAGED_PROFILE, back], include_stock=False
    )
    assert "lumi-g-ext-rocm-6.0" in systems
    bad = write(tmp_path / "bad.yaml", "removed: [x]\n")
    with pytest.raises(ProfileError, match="removed.*must map names to a message"):
        profiles.load_systems(files=[bad], include_stock=False)


def test_an_empty_profile_file_defines_nothing(tmp_path):
    empty = write(tmp_path / "empty.yaml", "")
    assert profiles.load_systems(files=[empty], include_stock=False) == {}


def test_user_file_and_env_var_files_override_in_order(
    tmp_path, monkeypatch, isolated_config
):
    user = isolated_config / "cotainr-lumi" / "systems.yaml"
    user.parent.mkdir()
    write(user, "systems:\n  lumi-g-ext:\n    base-image: /home/me/copy.sif\n")
    site = write(
        tmp_path / "site.yaml",
        "systems:\n  lumi-g-ext:\n    description: site text\n  mine:\n    extends: lumi-g-ext\n",
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(site))
    assert profiles.profile_files() == [profiles.PACKAGED_PROFILE, user, site]
    systems = profiles.load_systems()
    ext = systems["lumi-g-ext"]
    assert ext.base_image == "/home/me/copy.sif"  # user override
    assert ext.description == "site text"  # site file read last
    assert ext.rocm_version == "6.2"  # untouched keys kept (merge, not replace)
    assert ext.sources == (str(profiles.PACKAGED_PROFILE), str(user), str(site))
    assert systems["mine"].base_image == "/home/me/copy.sif"


def test_settings_merge_key_by_key(tmp_path):
    a = write(
        tmp_path / "a.yaml",
        "systems:\n  s:\n    base-image: x.sif\n    stages: [provenance]\n    settings:\n      provenance: {hash-base-image: true}\n",
    )
    b = write(
        tmp_path / "b.yaml",
        "systems:\n  s:\n    settings:\n      provenance: {hash-base-image: false}\n",
    )
    system = profiles.load_systems(files=[a, b], include_stock=False)["s"]
    assert system.stage_settings("provenance") == {"hash-base-image": False}


def test_stock_systems_stay_available(mocker):
    mocker.patch(
        "cotainr_lumi._cotainr.stock_systems",
        return_value={"lumi-g": {"base-image": "docker://rocm/x"}},
    )
    systems = profiles.load_systems()
    assert systems["lumi-g"].stock is True
    assert systems["lumi-g"].base_image == "docker://rocm/x"
    assert systems["lumi-g-ext"].stock is False


def test_profile_system_shadows_stock_system_of_same_name(tmp_path, mocker):
    mocker.patch(
        "cotainr_lumi._cotainr.stock_systems",
        return_value={"lumi-g": {"base-image": "docker://rocm/x"}},
    )
    f = write(tmp_path / "p.yaml", "systems:\n  lumi-g:\n    extends: lumi-g-ext\n")
    systems = profiles.load_systems(files=[profiles.PACKAGED_PROFILE, f])
    assert systems["lumi-g"].stock is False


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ("systems:\n  bad:\n    stages: [provenance]\n", "base-image", "required"),
        (
            "systems:\n  bad:\n    base-image: x\n    colour: red\n",
            "colour",
            "unknown key",
        ),
        (
            "systems:\n  bad:\n    base-image: x\n    stages: [nope]\n",
            "stages",
            "unknown stage 'nope'",
        ),
        (
            "systems:\n  bad:\n    base-image: x\n    stages: [provenance, provenance]\n",
            "stages",
            "twice",
        ),
        (
            "systems:\n  bad:\n    base-image: x\n    rocm-version: six\n",
            "rocm-version",
            "major.minor",
        ),
        (
            "systems:\n  bad:\n    base-image: x\n    settings: {provenance: {hash-base-image: maybe}}\n",
            "settings.provenance.hash-base-image",
            "true or false",
        ),
        (
            "systems:\n  bad:\n    base-image: x\n    settings: {provenance: {colour: 1}}\n",
            "settings.provenance.colour",
            "unknown setting",
        ),
        ("systems:\n  bad:\n    extends: ghost\n", "extends", "unknown system 'ghost'"),
    ],
)
def test_bad_profile_names_file_system_and_key(tmp_path, text, key, fragment):
    f = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ProfileError) as info:
        profiles.load_systems(files=[f], include_stock=False)
    message = str(info.value)
    assert str(f) in message and "system 'bad'" in message and f"key '{key}'" in message
    assert fragment in message
    assert info.value.key == key and info.value.system == "bad"


def test_extends_cycle_is_reported(tmp_path):
    f = write(tmp_path / "c.yaml", "systems:\n  a: {extends: b}\n  b: {extends: a}\n")
    with pytest.raises(ProfileError, match="cycle"):
        profiles.load_systems(files=[f], include_stock=False)


def test_invalid_yaml_names_file_and_line(tmp_path):
    f = write(tmp_path / "broken.yaml", "systems:\n  a:\n    base-image: [unclosed\n")
    with pytest.raises(ProfileError) as info:
        profiles.load_systems(files=[f], include_stock=False)
    assert str(f) in str(info.value) and "line" in str(info.value)


def test_env_var_naming_a_missing_file_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(tmp_path / "missing.yaml"))
    with pytest.raises(ProfileError, match="COTAINR_LUMI_SYSTEMS"):
        profiles.profile_files()


def test_unknown_system_lists_available():
    with pytest.raises(UnknownSystemError) as info:
        profiles.get_system(name="no-such")
    assert "no-such" in str(info.value)
    assert "lumi-g-ext" in str(info.value) and "lumi-g-ext-rocm-6.1" in str(info.value)
    assert "lumi-g-ext" in info.value.available


def test_non_utf8_profile_names_the_file(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("systems:\n  caf\xe9: {}\n".encode("latin-1"))
    with pytest.raises(ProfileError, match="not UTF-8 text") as info:
        profiles.load_systems(files=[f], include_stock=False)
    assert str(f) in str(info.value)
