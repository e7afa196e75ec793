"""The checked contract of the backport with a stock cotainr (its behaviour)."""

import subprocess
import sys
import types

from packaging.version import Version
import pytest

from cotainr_lumi import _cotainr, plugin
from cotainr_lumi._cotainr import contract
from cotainr_lumi._cotainr._startup import _cotainr_plugins_hook as hook
from cotainr_lumi.errors import UnsupportedCotainrError

SEAM = _cotainr.has_build_stage_seam()


@pytest.mark.parametrize("assumption", contract.ASSUMPTIONS, ids=lambda a: a.name)
def test_assumption_holds_or_the_seam_is_used(assumption):
    reason = assumption.check()
    if SEAM:
        # With the public seam the fallback path and its assumptions are unused.
        assert _cotainr.check_cotainr_version() == "seam"
    else:
        assert reason is None, (
            f"{assumption.name}: {reason} (used for: {assumption.why})"
        )


def test_installed_cotainr_is_usable():
    assert _cotainr.check_cotainr_version() == ("seam" if SEAM else "fallback")


def test_conda_prefix_follows_the_release():
    old = Version(_cotainr.cotainr_version()) < Version("2025.7.0")
    expected = "/opt/conda" if old else "/opt/cotainr/conda"
    assert contract.conda_prefix() == expected == _cotainr.CONDA_PREFIX


def test_stock_build_is_probed_by_running_it():
    """The probe runs cotainr's Build.execute with recording stand-ins."""
    probe = contract.probe_stock_build()
    if _cotainr.has_build_stage_seam():
        # cotainr runs the stages itself and hands them the conda env in
        # their context: the backport's contract is not consulted, and a
        # cotainr-lumi that cannot probe still works.
        assert _cotainr.check_cotainr_version() == "seam"
        assert probe.error is not None and not probe.calls
        assert _cotainr.CONDA_ENV_NAME == "conda_container_env"
        return
    assert probe.error is None
    assert probe.calls.index("conda") < probe.calls.index("add_metadata")
    assert probe.calls.index("add_metadata") < probe.calls.index("build_image")
    assert probe.conda_env_name == _cotainr.CONDA_ENV_NAME == "conda_container_env"
    assert probe.activation == ["conda activate conda_container_env"]


def test_a_build_that_images_before_its_metadata_breaks_the_contract(mocker):
    """Behaviour, not source text: a reordered execute() is caught."""

    def reordered(build):
        from cotainr import container

        with container.SingularitySandbox(
            base_image=build.base_image, log_settings=None
        ) as sandbox:
            sandbox.build_image(path=build.image_path)
            sandbox.add_metadata()

    contract.probe_stock_build.cache_clear()
    mocker.patch("cotainr.cli.Build.execute", reordered)
    try:
        reasons = dict((a.name, r) for a, r in contract.broken_assumptions())
    finally:
        contract.probe_stock_build.cache_clear()
    (order,) = [r for n, r in reasons.items() if "in this order" in n]
    assert "expected the order" in order
    assert any("conda" in n for n in reasons)


def test_broken_assumption_disables_cotainr_lumi_naming_it(mocker):
    mocker.patch.object(_cotainr, "has_build_stage_seam", return_value=False)
    broken = contract.Assumption(
        "cotainr.cli.Info._check_systems", "listing systems", lambda: "is missing"
    )
    mocker.patch.object(contract, "ASSUMPTIONS", (broken,))
    module = types.SimpleNamespace()
    with pytest.raises(UnsupportedCotainrError) as info:
        plugin.on_stock_cotainr(module)
    message = str(info.value)
    assert "cotainr-lumi is disabled" in message
    assert "cotainr.cli.Info._check_systems (is missing)" in message
    assert "Stock cotainr works unchanged" in message
    assert vars(module) == {}


def test_check_that_raises_counts_as_broken(mocker):
    def explode():
        raise AttributeError("gone")

    mocker.patch.object(
        contract, "ASSUMPTIONS", (contract.Assumption("x.y", "z", explode),)
    )
    ((assumption, reason),) = contract.broken_assumptions()
    assert assumption.name == "x.y" and reason == "AttributeError: gone"


