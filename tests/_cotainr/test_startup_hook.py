"""The start-up hook that loads cotainr plugins into the stock ``cotainr`` command."""

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
COTAINR = Path(sys.executable).parent / "cotainr"


def run(argv, **env):
    full_env = {k: v for k, v in os.environ.items() if k not in hook.DISABLE_ENV_VARS}
    full_env.update(env)
    return subprocess.run(
        argv, capture_output=True, text=True, env=full_env, check=False
    )


def test_installed_hook_is_this_source():
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert (purelib / "_cotainr_plugins_hook.py").read_text() == SOURCE.read_text()
    assert (
        purelib / "cotainr-plugins-hook.pth"
    ).read_text().strip() == "import _cotainr_plugins_hook"


def test_cotainr_build_gets_the_plugin_and_info_does_not():
    out = run([str(COTAINR), "build", "--help"])
    assert out.returncode == 0 and out.stderr == ""
    assert "lumi plugin:" in out.stdout and "--pip-steps" in out.stdout
    out = run([str(COTAINR), "info"])  # as on a cotainr with plugin discovery
    assert out.returncode == 0 and "lumi-g-ext" not in out.stdout
    assert hook.wanted(["/x/cotainr", "build"], {})
    assert not hook.wanted(["/x/cotainr", "info"], {})


@pytest.mark.parametrize("variable", hook.DISABLE_ENV_VARS)
def test_disable_env_var_leaves_cotainr_stock(variable):
    out = run([str(COTAINR), "build", "--help"], **{variable: "1"})
    assert out.returncode == 0 and "lumi plugin" not in out.stdout


def test_other_processes_importing_cotainr_are_left_alone():
    code = (
        "import sys, cotainr.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('cotainr_lumi')))"
    )
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0 and out.stdout.strip() == "[]"


def test_programs_not_importing_cotainr_import_nothing_of_it():
    code = "import sys; print(sorted(m for m in sys.modules if 'cotainr' in m))"
    out = run([sys.executable, "-c", code])
    assert out.stdout.strip() == "['_cotainr_plugins_hook']"


@pytest.mark.parametrize(
    "argv, env, wanted",
    [
        (["/venv/bin/cotainr", "build"], {}, True),
        (["cotainr", "build"], {"COTAINR_DISABLE_PLUGINS": "0"}, True),
        (["cotainr", "build"], {"COTAINR_LUMI_DISABLE": "1"}, False),
        (["cotainr", "info"], {}, False),
        (["cotainr"], {}, False),
        (["/venv/bin/cotainr-lumi"], {}, False),
        (["-c"], {}, False),
        ([], {}, False),
        (None, {}, False),
    ],
)
def test_hook_acts_only_in_the_cotainr_command(argv, env, wanted):
    assert hook.wanted(argv, env) is wanted


def test_failing_plugin_leaves_cotainr_with_one_warning(mocker, capsys):
    def boom():
        raise RuntimeError("kaputt")

    ep = types.SimpleNamespace(name="fake", load=boom)
    mocker.patch("importlib.metadata.entry_points", return_value=[ep])
    mocker.patch("importlib.util.find_spec", return_value=None)
    hook.load_plugins()
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "kaputt" in err and "stock cotainr" in err


@pytest.mark.parametrize("has_hook", [True, False])
def test_hook_does_nothing_where_cotainr_has_the_build_hook(mocker, has_hook):
    entry_points = mocker.patch("importlib.metadata.entry_points", return_value=[])
    mocker.patch("importlib.util.find_spec", return_value=object())
    plugins = types.SimpleNamespace(**({"HOOK_API_VERSION": 1} if has_hook else {}))
    mocker.patch("importlib.import_module", return_value=plugins)
    hook.load_plugins()
    # A cotainr with plugin discovery but no hook still gets the shim early.
    assert entry_points.called is not has_hook


def test_native_flag_matches_the_installed_cotainr():
    import importlib

    try:
        plugins = importlib.import_module("cotainr.plugins")
    except ImportError:
        plugins = None
    assert _cotainr.NATIVE == hasattr(plugins, "HOOK_API_VERSION")


def test_the_shim_refuses_to_write_through_a_base_images_links(tmp_path):
    """The labels go into the sandbox, never through a link of the base image."""
    from cotainr_lumi._cotainr import shim

    host = tmp_path / "host-dir"
    host.mkdir()
    sandbox_dir = tmp_path / "sandbox"
    sandbox_dir.mkdir()
    (sandbox_dir / ".singularity.d").symlink_to(host)
    with pytest.raises(shim.PluginError, match=r"/\.singularity\.d is a symbolic"):
        shim.host_path(sandbox_dir, "/.singularity.d/labels.json")
    assert list(host.iterdir()) == []
    (sandbox_dir / ".singularity.d").unlink()
    found = shim.host_path(sandbox_dir, "/.singularity.d/labels.json")
    assert found == sandbox_dir / ".singularity.d/labels.json"
