"""The one discovery of the target Python environment (engine/targetenv.py, imageprobe.py)."""

import json
import subprocess
import sys

from planfakes import build_facts, plan_text, stage_context
import pytest

from cotainr_lumi.engine import imageprobe
from cotainr_lumi.engine.imageprobe import PROBE_SCRIPT, parse_probe
from cotainr_lumi.engine.stage import StageContext
from cotainr_lumi.engine.targetenv import (
    TargetEnv,
    TargetEnvNotFoundError,
    choose,
)
from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.imagelayout import TARGET_ENV_FILE
from cotainr_lumi.pipeline import describe
from cotainr_lumi.pipeline.plan import BuildRequest, make_plan
from cotainr_lumi.processes import CommandError

M = "COTAINR_LUMI_TARGET_ENV"
ENV = "/opt/miniconda3/envs/pytorch"
BASE = "/opt/miniconda3"
VENV = "/user-software/venv/pytorch"


def py(prefix, base_prefix=None):
    return {
        "prefix": prefix,
        "base_prefix": base_prefix or prefix,
        "executable": f"{prefix}/bin/python",
        "version": "3.12.1",
        "site": [f"{prefix}/lib/python3.12/site-packages"],
    }


def facts_text(**states):
    """Probe output: states maps 'image'/'with_conda' to dicts of facts."""
    lines = []
    for where, values in states.items():
        for key, value in values.items():
            if isinstance(value, dict):
                value = json.dumps(value)
            lines.append(f"{M} {where} {key} {value}")
    return "\n".join(lines) + "\n"


def layout1():
    """Conda env activated only by $WITH_CONDA; decoys on PATH."""
    return parse_probe(
        text=facts_text(
            image={
                "with_conda_set": "set",
                "with_conda": f"source {BASE}/bin/activate pytorch",
                "virtual_env": "",
                "conda_prefix": "",
                "path": f"{BASE}/bin:/usr/bin:/bin",
                "path_python": f"{BASE}/bin/python",
            },
            **{"image.path_python": {"python": py(BASE)}},
            with_conda={
                "rc": "0",
                "virtual_env": "",
                "conda_prefix": ENV,
                "path": f"{ENV}/bin:{BASE}/bin:/usr/bin:/bin",
                "path_python": f"{ENV}/bin/python",
            },
            **{"with_conda.conda_prefix": {"python": py(ENV)}},
        )
    )


def test_layout1_with_conda_wins_over_the_decoys():
    target = choose(facts=layout1())
    assert (target.prefix, target.python) == (ENV, f"{ENV}/bin/python")
    assert target.source == "with-conda"
    assert "from the base image's $WITH_CONDA" in target.reason
    assert target.decoys == {"python on PATH": f"{BASE}/bin/python (prefix {BASE})"}
    # pip runs after the base's own activation, with the env first on PATH.
    assert target.activation().startswith(
        f"eval 'source {BASE}/bin/activate pytorch' >/dev/null 2>&1 || true; PATH={ENV}/bin"
    )


def test_layout2_preactivated_conda_with_a_no_op_with_conda():
    facts = parse_probe(
        text=facts_text(
            image={
                "with_conda_set": "set",
                "with_conda": "true",
                "conda_prefix": ENV,
                "path": f"{ENV}/bin:/usr/bin",
            },
            **{"image.conda_prefix": {"python": py(ENV)}},
            with_conda={"rc": "0", "conda_prefix": ENV, "path": f"{ENV}/bin:/usr/bin"},
            **{"with_conda.conda_prefix": {"python": py(ENV)}},
        )
    )
    target = choose(facts=facts)
    assert target.prefix == ENV
    assert "already active in its environment" in target.reason


def test_layout3_venv_over_conda_env_is_the_target_and_keeps_its_base():
    facts = parse_probe(
        text=facts_text(
            image={
                "with_conda_set": "",
                "with_conda": "",
                "virtual_env": VENV,
                "conda_prefix": ENV,
                "path": f"{VENV}/bin:{ENV}/bin:/usr/bin",
            },
            **{
                "image.virtual_env": {"python": py(VENV, base_prefix=ENV)},
                "image.conda_prefix": {"python": py(ENV)},
            },
        )
    )
    target = choose(facts=facts)
    assert (target.prefix, target.source) == (VENV, "active-env")
    assert "VIRTUAL_ENV=" in target.reason
    assert target.env_prefixes == [VENV, ENV]


def test_the_env_first_on_path_wins_between_venv_and_conda():
    facts = parse_probe(
        text=facts_text(
            image={
                "virtual_env": VENV,
                "conda_prefix": ENV,
                "path": f"{ENV}/bin:{VENV}/bin:/usr/bin",
            },
            **{
                "image.virtual_env": {"python": py(VENV)},
                "image.conda_prefix": {"python": py(ENV)},
            },
        )
    )
    assert choose(facts=facts).prefix == ENV


