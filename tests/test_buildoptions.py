"""The cotainr-lumi options of ``cotainr build`` (cotainr_lumi/buildoptions.py)."""

import pytest

from cotainr_lumi import buildoptions
from cotainr_lumi.errors import InputError


def test_set_merges_into_the_options_settings_key_by_key():
    settings = buildoptions.stage_settings(
        set_settings=["lumi-env.env={RCCL_DEBUG: null}", "prune.strict=true"],
        options={"lumi_env_set": ["A=1"]},
    )
    assert settings["lumi-env"] == {"env": {"A": "1", "RCCL_DEBUG": None}}
    assert settings["prune"] == {"strict": True}


def test_a_key_inside_a_setting_is_one_error_naming_the_whole_mapping():
    with pytest.raises(InputError) as info:
        buildoptions.stage_settings(
            set_settings=["lumi-env.mpi-host.libmpi=/x/libmpi.so.12"],
            options={},
        )
    assert str(info.value) == (
        "--set 'lumi-env.mpi-host.libmpi=/x/libmpi.so.12': lumi-env.mpi-host is set "
        "as a whole; give --set 'lumi-env.mpi-host={libmpi: VALUE, ...}' with its "
        "other keys"
    )


def test_env_options_become_lumi_env_settings():
    settings = buildoptions.option_settings({"lumi_env_set": ["A=1", "B=x=y", "C="]})
    assert settings == {"lumi-env": {"env": {"A": "1", "B": "x=y", "C": ""}}}
    assert buildoptions.option_settings({"lumi_env_set": []}) == {}
    for bad in (["NOEQUALS"], ["PATH=/x"], ["1X=2"]):
        with pytest.raises(InputError, match="--env"):
            buildoptions.option_settings({"lumi_env_set": bad})
