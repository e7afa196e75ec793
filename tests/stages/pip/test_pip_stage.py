"""Unit tests of the pip stage (cotainr_lumi/stages/pip/stage.py) with a fake sandbox."""

import argparse
import json
import logging
from pathlib import Path
import shlex
import subprocess

from planfakes import plan_text, stage_context
import pytest
from targetenv_fakes import is_probe, probe_stdout

from cotainr_lumi import buildoptions
from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.pipeline.plan import BuildRequest, make_plan
from cotainr_lumi.processes import CommandError
from cotainr_lumi.stages.pip.install import CHECK_FILE, STEPS_FILE
from cotainr_lumi.stages.pip.stage import PACKAGES_FILE, WORK_DIR, PipStage

PREFIX = "/opt/cotainr/conda/envs/conda_container_env"
BUILD = {"image_path": Path("x.sif")}


class FakeSandbox:
    """Answers the commands the pip stage runs, keeping a package list."""

    def __init__(self, root, installed):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.installed = dict(installed)
        self.commands = []
        self.on_install = None  # (argv, env) -> None, may raise CommandError
        self.check_output = "No broken requirements found.\n"  # pip check's

    def run(self, args, *, env=None, timeout=None):
        args = list(args)
        self.commands.append((args, dict(env or {})))
        if is_probe(args):
            return subprocess.CompletedProcess(
                args, 0, stdout=probe_stdout(PREFIX), stderr=""
            )
        inner = []
        if args[:2] == ["bash", "-c"] and "; exec " in args[2]:
            inner = shlex.split(args[2].rsplit("; exec ", 1)[1])
        if inner[1:] == ["-m", "pip", "--version"]:
            return subprocess.CompletedProcess(
                args, 0, stdout="pip 23.0.1 from x\n", stderr=""
            )
        if inner[1:5] == ["-m", "pip", "list", "--format"]:
            if f"pip check >{CHECK_FILE} 2>&1; " in args[2]:
                self.host(CHECK_FILE).write_text(self.check_output)
            data = [{"name": n, "version": v} for n, v in self.installed.items()]
            return subprocess.CompletedProcess(
                args, 0, stdout=json.dumps(data) + "\n", stderr=""
            )
        if args[:2] == ["bash", "-c"] and "pip install" in args[2]:
            argv = shlex.split(args[2].rsplit("; exec ", 1)[1])
            if self.on_install:
                self.on_install(argv, env or {})
            return subprocess.CompletedProcess(args, 0, stdout="", stderr="")
        raise AssertionError(f"unexpected command {args}")

    def installs(self):
        return [
            (shlex.split(a[2].rsplit("; exec ", 1)[1]), e)
            for a, e in self.commands
            if "pip install" in a[-1]
        ]

    def host(self, image_path):
        return self.root / image_path.lstrip("/")