def test_layout4_conda_env_and_explicit_setting():
    cotainr = "/opt/cotainr/conda/envs/conda_container_env"
    facts = parse_probe(text=facts_text(explicit={"python": py(cotainr)}))
    assert choose(facts=facts, conda_env=True).source == "conda-env"
    facts = parse_probe(
        text=facts_text(**layout1_text_states(), explicit={"python": py(ENV)})
    )
    target = choose(facts=facts, explicit=ENV)
    assert (target.prefix, target.source) == (ENV, "setting")


def layout1_text_states():
    return {"image": {"path_python": "/usr/bin/python3"}}


def test_layout5_system_python_only_is_refused_with_the_ways_out():
    facts = parse_probe(
        text=facts_text(
            image={"with_conda_set": "", "path_python": "/usr/bin/python3"},
            **{"image.path_python": {"python": py("/usr")}},
        )
    )
    with pytest.raises(TargetEnvNotFoundError) as info:
        choose(facts=facts)
    text = str(info.value)
    assert "$WITH_CONDA is not set" in text
    assert "/usr/bin/python3 (prefix /usr), a system Python" in text
    assert "--conda-env" in text and "--set target-env.prefix=" in text


def test_explicit_setting_must_name_a_non_system_env():
    with pytest.raises(TargetEnvNotFoundError, match="no working /nope/bin/python"):
        choose(facts=parse_probe(text=""), explicit="/nope")
    facts = parse_probe(text=facts_text(explicit={"python": py("/usr")}))
    with pytest.raises(TargetEnvNotFoundError, match="system Python"):
        choose(facts=facts, explicit="/usr")


def test_a_failing_with_conda_falls_back_to_the_active_env(caplog):
    facts = parse_probe(
        text=facts_text(
            image={
                "with_conda_set": "set",
                "with_conda": "source /x",
                "conda_prefix": ENV,
            },
            **{"image.conda_prefix": {"python": py(ENV)}},
            with_conda={"rc": "1"},
        )
    )
    with caplog.at_level("WARNING", logger="cotainr.cotainr_lumi"):
        target = choose(facts=facts)
    assert target.source == "active-env"
    assert "failed in the container" in caplog.text


