"""Bad and hostile input reaching the front ends: one clear error at dry-run time.

Each test drives the ``cotainr build ... --dry-run`` command line (or the
``info``/``verify`` subcommands) with one bad input and checks for a single
``cotainr-lumi: error:`` line that says what is wrong and where, and a non-zero
exit, before anything is built.
"""

import re
import sys

import cotainr.cli as stock_cli
from errorlines import one_error
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
    """Run ``cotainr-lumi build X.sif --system=env-test --dry-run ARGS``; return (code, stderr).

    The ``cotainr-lumi`` command runs the same options and plan code on a cotainr
    with the build stage seam and on one without.
    """
    argv = ["cotainr-lumi", "build", str(tmp_path / "x.sif"), "--system=env-test"]
    mocker.patch.object(sys, "argv", [*argv, "--dry-run", *args])
    try:
        cli.main()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    return code, capsys.readouterr().err


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


def test_env_name_with_trailing_newline_is_rejected_by_a_null_env_setting(
    mocker, capsys, tmp_path, env_profile
):
    code, err = dry_run(
        mocker, capsys, tmp_path, "--set", 'lumi-env.env={"X\\n": null}'
    )
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


@pytest.mark.parametrize(
    ("option", "fragments"),
    [
        ("lumi-env.runscripts=maybe", ["must be true or false (got 'maybe')"]),
        ("lumi-env.colour=red", ["unknown setting (known: env,"]),
        ("lumi-env.bind=[/x]", ["did you mean 'binds'?"]),
        ("lumi-nev.env={}", ["unknown stage", "did you mean 'lumi-env'?"]),
        ("target-env.prefix=relative", ["must be an absolute path"]),
    ],
)
def test_bad_set_value_names_the_option(
    mocker, capsys, tmp_path, env_profile, option, fragments
):
    code, err = dry_run(mocker, capsys, tmp_path, "--set", option)
    assert code != 0
    one_error(err, f"(--set '{option}')", *fragments)


def test_bad_stage_option_names_the_stage_options(
    mocker, capsys, tmp_path, env_profile
):
    (tmp_path / "afile").write_text("x")
    code, err = dry_run(
        mocker, capsys, tmp_path, "--set", f"lumi-env.module-dir={tmp_path / 'afile'}"
    )
    assert code != 0
    one_error(err, "lumi-env.module-dir", "not a directory")


def test_bad_profile_setting_names_the_file_and_line(
    mocker, capsys, tmp_path, env_profile
):
    with env_profile.open("a") as f:
        f.write("    settings:\n      lumi-env:\n        runscripts: maybe\n")
    code, err = dry_run(mocker, capsys, tmp_path)
    assert code != 0
    one_error(
        err,
        f"file {env_profile}, line 8",
        "key 'settings.lumi-env.runscripts'",
        "must be true or false",
    )


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


# ---------------------------------------------------------------- finding 5
@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"name: x\ndependencies: [python\n", "is not valid YAML at line"),
        (b"name: x\ndependencies: [caf\xe9]\n", "is not UTF-8 text (byte 26)"),
        (b"- just\n- a list\n", "must be a YAML mapping"),
        (b"\tname: x\n", "is not valid YAML"),
    ],
)
def test_bad_conda_env_file_fails_the_dry_run(
    mocker, capsys, tmp_path, env_profile, content, fragment
):
    env = tmp_path / "env.yml"
    env.write_bytes(content)
    code, err = dry_run(mocker, capsys, tmp_path, f"--conda-env={env}")
    assert code != 0
    one_error(err, str(env), fragment)


def test_good_conda_env_file_passes_the_dry_run(mocker, capsys, tmp_path, env_profile):
    env = tmp_path / "env.yml"
    env.write_text("name: x\nchannels: [conda-forge]\ndependencies: [python=3.12]\n")
    code, err = dry_run(mocker, capsys, tmp_path, f"--conda-env={env}")
    assert code == 0 and err == ""


