"""The cotainr-lumi options of ``cotainr build`` (cotainr_lumi/buildoptions.py)."""

import argparse

from cotainr_lumi import buildoptions


def test_set_merges_into_the_options_settings_key_by_key():
    settings = buildoptions.stage_settings(
        set_settings=["lumi-env.env={RCCL_DEBUG: null}", "prune.strict=true"],
        stage_args=argparse.Namespace(lumi_env_set=["A=1"]),
    )
    assert settings["lumi-env"] == {"env": {"A": "1", "RCCL_DEBUG": None}}
    assert settings["prune"] == {"strict": True}