def test_probe_script_with_a_real_shell_and_venv(tmp_path):
    """The probe itself (host bash, a real venv activated by WITH_CONDA)."""
    venv = tmp_path / "env"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "WITH_CONDA": f"source {venv}/bin/activate",
        "ROCM_PATH": "/opt/rocm-6.2.4",
        "CONDA_EXE": "/opt/conda/bin/conda",
    }
    proc = subprocess.run(
        ["bash", "-c", PROBE_SCRIPT, "probe", ""],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    target = choose(facts=parse_probe(text=proc.stdout))
    assert target.prefix == str(venv)
    assert target.python == f"{venv}/bin/python"
    assert target.source == "with-conda"
    assert "VIRTUAL_ENV=" in target.reason
    # What other stages need of the image comes with the same answer.
    assert target.image.rocm_path == "/opt/rocm-6.2.4"
    assert target.image.conda_exe == "/opt/conda/bin/conda"
    assert all("libstdc++" in line for line in target.image.libstdcxx_cache)


class ProbeSandbox:
    """A sandbox whose container answers the probe with canned facts."""

    def __init__(self, root, text):
        self.root = root
        self.text = text
        self.commands = []

    def run(self, args, *, env=None, timeout=None):
        self.commands.append(list(args))
        if self.text is None:
            raise CommandError(cmd=args, returncode=255, stdout="", stderr="FATAL")
        return subprocess.CompletedProcess(args, 0, stdout=self.text, stderr="")


def test_one_probe_per_build_fills_the_context(tmp_path):
    text = facts_text(
        image={
            "virtual_env": VENV,
            "path": f"{VENV}/bin:/usr/bin",
            "rocm_path": "/opt/rocm",
            "ldcache": "\tlibstdc++.so.6 (libc6,x86-64) => /usr/lib64/libstdc++.so.6",
        },
        **{"image.virtual_env": {"python": py(VENV, base_prefix=ENV)}},
    )
    sandbox = ProbeSandbox(tmp_path, text)
    answer = imageprobe.probe_build(sandbox=sandbox, build=build_facts())
    target = answer.env
    context = StageContext(sandbox=sandbox, build=build_facts(), target_env=target)
    assert isinstance(target, TargetEnv) and target.prefix == VENV
    assert context.require_target_env(stage="pip") is target
    assert len(sandbox.commands) == 1
    assert target.image.rocm_path == "/opt/rocm"
    assert target.image.libstdcxx_cache == (
        "\tlibstdc++.so.6 (libc6,x86-64) => /usr/lib64/libstdc++.so.6",
    )
    assert answer.labels == {"cotainr-lumi.target-env": VENV}
    recorded = json.loads((tmp_path / TARGET_ENV_FILE.lstrip("/")).read_text())
    assert recorded == json.loads(json.dumps(target.to_dict()))


def test_an_image_without_an_env_is_said_once_by_the_stage_that_needs_one(tmp_path):
    text = facts_text(image={"path_python": "/usr/bin/python3"})
    sandbox = ProbeSandbox(tmp_path, text)
    context = stage_context(sandbox)
    assert context.target_env is None
    with pytest.raises(
        StageError, match="no Python environment to install into"
    ) as info:
        context.require_target_env(stage="pip")
    assert info.value.stage == "pip"
    assert len(sandbox.commands) == 1
    assert not (tmp_path / TARGET_ENV_FILE.lstrip("/")).exists()


def test_a_container_that_does_not_start_fails_the_probe(tmp_path):
    with pytest.raises(StageError, match="could not start the container") as info:
        stage_context(ProbeSandbox(tmp_path, None))
    assert info.value.stage == "target-env" and "FATAL" in str(info.value)


def _plan(tmp_path, **kw):
    base = tmp_path / "base.sif"
    base.write_bytes(b"")
    return make_plan(
        request=BuildRequest(
            image_path=tmp_path / "out.sif", base_image=str(base), **kw
        )
    )


def test_setting_in_plan_and_dry_run_text(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no apptainer: cannot ask
    plan = _plan(tmp_path, settings={"target-env": {"prefix": ENV}, "pip": {}})
    assert plan.target_settings.prefix == ENV
    text = plan_text(plan)
    assert f"target env: {ENV} (named explicitly (target-env.prefix)" in text
    plan = _plan(tmp_path, settings={"pip": {}})
    assert describe.ask_base_image(plan).target is None
    assert "the env its $WITH_CONDA activates" in plan_text(plan)


def test_dry_run_says_what_the_base_image_answered(tmp_path):
    plan = _plan(tmp_path, settings={"pip": {}})

    def text_of(target):
        answer = describe.BaseAnswer(target=target)
        return describe.describe(plan, answer=answer, space=(None, 0))

    text = text_of(choose(facts=layout1()))
    assert (
        f"target env: {ENV} (python 3.12.1 at {ENV}/bin/python; from the base image's $WITH_CONDA"
        in text
    )
    assert f"not the target: {BASE}/bin/python" in text
    missing = TargetEnvNotFoundError("the base image has no Python environment")
    assert "none: the base image has no Python environment" in text_of(missing)


def test_bad_setting_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="target-env.prefix: must be an absolute path"):
        _plan(tmp_path, settings={"target-env": {"prefix": "relative"}, "pip": {}})
    with pytest.raises(InputError, match="target-env.python: unknown setting"):
        _plan(tmp_path, settings={"target-env": {"python": "/x"}, "pip": {}})


def test_setting_from_a_site_profile(tmp_path, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text(
        "version: 1\nsystems:\n  lumi-pt:\n    extends: lumi-g-ext\n"
        f"    settings:\n      target-env: {{prefix: {ENV}}}\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(site))
    plan = make_plan(
        request=BuildRequest(image_path=tmp_path / "o.sif", system="lumi-pt")
    )
    assert plan.target_settings.prefix == ENV


# -- Today's LUMI images: an env only on PATH/PYTHONPATH (issue 19) ------------

AIF = "/opt/venv"
AIF_SITE = f"{AIF}/lib/python3.12/site-packages"


def venv_py(prefix, **extra):
    return {**py(prefix, base_prefix="/usr"), "venv": True, **extra}


def aif_facts(*, path_python=f"{AIF}/bin/python", info=None, pythonpath=AIF_SITE):
    """The LUMI AI Factory layout: /opt/venv via PATH and PYTHONPATH only."""
    info = venv_py(AIF) if info is None else info
    image = {
        "with_conda_set": "",
        "virtual_env": "",
        "conda_prefix": "",
        "path": f"{AIF}/bin:/usr/bin:/bin",
        "pythonpath": pythonpath,
        "path_python": path_python,
    }
    states = {"image.path_python": {"python": info}}
    if pythonpath:
        image["pythonpath_prefix"] = AIF
        states["image.pythonpath_env"] = {"python": venv_py(AIF)}
    return parse_probe(text=facts_text(image=image, **states))


def test_a_venv_first_on_path_is_the_target_after_the_other_rules():
    target = choose(facts=aif_facts())
    assert (target.prefix, target.source) == (AIF, "path-env")
    assert target.reason.startswith(
        f"the first python on the base image's PATH, {AIF}/bin/python, is a venv"
    )
    assert target.env_prefixes == [AIF]  # its base (/usr) is not its env
    assert "[rule 5, path-env]" in target.describe()
    # An explicit setting and an active env still come first.
    facts = aif_facts()
    facts["explicit"] = {"python": py(ENV)}
    assert choose(facts=facts, explicit=ENV).source == "setting"


def test_an_env_only_on_pythonpath_is_found_by_its_site_packages():
    facts = aif_facts(
        path_python="/usr/bin/python3", info={**py("/usr"), "venv": False}
    )
    target = choose(facts=facts)
    assert (target.prefix, target.source) == (AIF, "pythonpath-env")
    assert f"PYTHONPATH starts with the site-packages of {AIF}" in target.reason
    assert target.decoys == {"python on PATH": "/usr/bin/python3 (prefix /usr)"}


@pytest.mark.parametrize(
    "info,words",
    [
        ({**py(BASE), "conda_base": True}, "conda's base env"),
        ({**py("/usr"), "venv": False}, "a system Python"),
        (venv_py("/usr/local/venv"), "a venv under /usr"),
        ({**py("/opt/python3.12")}, "neither a venv nor a conda env"),
    ],
)
def test_decoys_on_path_still_lose_and_are_named_for_what_they_are(info, words):
    path_py = f"{info['prefix']}/bin/python"
    with pytest.raises(TargetEnvNotFoundError) as e:
        choose(facts=aif_facts(path_python=path_py, info=info, pythonpath=""))
    text = str(e.value)
    assert f"`python` on PATH is {path_py} (prefix {info['prefix']}), " in text
    assert words in text.split(". cotainr-lumi")[0]
    assert "--set target-env.prefix=" in text


def test_a_venv_is_never_called_a_system_python():
    facts = aif_facts(pythonpath="")
    facts["image"]["path_python"] = f"{AIF}/bin/python"
    # Even when it cannot be used (no interpreter answered), it is not "system".
    facts["image.path_python"] = {}
    with pytest.raises(TargetEnvNotFoundError) as e:
        choose(facts=facts)
    assert "system Python" not in str(e.value).split(". cotainr-lumi")[0]
    assert f"{AIF}/bin/python (no working interpreter there)" in str(e.value)


def test_a_conda_env_first_on_path_is_taken_but_not_conda_base():
    env = {**py(ENV), "conda_meta": True}
    target = choose(
        facts=aif_facts(path_python=f"{ENV}/bin/python", info=env, pythonpath="")
    )
    assert (target.prefix, target.source) == (ENV, "path-env")
    assert "is a conda env" in target.reason


def test_probe_script_finds_a_path_venv_its_torch_and_the_rocm_version(tmp_path):
    """The real probe (host bash): a venv on PATH and PYTHONPATH only."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.10.0+rocm7.0'\n"
        "hip: Optional[str] = '7.0.51831-a3e329ad8'\n"
    )
    rocm = tmp_path / "rocm"
    (rocm / ".info").mkdir(parents=True)
    (rocm / ".info" / "version").write_text("7.0.2-56\n")
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "PYTHONPATH": str(site)}
    env["ROCM_PATH"] = str(rocm)
    proc = subprocess.run(
        ["bash", "-c", PROBE_SCRIPT, "probe", ""],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    facts = parse_probe(text=proc.stdout)
    target = choose(facts=facts)
    assert (target.prefix, target.source) == (str(venv), "path-env")
    assert target.torch == {
        "dir": f"{site}/torch",
        "version": "2.10.0+rocm7.0",
        "hip": "7.0.51831-a3e329ad8",
    }
    assert target.image.rocm_version == "7.0.2-56"
    assert facts["image"]["pythonpath_prefix"] == str(venv)


def test_probe_keeps_newlines_and_backslashes_of_with_conda(tmp_path):
    """A multi-line $WITH_CONDA reaches the target env as it is (issue 22)."""
    venv = tmp_path / "env"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    with_conda = f"source {venv}/bin/activate\nexport X='a\\nb\\\\c'"
    proc = subprocess.run(
        ["bash", "-c", PROBE_SCRIPT, "probe", ""],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "WITH_CONDA": with_conda},
        check=True,
    )
    facts = parse_probe(text=proc.stdout)
    assert facts["image"]["with_conda"] == with_conda
    target = choose(facts=facts)
    assert target.source == "with-conda"
    assert target.with_conda == with_conda
