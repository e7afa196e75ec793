"""The generic start-up hook (``_cotainr_plugins_hook``)."""

import os
from pathlib import Path
import subprocess
import sys
import sysconfig
import types

import pytest

from cotainr_lumi import _cotainr
from cotainr_lumi._cotainr._startup import _cotainr_plugins_hook as hook

SOURCE = Path(hook.__file__)


def python(code, **env):
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COTAINR_LUMI_DISABLE", "COTAINR_DISABLE_PLUGINS")
    }
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        check=True,
    )


def test_installed_hook_is_this_source():
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert (purelib / "_cotainr_plugins_hook.py").read_text() == SOURCE.read_text()
    assert (
        purelib / "cotainr-plugins-hook.pth"
    ).read_text().strip() == "import _cotainr_plugins_hook"


def test_hook_patches_cotainr_cli_when_imported():
    out = python(
        "import cotainr.cli as c; print(sorted({k.__module__ for k in c.CotainrCLI._subcommands}))"
    )
    if _cotainr.has_build_stage_seam():
        # cotainr loads its plugins itself: the hook leaves cotainr.cli alone.
        assert out.stdout.strip() == "['cotainr.cli']"
    else:
        assert out.stdout.strip() == "['cotainr.cli', 'cotainr_lumi._cotainr.backport']"
    assert out.stderr == ""


def test_stock_command_loads_cotainr_lumi_once():
    out = python(
        "import cotainr.cli as c, cotainr.util as u\n"
        "for _ in range(3):\n"
        "    try: c.CotainrCLI(args=['--version'])\n"
        "    except SystemExit: pass\n"
        "print(sorted(u.get_systems()))\n"
        "import argparse; p = argparse.ArgumentParser()\n"
        "[s for s in c.CotainrCLI._subcommands if s.__name__ == 'Build'][0]"
        ".add_arguments(parser=p)\n"
        "print(sum(a.dest == 'set_settings' for a in p._actions))"
    )
    systems, set_options = out.stdout.strip().splitlines()[-2:]
    # cotainr's get_systems() includes the plugin's systems: natively with
    # the series, through the backport without it.
    assert "lumi-g-ext" in systems
    assert set_options == "1"
    assert out.stderr == ""


@pytest.mark.parametrize(
    "variable", ["COTAINR_LUMI_DISABLE", "COTAINR_DISABLE_PLUGINS"]
)
def test_disable_env_var_leaves_cotainr_stock(variable):
    out = python(
        "import cotainr.cli as c; print(sorted({k.__module__ for k in c.CotainrCLI._subcommands}))",
        **{variable: "1"},
    )
    assert out.stdout.strip() == "['cotainr.cli']"


def test_programs_not_importing_cotainr_import_nothing_of_it():
    out = python(
        "import sys, json; print(json.dumps(sorted(m for m in sys.modules if 'cotainr' in m)))"
    )
    assert out.stdout.strip() == '["_cotainr_plugins_hook"]'


def test_hook_is_one_shot_and_only_matches_cotainr_cli():
    finder = hook._CotainrCliFinder()
    assert finder.find_spec("json") is None
    assert finder.find_spec("cotainr") is None


class FakeDist:
    def __init__(self, requires):
        self.requires = requires
        self.version = "9.9"
        self.metadata = {"Name": "fake-plugin"}


def fake_entry_point(requires, activate):
    return types.SimpleNamespace(
        name="fake", dist=FakeDist(requires), load=lambda: activate
    )


def test_plugin_outside_cotainr_range_is_skipped_with_one_warning(mocker, capsys):
    called = []
    ep = fake_entry_point(["cotainr<2000", "PyYAML"], called.append)
    mocker.patch("importlib.metadata.entry_points", return_value=[ep])
    assert hook.load_plugins("cli-module") == []
    assert called == []
    err = capsys.readouterr().err
    assert (
        err.count("WARNING") == 1 and "cotainr<2000" in err and "stock cotainr" in err
    )


def test_plugin_inside_range_is_activated_with_cli_module(mocker, capsys):
    called = []
    ep = fake_entry_point(
        ["cotainr>=2025.3.0", "extra-thing; extra == 'test'"], called.append
    )
    mocker.patch("importlib.metadata.entry_points", return_value=[ep])
    assert hook.load_plugins("cli-module") == ["fake"]
    assert called == ["cli-module"]
    assert capsys.readouterr().err == ""


def test_failing_plugin_leaves_cotainr_with_one_warning(mocker, capsys):
    def boom(module):
        raise RuntimeError("kaputt")

    mocker.patch(
        "importlib.metadata.entry_points", return_value=[fake_entry_point([], boom)]
    )
    assert hook.load_plugins("cli-module") == []
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "kaputt" in err


@pytest.mark.parametrize(
    "value, installed", [("1", False), ("yes", False), ("0", True), ("", True)]
)
def test_install_respects_disable_variable(monkeypatch, value, installed):
    monkeypatch.setenv("COTAINR_LUMI_DISABLE", value)
    monkeypatch.setattr(
        sys,
        "meta_path",
        [m for m in sys.meta_path if not isinstance(m, hook._CotainrCliFinder)],
    )
    monkeypatch.delitem(sys.modules, "cotainr.cli", raising=False)
    assert hook.install() is installed
    hook.uninstall()


def test_unsupported_cotainr_version_is_refused_by_the_plugin(mocker):
    from cotainr_lumi import plugin
    from cotainr_lumi.errors import UnsupportedCotainrError

    mocker.patch("cotainr_lumi._cotainr.cotainr_version", return_value="2024.10.0")
    # The version matters on the fallback path only.
    mocker.patch.object(_cotainr, "has_build_stage_seam", return_value=False)
    module = types.SimpleNamespace()
    with pytest.raises(UnsupportedCotainrError, match="2024.10.0"):
        plugin.on_stock_cotainr(module)
    assert vars(module) == {}


@pytest.mark.parametrize(
    "variable", ["COTAINR_DISABLE_PLUGINS", "COTAINR_LUMI_DISABLE"]
)
def test_lumi_system_with_plugins_off_is_one_clear_error(tmp_path, variable):
    """Stock cotainr runs, and a plugin's system is one line, not a KeyError."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COTAINR_LUMI_DISABLE", "COTAINR_DISABLE_PLUGINS")
    }
    env[variable] = "1"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv = ['cotainr', 'build', 'x.sif', '--system', "
            "'lumi-g-ext']\nimport cotainr.cli as c\nc.main()",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    if "argument --system" in out.stderr:
        # A cotainr that checks --system while parsing (upstream patch 0001)
        # says so in its own usage error; the hook adds why.
        assert len(errors) == 1 and "'lumi-g-ext'" in errors[0]
        assert out.stderr.splitlines()[-1].startswith("cotainr: note: cotainr plugins")
    else:
        assert out.stderr.count("\n") == 1
        assert "unknown system 'lumi-g-ext'" in out.stderr
    assert "turned off" in out.stderr and not list(tmp_path.iterdir())
