"""Unit tests of uv as the pip steps' installer (cotainr_lumi/stages/pip/uv.py)."""

import dataclasses
import json
import os
import shlex
import subprocess
import sys

from planfakes import stage_context
import pytest
from test_pip_stage import BUILD, PREFIX, FakeSandbox, _stage_from_cli, inputs  # noqa: F401

from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.processes import CommandError
from cotainr_lumi.stages.pip import uv
from cotainr_lumi.stages.pip.install import CHECK_FILE
from cotainr_lumi.stages.pip.stage import PipStage
from cotainr_lumi.stages.pip.uv import UV_BIN

#: uv's resolver error with --color never (uv 0.13.9, run here).
UV_CONFLICT = (
    "error: No solution found when resolving dependencies\n"
    "  cause: Because you require torch==2.12.0 and torch==2.13.0+cpu, we can "
    "conclude that your requirements are unsatisfiable.\n"
)


class UvSandbox(FakeSandbox):
    """Answers uv's commands too (list, check, install, --version)."""

    def run(self, args, *, env=None, timeout=None):
        inner = []
        if args[:2] == ["bash", "-c"] and "; exec " in args[2]:
            inner = shlex.split(args[2].rsplit("; exec ", 1)[1])
        if inner[:1] != [UV_BIN]:
            return super().run(args, env=env, timeout=timeout)
        self.commands.append((list(args), dict(env or {})))
        assert self.host(UV_BIN).stat().st_mode & 0o111
        stdout = ""
        if "list" in inner:
            if "check --python" in args[2]:
                self.host(CHECK_FILE).write_text(
                    "All installed packages are compatible\n"
                )
            stdout = json.dumps(
                [{"name": n, "version": v} for n, v in self.installed.items()]
            )
        elif "install" in inner and self.on_install:
            self.on_install(inner, env or {})
        return subprocess.CompletedProcess(args, 0, stdout=stdout, stderr="")


@pytest.fixture
def fake_uv(tmp_path, monkeypatch):
    program = tmp_path / "uv-bin"
    program.write_text("#!/bin/sh\n")
    module = type(sys)("uv")
    module.find_uv_bin = lambda: str(program)
    monkeypatch.setitem(sys.modules, "uv", module)
    monkeypatch.setattr(uv.importlib.metadata, "version", lambda name: uv.UV_VERSION)
    return program


def test_a_uv_step_runs_uv_in_the_container_and_uv_lists(inputs, tmp_path, fake_uv):  # noqa: F811
    stage = _stage_from_cli(["--pip-requirements", "torch.txt"])
    stage = PipStage(settings=dataclasses.replace(stage.settings, installer="uv"))
    sandbox = UvSandbox(tmp_path / "sb", {"pip": "23.0.1"})

    def on_install(argv, env):
        # The host uv cache is mounted where uv's --cache-dir points, and the
        # local wheel read-only where the step reads it.
        binds = os.environ["SINGULARITY_BIND"].split(",")
        assert binds[0] == f"{host_cache}:{uv.UV_CACHE_DIR}"
        wheel = inputs / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
        staged = f"{uv.imagelayout.PIP_WORK_DIR}/staging/step1/1/{wheel.name}"
        assert binds[1:] == [f"{wheel}:{staged}:ro"]
        assert argv[argv.index("--cache-dir") + 1] == uv.UV_CACHE_DIR
        sandbox.installed.update(torch="2.13.0+cpu")

    host_cache = tmp_path / "xdg" / "cotainr-lumi" / "uv"
    sandbox.on_install = on_install
    report = stage.run(context=stage_context(sandbox, **BUILD))
    ((argv, env),) = [c for c in sandbox.commands if " pip install " in c[0][-1]]
    cmd = shlex.split(argv[2].rsplit("; exec ", 1)[1])
    assert cmd[:3] == [UV_BIN, "--color", "never"] and f"{PREFIX}/bin/python" in cmd
    assert {"--compile-bytecode", "--no-config", "unsafe-best-match"} <= set(cmd)
    assert "unset UV_CONFIG_FILE" in argv[2]
    assert report.record["steps"][0]["installer"] == "uv"
    assert (
        report.record["check"] == [] and report.record["target"]["uv"] == uv.UV_VERSION
    )
    # No pip list: uv lists; nothing of uv is left in the sandbox.
    assert not [c for c in sandbox.commands if "-m pip list" in c[0][-1]]
    assert not sandbox.host(UV_BIN).exists() and "SINGULARITY_BIND" not in os.environ
    assert host_cache.is_dir()