def test_disabled_plugin_warns_once_and_stock_cotainr_runs(mocker, capsys):
    """The start-up hook's path: one warning, cotainr's own subcommands kept."""
    mocker.patch.object(_cotainr, "has_build_stage_seam", return_value=False)
    mocker.patch.object(
        contract,
        "ASSUMPTIONS",
        (contract.Assumption("cotainr.util.systems_file", "x", lambda: "is missing"),),
    )
    import cotainr.cli

    stock = list(cotainr.cli.CotainrCLI._subcommands)
    entry_point = types.SimpleNamespace(name="lumi", dist=None, load=lambda: plugin)
    mocker.patch("importlib.metadata.entry_points", return_value=[entry_point])
    mocker.patch.object(hook, "_plugin_fits_cotainr", return_value=None)
    loaded = hook.load_plugins(cotainr.cli)
    err = capsys.readouterr().err
    assert loaded == []
    assert err.count("WARNING") == 1
    assert "cotainr-lumi is disabled" in err and "cotainr.util.systems_file" in err
    assert cotainr.cli.CotainrCLI._subcommands == stock


@pytest.mark.parametrize("raised", ["ValueError", "CalledProcessError"])
def test_failed_sandbox_command_is_a_command_error(raised, mocker, tmp_path):
    """cotainr 2025.7 raises ValueError from CalledProcessError; PR #158 re-raises it."""
    failure = subprocess.CalledProcessError(
        3, ["singularity", "exec"], output="out", stderr="ERROR: boom"
    )

    def run_command_in_container(*, cmd, custom_log_dispatcher=None):
        if raised == "CalledProcessError":
            raise failure
        raise ValueError("Command failed") from failure

    stock = types.SimpleNamespace(
        sandbox_dir=tmp_path, run_command_in_container=run_command_in_container
    )
    sandbox = _cotainr.Sandbox(stock=stock)
    with pytest.raises(_cotainr.CommandError) as info:
        sandbox.run(["pip", "install", "x"])
    assert info.value.cmd == ["pip", "install", "x"]
    assert info.value.returncode == 3
    assert info.value.error_lines() == "ERROR: boom"


def test_other_value_errors_are_not_command_errors(tmp_path):
    def run_command_in_container(*, cmd, custom_log_dispatcher=None):
        raise ValueError("The operation is only valid inside a sandbox context.")

    stock = types.SimpleNamespace(
        sandbox_dir=tmp_path, run_command_in_container=run_command_in_container
    )
    with pytest.raises(ValueError, match="sandbox context"):
        _cotainr.Sandbox(stock=stock).run(["true"])


def test_several_conda_env_files_are_asked_of_cotainrs_own_parser(monkeypatch):
    from cotainr import pack

    # cotainr 2025.7 takes one file; its multi-file branch adds
    # CondaInstall.extend_environment along with nargs="+".
    several = hasattr(pack.CondaInstall, "extend_environment")
    assert _cotainr.takes_several_conda_envs() is several

    class SeveralBuild(contract._cli.Build):
        @classmethod
        def add_arguments(cls, *, parser):
            parser.add_argument("image_path")
            parser.add_argument("--base-image")
            parser.add_argument("--conda-env", nargs="+")

    class OneBuild(SeveralBuild):
        @classmethod
        def add_arguments(cls, *, parser):
            parser.add_argument("image_path")
            parser.add_argument("--base-image")
            parser.add_argument("--conda-env")

    for cls, expected in ((SeveralBuild, True), (OneBuild, False)):
        monkeypatch.setattr(contract._cli, "Build", cls)
        contract.takes_several_conda_envs.cache_clear()
        try:
            assert contract.takes_several_conda_envs() is expected
        finally:
            contract.takes_several_conda_envs.cache_clear()


def test_cotainr_is_imported_only_under_cotainr_lumi_underscore_cotainr():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ast, pathlib, cotainr_lumi as c\n"
            "root = pathlib.Path(c.__file__).parent\n"
            "for f in sorted(root.rglob('*.py')):\n"
            "    if '_cotainr' in f.parts: continue\n"
            "    for n in ast.walk(ast.parse(f.read_text())):\n"
            "        names = [a.name for a in getattr(n, 'names', [])] if isinstance(n, ast.Import) else [getattr(n, 'module', None) or '']\n"
            "        if isinstance(n, (ast.Import, ast.ImportFrom)) and any(x == 'cotainr' or x.startswith('cotainr.') for x in names):\n"
            "            print(f.relative_to(root))\n",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == ""
