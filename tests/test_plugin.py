"""The plugin entry point (cotainr_lumi/plugin.py) as cotainr reads it."""

import pytest

from cotainr_lumi import plugin


def test_systems_and_hook_are_offered(test_profile):
    systems = plugin.systems()
    assert "lumi-test" in systems and "base-image" in systems["lumi-test"]
    assert plugin.build_hook is plugin.HOOK and plugin.HOOK.api_version == 1
    for method in ("add_arguments", "prepare", "customize", "finalize"):
        assert callable(getattr(plugin.build_hook, method))


@pytest.mark.parametrize("value", ["1", "yes"])
def test_cotainr_lumi_disable_offers_nothing_to_a_cotainr_that_loads_it(
    test_profile, monkeypatch, value
):
    """cotainr with plugin discovery loads the plugin whatever the hook does."""
    monkeypatch.setenv("COTAINR_LUMI_DISABLE", value)
    assert plugin.disabled()
    assert plugin.systems() == {} and plugin.build_hook is None
    monkeypatch.setenv("COTAINR_LUMI_DISABLE", "0")
    assert not plugin.disabled() and "lumi-test" in plugin.systems()
    with pytest.raises(AttributeError):
        plugin.no_such_name  # noqa: B018


def test_the_switch_is_the_start_up_hooks():
    from cotainr_lumi._cotainr._startup import _cotainr_plugins_hook as hook

    assert plugin.DISABLE_ENV_VAR in hook.DISABLE_ENV_VARS