@pytest.mark.parametrize("version", ["2", "'1'", "0", "true"])
def test_profile_with_an_unknown_version_is_rejected(
    mocker, capsys, tmp_path, env_profile, version
):
    env_profile.write_text(f"version: {version}\n" + env_profile.read_text())
    code, err = dry_run(mocker, capsys, tmp_path)
    assert code != 0
    one_error(err, str(env_profile), "unknown format version")


def test_info_with_a_broken_profile_exits_non_zero(mocker, capsys, env_profile):
    env_profile.write_text("systems: [not, a, mapping\n")
    mocker.patch.object(
        stock_cli.Info,
        "_check_singularity_dependency",
        return_value="singularity: mocked",
    )
    mocker.patch.object(sys, "argv", ["cotainr-lumi", "info"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code != 0
    out = capsys.readouterr().out
    assert "Cannot read the system profiles" in out and str(env_profile) in out


def test_info_with_good_profiles_exits_zero(mocker, capsys, env_profile):
    mocker.patch.object(
        stock_cli.Info,
        "_check_singularity_dependency",
        return_value="singularity: mocked",
    )
    mocker.patch.object(sys, "argv", ["cotainr-lumi", "info"])
    cli.main()
    assert re.search(r"- env-test\b", capsys.readouterr().out)


def test_verify_of_a_directory_says_not_an_image(mocker, capsys, tmp_path, monkeypatch):
    # No apptainer on PATH: the answer must still be about the input.
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    mocker.patch.object(sys, "argv", ["cotainr-lumi", "verify", str(tmp_path)])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code != 0
    one_error(capsys.readouterr().err, str(tmp_path), "is not an image")


# ------------------------------------------------- YAML: depth, aliases, kind
NESTED = "[" * 500 + "]" * 500
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
    for i in range(9)
)


@pytest.mark.parametrize("value", [NESTED, "{a: " * 300 + "}" * 300])
def test_deeply_nested_set_value_is_one_error(
    mocker, capsys, tmp_path, value, env_profile
):
    code, err = dry_run(mocker, capsys, tmp_path, "--set", f"prune.strict={value}")
    assert code == 2
    one_error(err, "nested more than 64 levels")
    assert len(err) < 600  # the input is quoted cut to a sane length


def test_alias_bomb_in_set_is_refused_quickly(mocker, capsys, tmp_path, env_profile):
    value = "{" + BOMB.replace("\n", ", ").rstrip(", ") + "}"
    code, err = dry_run(mocker, capsys, tmp_path, "--set", f"lumi-env.env={value}")
    assert code == 2
    one_error(err, "through its aliases")
    assert len(err) < 600


@pytest.mark.parametrize(
    "content", [f"systems: {NESTED}\n", BOMB + "systems: {}\n"], ids=["deep", "bomb"]
)
def test_hostile_systems_file_is_one_error(
    mocker, capsys, tmp_path, content, monkeypatch
):
    path = tmp_path / "hostile.yaml"
    path.write_text(content)
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    code, err = dry_run(mocker, capsys, tmp_path)
    assert code == 2
    one_error(err, str(path))
    assert "nested more than" in err or "through its aliases" in err


@pytest.mark.parametrize("content", [NESTED, BOMB], ids=["deep", "bomb"])
@pytest.mark.parametrize("option", ["--pip-steps", "--conda-env"])
def test_hostile_steps_and_conda_env_files_are_one_error(
    mocker, capsys, tmp_path, env_profile, content, option
):
    path = tmp_path / "hostile.yml"
    path.write_text(content)
    code, err = dry_run(mocker, capsys, tmp_path, option, str(path))
    assert code != 0
    one_error(err, "hostile.yml")


@pytest.mark.parametrize("option", ["--pip-steps", "--conda-env"])
def test_a_fifo_is_refused_without_blocking(
    mocker, capsys, tmp_path, env_profile, option
):
    import os

    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    code, err = dry_run(mocker, capsys, tmp_path, option, str(fifo))
    assert code != 0
    one_error(err, "steps.fifo")


def test_oversized_steps_file_is_refused(mocker, capsys, tmp_path, env_profile):
    path = tmp_path / "big.yml"
    path.write_text("steps: []\n" + "#" * (2 * 1024 * 1024) + "\n")
    code, err = dry_run(mocker, capsys, tmp_path, "--pip-steps", str(path))
    assert code == 2
    one_error(err, "big.yml", "more than the")


def test_info_with_a_deeply_nested_systems_file_is_one_error(
    mocker, capsys, tmp_path, monkeypatch
):
    path = tmp_path / "deep.yaml"
    path.write_text(f"systems: {NESTED}\n")
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    mocker.patch.object(
        stock_cli.Info, "_check_singularity_dependency", return_value="mocked"
    )
    mocker.patch.object(sys, "argv", ["cotainr-lumi", "info"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out, err = capsys.readouterr()
    assert info.value.code == 2
    assert "Traceback" not in out + err and "nested more than" in out + err


@pytest.mark.parametrize("prefix", ["/usr", "/usr/", "/usr/local", "/", "/usr/bin/.."])
def test_system_python_as_target_env_is_refused_at_dry_run(
    mocker, capsys, tmp_path, env_profile, prefix
):
    code, err = dry_run(
        mocker, capsys, tmp_path, "--set", f"target-env.prefix={prefix}"
    )
    assert code == 2
    one_error(err, "system Python")


@pytest.mark.parametrize(
    ("image", "needle"),
    [
        ("x.lua", "would land on each other"),
        ("a:b.sif", "module name"),
        ("-a.sif", "module name"),
        ("sub,dir/x.sif", "CONTAINERROOT"),
        ("tab\tdir/x.sif", "module"),
    ],
)
def test_outputs_and_derived_names_are_checked_before_building(
    mocker, capsys, tmp_path, env_profile, image, needle
):
    path = tmp_path / image
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["cotainr-lumi", "build", str(path), "--system=env-test", "--dry-run"]
    mocker.patch.object(sys, "argv", argv)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    one_error(capsys.readouterr().err, needle)


def test_image_path_in_a_symlink_loop_is_one_error(
    mocker, capsys, tmp_path, env_profile
):
    (tmp_path / "loop").symlink_to("loop")
    argv = [
        "cotainr-lumi",
        "build",
        str(tmp_path / "loop" / "x.sif"),
        "--system=env-test",
    ]
    mocker.patch.object(sys, "argv", [*argv, "--dry-run"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code != 0
    err = capsys.readouterr().err
    one_error(err)


def test_an_env_value_too_long_for_linux_is_refused_at_dry_run(
    mocker, capsys, tmp_path, env_profile
):
    code, err = dry_run(mocker, capsys, tmp_path, "--env", "V=" + "x" * (130 * 1024))
    assert code == 2
    one_error(err, "more than the 65536 bytes")
    assert len(err) < 1000


def test_a_malformed_sif_header_is_one_error_in_a_dry_run(
    mocker, capsys, tmp_path, env_profile, base_image
):
    """2^40 descriptors: a MemoryError traceback before (issue 38, 7)."""
    from siffile import PARTITION, SQUASHFS, SYSTEM, write_sif

    sif = base_image.resolve()
    write_sif(sif, [(PARTITION, b"system", SQUASHFS, SYSTEM, "")])
    data = bytearray(sif.read_bytes())
    data[88:96] = (2**40).to_bytes(8, "little")
    sif.write_bytes(bytes(data))
    code, err = dry_run(mocker, capsys, tmp_path)
    assert code == 2
    one_error(err, str(sif), "not a valid SIF image", "1099511627776 descriptors")
