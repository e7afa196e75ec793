"""Bad and hostile input reaching the front ends: one clear error at dry-run time.

Each test drives the ``cotainr build ... --dry-run`` command line (or the
``info``/``verify`` subcommands) with one bad input and checks for a single
``cotainr: error:`` line that says what is wrong and where, and a non-zero
exit, before anything is built.
"""

import sys

import cotainr.cli as stock_cli
import pytest

import cotainr_lumi
from cotainr_lumi import cli
from cotainr_lumi.errors import CotainrLumiError


@pytest.fixture
def env_profile(tmp_path, base_image, monkeypatch):
    """A system 'env-test' running the pip and lumi-env stages."""
    path = tmp_path / "systems.yaml"
    path.write_text(
        "systems:\n"
        "  env-test:\n"
        "    extends: lumi-g-ext\n"
        f"    base-image: {base_image}\n"
        "    stages: [pip, lumi-env, provenance]\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    return path


def dry_run(mocker, capsys, tmp_path, *args):
    """Run ``cotainr build X.sif --system=env-test --dry-run ARGS``; return (code, stderr)."""
    mocker.patch.object(stock_cli.CotainrCLI, "_subcommands", [cli.Build, cli.Info])
    argv = ["cotainr", "build", str(tmp_path / "x.sif"), "--system=env-test"]
    mocker.patch.object(sys, "argv", [*argv, "--dry-run", *args])
    try:
        stock_cli.main()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    return code, capsys.readouterr().err


def one_error(err, *needles):
    """The stderr holds exactly one error line mentioning every needle."""
    assert err.startswith("cotainr: error:"), err
    assert err.count("cotainr: error:") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


# ---------------------------------------------------------------- finding 1
@pytest.mark.parametrize("name", ["X\n", "X\n\n", "PATH\n", "BASH_ENV\n"])
def test_env_name_with_trailing_newline_is_rejected_by_env_option(
    mocker, capsys, tmp_path, env_profile, name
):
    code, err = dry_run(mocker, capsys, tmp_path, "--env", f"{name}=v")
    assert code != 0
    one_error(err, "not a valid environment variable name")


def test_env_name_with_trailing_newline_is_rejected_by_set(
    mocker, capsys, tmp_path, env_profile
):
    code, err = dry_run(mocker, capsys, tmp_path, "--set", 'lumi-env.env={"X\\n": v}')
    assert code != 0
    one_error(err, "not a valid environment variable name")


def test_env_name_with_trailing_newline_is_rejected_by_unset_env(
    mocker, capsys, tmp_path, env_profile
):
    code, err = dry_run(mocker, capsys, tmp_path, "--unset-env", "X\n")
    assert code != 0
    one_error(err, "not a valid environment variable name")


def test_env_name_with_trailing_newline_is_rejected_in_a_profile(
    mocker, capsys, tmp_path, env_profile
):
    with env_profile.open("a") as f:
        f.write('    settings:\n      lumi-env:\n        env: {"X\\n": v}\n')
    code, err = dry_run(mocker, capsys, tmp_path)
    assert code != 0
    one_error(err, "not a valid environment variable name")


def test_env_name_with_trailing_newline_is_rejected_in_a_pip_step(
    mocker, capsys, tmp_path, env_profile
):
    steps = tmp_path / "steps.yml"
    steps.write_text('steps:\n  - packages: [x]\n    env: {"X\\n": "1"}\n')
    code, err = dry_run(mocker, capsys, tmp_path, "--pip-steps", str(steps))
    assert code != 0
    one_error(err, "is not a variable name", str(steps))


# ---------------------------------------------------------------- finding 4
def test_non_utf8_env_value_is_rejected_at_dry_run(
    mocker, capsys, tmp_path, env_profile
):
    value = b"\xff".decode("utf-8", "surrogateescape")  # how Python sees argv
    code, err = dry_run(mocker, capsys, tmp_path, "--env", f"V={value}")
    assert code != 0
    one_error(err, "V", "not valid UTF-8")


def test_non_utf8_pip_step_env_value_is_rejected_by_the_api_plan(tmp_path, env_profile):
    # The command line's YAML parser already refuses such a value; the API
    # takes settings as Python objects.
    value = b"\xff".decode("utf-8", "surrogateescape")
    settings = {"pip": {"steps": [{"packages": ["x"], "env": {"V": value}}]}}
    with pytest.raises(CotainrLumiError, match="not valid UTF-8"):
        cotainr_lumi.plan(
            image_path=tmp_path / "x.sif", system="env-test", settings=settings
        )
