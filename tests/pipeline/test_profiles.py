import artefacts
import pytest

from cotainr_lumi.errors import ProfileError, UnknownSystemError
from cotainr_lumi.pipeline import profiles


def write(path, text):
    path.write_text(text)
    return path


def test_the_packaged_systems_are_lusts_current_cotainr_systems():
    # LUST's cotainr 2025.7.1 module: lumi-g, rocm-6.2, rocm-6.4 (no rocm-6.1).
    lust = artefacts.load("lust-cotainr-2025.7.1")
    systems = profiles.load_systems(
        files=[profiles.PACKAGED_PROFILE], include_stock=False
    )
    for ours, theirs in (
        ("lumi-g-ext", "lumi-g"),
        ("lumi-g-ext-rocm-6.2", "rocm-6.2"),
        ("lumi-g-ext-rocm-6.4", "rocm-6.4"),
    ):
        want = lust.facts["systems"][theirs]["base-image"]
        assert systems[ours].base_image == want, lust.source.cite()
        assert systems[ours].site_base.name == theirs
    assert (
        "lumi-g-ext-rocm-6.1" not in systems and "rocm-6.1" not in lust.facts["systems"]
    )
    ext = systems["lumi-g-ext"]
    # The AI Factory mpich image's family: its own libfabric, no venv, no
    # host MPI binding; a --conda-env goes into cotainr's conda env.
    assert ext.rocm_version == "6.4" and ext.stages[-1] == "provenance"
    assert ext.stage_settings("lumi-env")["libfabric"] == "image"
    assert ext.stage_settings("lumi-env")["mpi-host"]["libmpi"] is None
    assert ext.stage_settings("target-env")["prefix"] is None
    rocm62 = systems["lumi-g-ext-rocm-6.2"]
    assert rocm62.rocm_version == "6.2"
    assert rocm62.stage_settings("lumi-env")["libfabric"] == "auto"
    assert "--system=lumi-g-ext-rocm-6.2" in systems.removed["lumi-g-ext-rocm-6.1"]
    # lumi-env.mpi-host is read once, typed: no binding, or LUST's discovery.
    assert ext.mpi_host is None
    assert rocm62.mpi_host.libmpi == "discover" and rocm62.mpi_host.discover
    assert "/opt/cray/pe/lib64" in rocm62.mpi_host.ld_library_path


def test_a_removed_system_is_one_error_naming_the_replacement():
    with pytest.raises(UnknownSystemError) as info:
        profiles.get_system(name="lumi-g-ext-rocm-6.0")
    text = str(info.value)
    assert text.startswith("System 'lumi-g-ext-rocm-6.0' was removed: ROCm 6.0.3")
    assert "--system=lumi-g-ext-rocm-6.2" in text and info.value.exit_code == 2


def test_removed_drops_a_system_and_null_defines_it_again(tmp_path):
    site = write(
        tmp_path / "site.yaml",
        "removed: {lumi-g-ext-rocm-6.4: 'use lumi-g-ext'}\n",
    )
    systems = profiles.load_systems(
        files=[profiles.PACKAGED_PROFILE, site], include_stock=False
    )
    assert "lumi-g-ext-rocm-6.4" not in systems
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
    assert ext.rocm_version == "6.4"  # untouched keys kept (merge, not replace)
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
    assert "lumi-g-ext" in str(info.value) and "lumi-g-ext-rocm-6.2" in str(info.value)
    assert "lumi-g-ext" in info.value.available


def test_non_utf8_profile_names_the_file(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("systems:\n  caf\xe9: {}\n".encode("latin-1"))
    with pytest.raises(ProfileError, match="not UTF-8 text") as info:
        profiles.load_systems(files=[f], include_stock=False)
    assert str(f) in str(info.value)


# -- LUST's systems.json: lumi-g-ext follows the site's lumi-g (issue 37) ------


def test_without_lusts_module_the_built_in_defaults_say_so():
    systems = profiles.load_systems()
    site = systems["lumi-g-ext"].site_base
    assert site.site_file is None and site.site is None
    assert site.origin().startswith("built-in default (no $EBROOTCOTAINR/systems.json")
    assert systems["lumi-aif-torch"].site_base is None  # follows nothing


def test_lumi_g_ext_follows_the_lumi_g_of_lusts_systems_json(
    tmp_path, lust_cotainr_module, monkeypatch
):
    # The older module (2025.03.0): its lumi-g is the ROCm 6.0.3 image, it has
    # rocm-6.2 but no rocm-6.4.
    path = lust_cotainr_module("lust-cotainr-2025.03.0")
    lust = artefacts.load("lust-cotainr-2025.03.0").facts["systems"]
    systems = profiles.load_systems()
    ext, rocm62, rocm64 = (
        systems[n] for n in ("lumi-g-ext", "lumi-g-ext-rocm-6.2", "lumi-g-ext-rocm-6.4")
    )
    assert ext.base_image == lust["lumi-g"]["base-image"]
    assert ext.site_base.origin() == f"lumi-g of {path}"
    assert ext.site_base.default != ext.base_image  # the built-in one, kept
    assert rocm62.base_image == lust["rocm-6.2"]["base-image"]
    assert rocm64.base_image == rocm64.site_base.default
    assert rocm64.site_base.origin() == f"built-in default ({path} has no rocm-6.4)"
    # A system extending a follower inherits the followed base.
    mine = write(tmp_path / "mine.yaml", "systems:\n  mine:\n    extends: lumi-g-ext\n")
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(mine))
    assert profiles.load_systems()["mine"].base_image == lust["lumi-g"]["base-image"]


def test_a_profile_file_setting_base_image_wins_over_lusts_file(
    tmp_path, lust_cotainr_module, monkeypatch
):
    lust_cotainr_module("lust-cotainr-2025.03.0")
    site = write(
        tmp_path / "site.yaml", "systems:\n  lumi-g-ext:\n    base-image: /mine.sif\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(site))
    ext = profiles.load_systems()["lumi-g-ext"]
    assert ext.base_image == "/mine.sif" and ext.site_base is None


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", '{"lumi-g": {"base-image": 3}}', '{"lumi-g": "x"}', "{not json"],
)
def test_a_broken_lust_systems_json_is_one_error_naming_it(tmp_path, monkeypatch, text):
    (tmp_path / "systems.json").write_text(text)
    monkeypatch.setenv("EBROOTCOTAINR", str(tmp_path))
    with pytest.raises(ProfileError, match="systems.json") as info:
        profiles.load_systems()
    assert str(tmp_path / "systems.json") in str(info.value)


def test_follows_must_name_a_system(tmp_path):
    bad = write(
        tmp_path / "bad.yaml", "systems:\n  s:\n    base-image: x.sif\n    follows: 3\n"
    )
    with pytest.raises(ProfileError, match="must name a system of LUST's"):
        profiles.load_systems(files=[bad], include_stock=False)