def test_a_uv_step_with_an_option_uv_lacks_is_refused_when_planned(inputs, fake_uv):  # noqa: F811
    (inputs / "prefer.yml").write_text(
        "installer: uv\nsteps:\n  - packages: [six]\n    pip-args: [--prefer-binary, -v]\n"
        "  - requirements: opts.txt\n    installer: pip\n"
    )
    (inputs / "opts.txt").write_text("--trusted-host example.org\nsix\n")
    with pytest.raises(InputError) as e:
        _stage_from_cli(["--pip-steps", "prefer.yml"])
    assert "uv does not do --prefer-binary (pip-args) as pip does" in str(e.value)
    assert "'installer: pip'" in str(e.value)
    (inputs / "prefer.yml").write_text(
        "steps:\n  - requirements: opts.txt\n    installer: uv\n"
    )
    with pytest.raises(InputError, match=r"--trusted-host \(.*opts.txt, line 1\)"):
        _stage_from_cli(["--pip-steps", "prefer.yml"])


def test_uv_missing_says_what_to_install(inputs, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "uv", None)
    with pytest.raises(InputError, match=r"pip install 'cotainr-lumi\[uv\]'"):
        _stage_from_cli(["--pip-requirements", "torch.txt"]).__class__(
            settings={"installer": "uv", "steps": [{"packages": ["six"]}]}
        )


def test_options_uv_takes_and_the_host_variables_it_reads():
    step = type(
        "Step", (), {"pip_args": ["--only-binary", ":all:", "-C", "k=v", "--pre"]}
    )
    scan = type("Scan", (), {"options": [("-r", "f"), ("--hash", "f"), ("--pre", "g")]})
    assert uv.uv_problems(step=step, scan=scan) == [("--pre", "g")]
    env = uv.uv_env(
        environ={"PIP_FIND_LINKS": "/a /b", "PIP_INDEX_URL": "https://i/simple"},
        overrides={"PIP_FIND_LINKS": "/b"},
    )
    assert env == {"UV_FIND_LINKS": "/b", "UV_INDEX_URL": "https://i/simple"}


def test_uv_check_and_conflict_output_are_read():
    text = (
        "Checked 3 packages in 1ms\nFound 2 incompatibilities\n"
        "The package `checkuser` requires `checkdep>=2`, but `1.0` is installed\n"
        "The package `torch` is broken or incomplete (unable to read `WHEEL` file).\n"
    )
    found = uv.parse_uv_check(text=text)
    assert [f[2] for f in found] == [["checkuser", "checkdep"], ["torch"]]
    installed = {"torch": ("torch", "2.13.0+cpu"), "six": ("six", "1.17.0")}
    conflicts = uv.explain_uv_conflicts(
        output=UV_CONFLICT, installed=installed, allowed=set()
    )
    assert [(c.name, c.installed) for c in conflicts] == [("torch", "2.13.0+cpu")]
    assert "you require torch==2.12.0" in conflicts[0].describe()
    assert (
        uv.explain_uv_conflicts(
            output=UV_CONFLICT, installed=installed, allowed={"torch"}
        )
        == []
    )


def test_uv_that_does_not_run_in_the_image_is_one_error(inputs, tmp_path, fake_uv):  # noqa: F811
    stage = PipStage(settings={"installer": "uv", "steps": [{"packages": ["six"]}]})
    sandbox = UvSandbox(tmp_path / "sb", {"pip": "23.0.1"})

    def run(args, *, env=None, timeout=None):
        if "--version" in args[-1] and UV_BIN in args[-1]:
            raise CommandError(cmd=args, returncode=1, stderr="GLIBC_2.17 not found")
        return UvSandbox.run(sandbox, args, env=env, timeout=timeout)

    sandbox.run = run
    with pytest.raises(StageError, match="does not run in this image; install these"):
        stage.run(context=stage_context(sandbox, **BUILD))


def test_a_uv_cache_dir_that_cannot_be_mounted_is_one_error(inputs, fake_uv):  # noqa: F811
    stage = _stage_from_cli(["--pip-requirements", "torch.txt"])
    settings = dataclasses.replace(
        stage.settings, installer="uv", uv_cache_dir=str(inputs / "uv:cache")
    )
    with pytest.raises(InputError, match=r"uv:cache is mounted into the container"):
        PipStage(settings=settings)
    off = dataclasses.replace(settings, cache=False)  # no cache, nothing mounted
    assert PipStage(settings=off).uv_cache_dir == inputs / "uv:cache"