@pytest.fixture(autouse=True)
def no_host_pip_path_variables(monkeypatch):
    """The machine running the tests may set PIP_FIND_LINKS etc."""
    for name in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_CERT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    work = tmp_path / "inputs"
    work.mkdir()
    (work / "torch.txt").write_text(
        "-r common.txt\n./wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl\n"
    )
    (work / "common.txt").write_text("wheel\n")
    (work / "wheels").mkdir()
    (work / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(
        b"torch"
    )
    (work / "ext").mkdir()
    (work / "ext" / "setup.py").write_text("")
    (work / "steps.yml").write_text(
        "steps:\n"
        "  - name: extension\n"
        "    packages: [./ext]\n"
        "    no-build-isolation: true\n"
        "    env: {PYTORCH_ROCM_ARCH: gfx90a, MAX_JOBS: 2}\n"
        "    index-url: https://pypi.example.org/simple\n"
        "    extra-index-urls: [https://download.pytorch.org/whl/rocm6.2]\n"
        "    pip-args: [--verbose]\n"
        "    allow-changes: [numpy]\n"
    )
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return work


def _settings_from_cli(argv):
    parser = argparse.ArgumentParser()
    buildoptions.add_options(parser=parser)
    args = parser.parse_args(argv)
    return buildoptions.option_settings(vars(args)).get("pip", {})


def _stage_from_cli(argv):
    return PipStage(settings=_settings_from_cli(argv))


def test_cli_options_become_settings_in_order(inputs):
    assert _settings_from_cli([]) == {}
    settings = _settings_from_cli(
        [
            "--pip-requirements",
            "torch.txt",
            "--pip-steps",
            "steps.yml",
        ]
    )
    stage = PipStage(settings=settings)
    assert [s.source for s in stage.steps] == [
        "torch.txt",
        f"{inputs / 'steps.yml'}, step 1",
    ]
    assert stage.steps[0].allow_changes == {"pip", "setuptools", "wheel"}
    assert stage.steps[1].allow_changes == {"pip", "setuptools", "wheel", "numpy"}


def test_bad_reference_fails_when_the_plan_is_made(inputs, tmp_path):
    (inputs / "bad.txt").write_text("numpy\n-e ./ext\n")
    with pytest.raises(InputError, match=r"bad.txt, line 2: editable installs"):
        make_plan(
            request=BuildRequest(
                image_path=tmp_path / "x.sif",
                base_image="docker://debian",
                settings={"pip": {"steps": ["bad.txt"]}},
            )
        )


def test_plan_describes_target_commands_and_staging(inputs, tmp_path):
    plan = make_plan(
        request=BuildRequest(
            image_path=tmp_path / "x.sif",
            base_image="docker://debian",
            settings={
                "pip": {"steps": [{"requirements": "torch.txt"}], "cache-dir": "c"}
            },
        )
    )
    assert plan.stage_names == ["pip", "provenance"]
    text = plan_text(plan)
    assert "target: found in the base image when the build starts" in text
    assert "$WITH_CONDA" in text
    assert f"pip cache: {inputs / 'c'}" in text
    assert (
        "python -m pip install --no-input --disable-pip-version-check --progress-bar off "
        f"--cache-dir {WORK_DIR}/cache -c /opt/cotainr-lumi/pip/step1/protected-constraints.txt "
        "-r /opt/cotainr-lumi/pip/step1/torch.txt"
    ) in text
    assert (
        f"stages: {inputs / 'wheels' / 'torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl'}"
        in text
    )


def test_no_steps_records_the_package_list_only(tmp_path):
    plan = make_plan(
        request=BuildRequest(
            image_path=tmp_path / "x.sif",
            base_image="docker://debian",
            settings={"pip": {"cache": False}},
        )
    )
    assert plan.stage_names == ["pip", "provenance"]
    assert "no pip steps: record the environment's package list only" in (
        plan_text(plan)
    )
    stage = plan.stages[0]
    sandbox = FakeSandbox(tmp_path / "sb", {"numpy": "2.1.0", "torch": "2.13.0"})
    report = stage.run(context=stage_context(sandbox, build=plan.facts))
    assert sandbox.installs() == []
    last = sandbox.commands[-1][0]
    assert shlex.split(last[2].rsplit("; exec ", 1)[1])[:4] == [
        f"{PREFIX}/bin/python",
        "-m",
        "pip",
        "list",
    ]
    packages = json.loads(sandbox.host(PACKAGES_FILE).read_text())
    assert {p["name"]: p["version"] for p in packages} == {
        "numpy": "2.1.0",
        "torch": "2.13.0",
    }
    assert report.labels == {
        "cotainr-lumi.pip.packages": PACKAGES_FILE,
        "cotainr-lumi.sbom": "/opt/cotainr-lumi/sbom.cdx.json",
    }
    assert report.summary.startswith(f"no pip steps; package list of {PREFIX}: 2")
    assert "(torch 2.13.0)" in report.summary
    assert not sandbox.host(WORK_DIR).exists()


def _sandbox_without_python(tmp_path, mocker):
    sandbox = FakeSandbox(tmp_path / "sb", {})
    mocker.patch.object(
        sandbox,
        "run",
        side_effect=CommandError(
            cmd=["bash"], returncode=127, stdout="", stderr="no python on PATH"
        ),
    )
    return sandbox


def test_no_steps_and_no_pip_warns_and_goes_on(tmp_path, mocker, caplog):
    stage = PipStage(settings={"cache": False})
    sandbox = _sandbox_without_python(tmp_path, mocker)
    with caplog.at_level("WARNING", logger="cotainr.cotainr_lumi"):
        report = stage.run(context=stage_context(sandbox, probe=False, **BUILD))
    assert "No pip steps and no package list" in caplog.text
    assert report.labels == {}
    assert not sandbox.host(PACKAGES_FILE).exists()


def test_run_installs_steps_in_order_with_exact_commands(inputs, tmp_path):
    stage = _stage_from_cli(
        ["--pip-requirements", "torch.txt", "--pip-steps", "steps.yml"]
    )
    sandbox = FakeSandbox(tmp_path / "sb", {"pip": "23.0.1", "setuptools": "66.1.1"})
    cache_in_sandbox = sandbox.host(f"{WORK_DIR}/cache")
    host_cache = tmp_path / "xdg" / "cotainr-lumi" / "pip"
    (host_cache / "wheels").mkdir(parents=True)
    (host_cache / "wheels" / "isolated-build.whl").write_text("from an earlier build")
    seen = []

    def on_install(argv, env):
        # What pip would see inside the container at this moment.
        reqs = [argv[i + 1] for i, a in enumerate(argv) if a == "-r"]
        seen.append({r: sandbox.host(r).read_text() for r in reqs})
        seen[-1]["constraints"] = sandbox.host(argv[argv.index("-c") + 1]).read_text()
        assert cache_in_sandbox.is_dir()
        (cache_in_sandbox / "http").mkdir(exist_ok=True)
        (cache_in_sandbox / "http" / f"entry{len(seen)}").write_text("cached")
        wheels = cache_in_sandbox / "wheels"
        if len(seen) == 1:
            # An isolated step without build variables sees the wheel cache.
            assert (wheels / "isolated-build.whl").is_file()
        else:
            # A no-build-isolation step neither sees nor keeps built wheels.
            assert not wheels.exists()
            wheels.mkdir()
            (wheels / "built-against-this-torch.whl").write_text("x")
        if len(seen) == 1:
            assert sandbox.host(
                f"{WORK_DIR}/staging/step1/1/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
            ).is_file()
            sandbox.installed.update(
                {"torch": "2.13.0+cpu", "wheel": "0.45.0", "setuptools": "80.0"}
            )
        else:
            sandbox.installed["ext"] = "0.1"

    sandbox.on_install = on_install
    report = stage.run(context=stage_context(sandbox, **BUILD))

    (cmd1, env1), (cmd2, env2) = sandbox.installs()
    assert cmd1 == [
        f"{PREFIX}/bin/python",
        "-m",
        "pip",
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--cache-dir",
        f"{WORK_DIR}/cache",
        "-c",
        "/opt/cotainr-lumi/pip/step1/protected-constraints.txt",
        "-r",
        "/opt/cotainr-lumi/pip/step1/torch.txt",
    ]
    assert env1 == {}
    assert cmd2 == [
        f"{PREFIX}/bin/python",
        "-m",
        "pip",
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--cache-dir",
        f"{WORK_DIR}/cache",
        "--no-build-isolation",
        "--index-url",
        "https://pypi.example.org/simple",
        "--extra-index-url",
        "https://download.pytorch.org/whl/rocm6.2",
        "--verbose",
        "-c",
        "/opt/cotainr-lumi/pip/step2/protected-constraints.txt",
        "-r",
        "/opt/cotainr-lumi/pip/step2/packages.txt",
    ]
    assert env2 == {"PYTORCH_ROCM_ARCH": "gfx90a", "MAX_JOBS": "2"}
    # Host pip variables that would redirect the install are unset.
    install_script = [a[2] for a, _ in sandbox.commands if "pip install" in a[-1]][0]
    assert install_script.startswith(
        f'PATH={PREFIX}/bin"${{PATH:+:$PATH}}"; export PATH; unset PIP_TARGET PIP_PREFIX PIP_ROOT PIP_USER'
    )

    assert (
        seen[0]["/opt/cotainr-lumi/pip/step1/torch.txt"]
        .splitlines()[0]
        .startswith("-r /opt/cotainr-lumi/pip/step1/common.txt")
    )
    # Step 1 protects nothing but what was there; setuptools/pip are allowed.
    assert "\nsetuptools==" not in seen[0]["constraints"]
    assert "# setuptools==66.1.1  (allow-changes)" in seen[0]["constraints"]
    assert "torch==2.13.0+cpu" in seen[1]["constraints"]
    assert seen[1]["/opt/cotainr-lumi/pip/step2/packages.txt"].startswith(
        f"{WORK_DIR}/staging/step2/1/ext"
    )

    # Kept: rewritten files, package list; removed: staging and cache.
    assert (
        sandbox.host("/opt/cotainr-lumi/pip/step1/common.txt").read_text() == "wheel\n"
    )
    packages = json.loads(sandbox.host(PACKAGES_FILE).read_text())
    assert {"name": "torch", "version": "2.13.0+cpu"} in packages
    assert not sandbox.host(WORK_DIR).exists()
    assert sorted(p.name for p in (host_cache / "wheels").iterdir()) == [
        "isolated-build.whl"
    ]
    assert sorted(p.name for p in (host_cache / "http").iterdir()) == [
        "entry1",
        "entry2",
    ]
    assert report.labels == {
        "cotainr-lumi.pip.packages": "/opt/cotainr-lumi/pip/packages.json",
        "cotainr-lumi.pip.steps": "/opt/cotainr-lumi/pip/steps.json",
        "cotainr-lumi.sbom": "/opt/cotainr-lumi/sbom.cdx.json",
    }
    # The SBOM says what the steps added.
    assert "torch" in report.record["sbom"]["added"]
    assert report.record["sbom"]["aif"] is None  # the base has no /.sbom.json
    assert "torch 2.13.0+cpu" in report.summary
    assert report.record["steps"][0]["added"]["torch"] == "2.13.0+cpu"
    assert report.record["target"]["prefix"] == PREFIX


CONFLICT_STDERR = """\
ERROR: Cannot install -r /opt/cotainr-lumi/pip/step1/torch.txt (line 1) because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.12.0
    The user requested (constraint) torch==2.13.0+cpu

To fix this you could try to:
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/
"""


def test_protection_conflict_names_package_version_and_requirement(inputs, tmp_path):
    (inputs / "pin.txt").write_text("torch==2.12.0\n")
    stage = PipStage(settings={"steps": ["pin.txt"]})
    sandbox = FakeSandbox(tmp_path / "sb", {"torch": "2.13.0+cpu"})

    def on_install(argv, env):
        cache = sandbox.host(f"{WORK_DIR}/cache")
        (cache / "kept-even-on-failure").write_text("x")
        raise CommandError(cmd=argv, returncode=1, stdout="", stderr=CONFLICT_STDERR)

    sandbox.on_install = on_install
    with pytest.raises(StageError) as info:
        stage.run(context=stage_context(sandbox, **BUILD))
    text = str(info.value)
    assert (
        "step 1 (pip settings, step 1) would change protected package(s) torch" in text
    )
    assert "torch 2.13.0+cpu is installed" in text
    assert "torch==2.12.0" in text
    assert "allow-changes: [torch]" in text
    assert (
        "The user requested (constraint) torch==2.13.0+cpu" in text
    )  # pip's own lines
    assert f"/opt/cotainr-lumi/pip/step1/pin.txt <- {inputs / 'pin.txt'}" in text
    assert not sandbox.host(WORK_DIR).exists()
    assert (
        tmp_path / "xdg" / "cotainr-lumi" / "pip" / "kept-even-on-failure"
    ).is_file()


def test_other_pip_failure_shows_step_source_and_pip_errors(inputs, tmp_path):
    stage = PipStage(settings={"steps": ["torch.txt"], "cache": False})
    sandbox = FakeSandbox(tmp_path / "sb", {})

    def on_install(argv, env):
        assert "--no-cache-dir" in argv
        raise CommandError(
            cmd=argv,
            returncode=1,
            stdout="Collecting x\n",
            stderr="WARNING: noise\n  error: subprocess-exited-with-error\n"
            "      ModuleNotFoundError: No module named 'torch'\n",
        )

    sandbox.on_install = on_install
    with pytest.raises(StageError) as info:
        stage.run(context=stage_context(sandbox, **BUILD))
    text = str(info.value)
    assert "pip install failed in step 1 (pip settings, step 1) (exit status 1)" in text
    assert "No module named 'torch'" in text
    assert "WARNING: noise" not in text


def test_changes_that_slip_through_are_caught(inputs, tmp_path):
    stage = PipStage(
        settings={"steps": [{"packages": ["foo"], "allow-changes": ["numpy"]}]}
    )
    sandbox = FakeSandbox(tmp_path / "sb", {"torch": "2.13.0+cpu", "numpy": "1.26.4"})

    def on_install(argv, env):
        sandbox.installed["torch"] = "2.12.0"
        sandbox.installed["numpy"] = "2.0.0"

    sandbox.on_install = on_install
    with pytest.raises(
        StageError, match=r"changed protected package\(s\) torch despite"
    ) as info:
        stage.run(context=stage_context(sandbox, **BUILD))
    assert "torch 2.13.0+cpu -> 2.12.0" in str(info.value)
    assert "numpy" not in str(info.value).split("constraints:")[1].split("Add")[0]


def test_no_python_in_the_container(inputs, tmp_path, mocker):
    stage = PipStage(settings={"steps": ["torch.txt"]})
    sandbox = _sandbox_without_python(tmp_path, mocker)
    with pytest.raises(StageError, match="could not start the container"):
        stage.run(context=stage_context(sandbox, **BUILD))


def test_system_python_only_is_refused_before_installing(inputs, tmp_path):
    stage = PipStage(settings={"steps": ["torch.txt"], "cache": False})
    sandbox = FakeSandbox(tmp_path / "sb", {})
    sandbox.run = lambda args, **kw: subprocess.CompletedProcess(
        args, 0, stdout=probe_stdout(None), stderr=""
    )
    with pytest.raises(StageError) as info:
        stage.run(context=stage_context(sandbox, **BUILD))
    text = str(info.value)
    assert "no Python environment to install into" in text
    assert "/usr/bin/python3 (prefix /usr), a system Python" in text
    assert "--conda-env" in text and "--set target-env.prefix=" in text
    assert not sandbox.host(WORK_DIR).exists()


def test_host_find_links_missing_in_the_container_is_said_once_and_left_out(
    inputs, tmp_path, monkeypatch, caplog
):
    sandbox = FakeSandbox(tmp_path / "sb", {"pip": "23.0.1"})
    (sandbox.root / "wheels").mkdir()
    monkeypatch.setenv(
        "PIP_FIND_LINKS", "/host/only/wheels https://example.org/w /wheels"
    )
    caplog.set_level("WARNING", logger="cotainr")
    stage = _stage_from_cli(
        ["--pip-requirements", "torch.txt", "--pip-steps", "steps.yml"]
    )
    stage.run(context=stage_context(sandbox, **BUILD))
    installs = sandbox.installs()
    assert len(installs) == 2
    for _, env in installs:
        assert env["PIP_FIND_LINKS"] == "https://example.org/w /wheels"
    # the build variables of a step still reach pip
    assert installs[1][1]["PYTORCH_ROCM_ARCH"] == "gfx90a"
    # every pip command gets the same value (pip list included)
    pip_runs = [e for a, e in sandbox.commands if "pip" in " ".join(a)]
    assert all(
        e.get("PIP_FIND_LINKS") == "https://example.org/w /wheels" for e in pip_runs[1:]
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    about = [w for w in warnings if "/host/only/wheels" in w]
    assert len(about) == 1
    assert "PIP_FIND_LINKS" in about[0] and "left out" in about[0]


def test_host_pip_variables_that_exist_in_the_container_are_untouched(
    inputs, tmp_path, monkeypatch, caplog
):
    sandbox = FakeSandbox(tmp_path / "sb", {"pip": "23.0.1"})
    (sandbox.root / "wheels").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels")
    caplog.set_level("WARNING", logger="cotainr")
    stage = _stage_from_cli(["--pip-requirements", "torch.txt"])
    stage.run(context=stage_context(sandbox, **BUILD))
    assert all("PIP_FIND_LINKS" not in env for _, env in sandbox.installs())
    assert "PIP_FIND_LINKS" not in caplog.text


#: The secrets of the steps below (issue 29): passwords and tokens in index
#: URLs (step keys, requirement files, nested files, pip-args) and a step env.
SECRETS = ("s3cret", "tok3n-value", "pw123456", "pw-arg", "hf_abc123")


def _secret_step(inputs):
    (inputs / "private.txt").write_text(
        "--extra-index-url https://ann:s3cret@extra.example.org/simple\n"
        "-r nested.txt\nprivdemo\n"
    )
    (inputs / "nested.txt").write_text(
        "-i https://tok3n-value@idx.example.org/simple\n"
        "--find-links https://bob:pw123456@links.example.org/\nother\n"
    )
    return {
        "requirements": "private.txt",
        "index-url": "https://user:s3cret@pypi.example.org/simple",
        "pip-args": ["--find-links=https://c:pw-arg@f.example.org/"],
        "env": {"HF_TOKEN": "hf_abc123", "MAX_JOBS": "2"},
    }


def _all_text(root):
    return "".join(
        p.read_text(errors="replace") for p in Path(root).rglob("*") if p.is_file()
    )


def test_credentials_and_step_secrets_reach_pip_only(inputs, tmp_path, caplog):
    plan = make_plan(
        request=BuildRequest(
            image_path=tmp_path / "x.sif",
            base_image="docker://debian",
            settings={"pip": {"steps": [_secret_step(inputs)], "cache": False}},
        )
    )
    sandbox = FakeSandbox(tmp_path / "sb", {"pip": "23.0.1"})
    seen = {}

    def on_install(argv, env):
        seen.update(argv=argv, env=env, files=_all_text(sandbox.root))
        # pip echoes its indexes; a build may print its variables.
        logging.getLogger("SingularitySandbox.out").warning(
            "Looking in indexes: https://user:s3cret@pypi.example.org/simple; "
            "token hf_abc123"
        )

    sandbox.on_install = on_install
    caplog.set_level("INFO")
    report = plan.stages[0].run(context=stage_context(sandbox, build=plan.facts))
    # pip got every credential and the variable.
    assert "https://user:s3cret@pypi.example.org/simple" in seen["argv"]
    assert "--find-links=https://c:pw-arg@f.example.org/" in seen["argv"]
    assert seen["env"] == {"HF_TOKEN": "hf_abc123", "MAX_JOBS": "2"}
    assert all(s in seen["files"] for s in SECRETS[:3])
    # Nothing kept, recorded, logged or planned has them.
    recorded = [
        _all_text(sandbox.root),
        json.dumps(report.record),
        caplog.text,
        plan_text(plan),
    ]
    for text in recorded:
        assert [s for s in SECRETS if s in text] == []
    kept = sandbox.host("/opt/cotainr-lumi/pip/step1/nested.txt").read_text()
    assert kept.splitlines()[:2] == [
        "-i https://***@idx.example.org/simple",
        "--find-links https://bob:***@links.example.org/",
    ]
    step = report.record["steps"][0]
    assert step["env"] == {"HF_TOKEN": "***", "MAX_JOBS": "2"}
    assert "https://user:***@pypi.example.org/simple" in step["command"]
    assert (
        "Looking in indexes: https://user:***@pypi.example.org/simple; token ***"
        in (caplog.text)
    )
    assert "HF_TOKEN='***' MAX_JOBS=2" in plan_text(plan)
    # Only while the stage runs.
    assert logging.getLogRecordFactory() is logging.LogRecord


def test_a_failing_step_shows_no_credentials(inputs, tmp_path):
    stage = PipStage(settings={"steps": [_secret_step(inputs)], "cache": False})
    sandbox = FakeSandbox(tmp_path / "sb", {})

    def on_install(argv, env):
        raise CommandError(
            cmd=argv,
            returncode=1,
            stdout="",
            stderr="ERROR: 403 for https://user:s3cret@pypi.example.org/simple "
            "(HF_TOKEN=hf_abc123)\n",
        )

    sandbox.on_install = on_install
    with pytest.raises(StageError) as info:
        stage.run(context=stage_context(sandbox, **BUILD))
    text = str(info.value)
    assert "ERROR: 403 for https://user:***@pypi.example.org/simple (HF_TOKEN=***)" in (
        text
    )
    assert "s3cret" not in _all_text(sandbox.root)


PIP_CHECK_OUTPUT = """\
needs-old 1.0 has requirement dep<2, but you have dep 2.0.
tool 3.1 requires missing-lib, which is not installed.
"""


@pytest.mark.parametrize("mode", ["warn", "strict", "off"])
def test_pip_check_after_the_last_step(inputs, tmp_path, caplog, mode):
    """One ``pip check`` after the last step: a warning, a StageError, or none."""
    steps = [{"packages": ["needs-old"]}, {"packages": ["dep==2.0"]}]
    stage = PipStage(settings={"steps": steps, "check": mode})
    sandbox = FakeSandbox(tmp_path / "sb", {"pip": "24.0"})
    sandbox.check_output = "WARNING: noise\n" + PIP_CHECK_OUTPUT
    context = stage_context(sandbox, **BUILD)
    if mode == "strict":
        with pytest.raises(StageError) as info:
            stage.run(context=context)
        text = str(info.value)
        assert "broken requirements of needs-old, dep, tool, missing-lib:" in text
        assert "  needs-old 1.0 has requirement dep<2, but you have dep 2.0\n" in text
        assert "  tool 3.1 requires missing-lib, which is not installed\n" in text
        assert text.endswith("allow-changes). Or build anyway: pip.check=warn.")
        return
    with caplog.at_level(logging.WARNING):
        stage.run(context=context)
    checks = [a for a, _ in sandbox.commands if "pip check" in a[-1]]
    record = json.loads(sandbox.host(STEPS_FILE).read_text())["check"]
    warned = [r.getMessage() for r in caplog.records if "pip check" in r.getMessage()]
    if mode == "off":
        assert checks == [] and record is None and warned == []
        return
    # With the last step's package list: no extra container start.
    assert len(checks) == 1 and "pip list" in checks[0][-1]
    assert record[0] == {
        "package": "needs-old 1.0",
        "problem": "has requirement dep<2, but you have dep 2.0",
        "involved": ["needs-old", "dep"],
    }
    assert len(warned) == 1 and "tool 3.1 requires missing-lib" in warned[0]
    assert sandbox.host(CHECK_FILE).read_text().endswith(PIP_CHECK_OUTPUT)


def test_pip_check_without_broken_requirements_is_quiet(inputs, tmp_path, caplog):
    stage = PipStage(settings={"steps": [{"packages": ["x"]}], "check": "strict"})
    sandbox = FakeSandbox(tmp_path / "sb", {"pip": "24.0"})
    with caplog.at_level(logging.WARNING):
        stage.run(context=stage_context(sandbox, **BUILD))
    assert json.loads(sandbox.host(STEPS_FILE).read_text())["check"] == []
    assert not [r for r in caplog.records if "pip check" in r.getMessage()]
