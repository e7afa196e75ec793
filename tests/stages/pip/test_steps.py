"""Unit tests of cotainr_lumi.stages.pip.steps (pip stage input parsing/validation)."""

from pathlib import Path

import pytest

from cotainr_lumi.engine.origins import Origin
from cotainr_lumi.engine.settings import load_settings
from cotainr_lumi.errors import InputError
from cotainr_lumi.stages.pip.steps import (
    PipSettings,
    PipStep,
    default_cache_dir,
    load_steps_file,
    steps_from_inputs,
)

DEEPSPEED_STEPS = """\
steps:
  - requirements: torch.txt
  - name: DeepSpeed
    packages: ["deepspeed==0.16.4"]
    no-build-isolation: true
    env:
      DS_BUILD_FUSED_ADAM: 1
      PYTORCH_ROCM_ARCH: gfx90a
      CC: gcc-12
    allow-changes: [numpy]
allow-changes: [ninja]
"""


def load(settings, **origin):
    return load_settings(
        schema=PipSettings, raw=settings, origin=Origin(**origin), stage="pip"
    )


def test_valid_settings_are_read_into_steps(tmp_path):
    settings = {
        "steps": [
            "req.txt",
            {
                "requirements": ["a.txt", "b.txt"],
                "packages": ["x==1"],
                "no-build-isolation": True,
                "env": {"MAX_JOBS": 4, "CXX": "g++-12"},
                "pip-args": ["--verbose", "--find-links", "https://example.org/wheels"],
                "index-url": "https://pypi.org/simple",
                "extra-index-urls": ["https://download.pytorch.org/whl/rocm6.2"],
                "allow-changes": ["numpy", "typing_extensions"],
                "name": "x",
            },
        ],
        "cache": False,
        "cache-dir": "/tmp/c",
        "allow-changes": [],
    }
    loaded = load(settings, base_dir=tmp_path)
    assert loaded["cache"] is False and loaded["cache-dir"] == "/tmp/c"
    first, second = loaded["steps"]
    assert first == PipStep(
        number=1,
        source="pip settings, step 1",
        requirements=[tmp_path / "req.txt"],
        base_dir=tmp_path,
    )
    assert second.requirements == [tmp_path / "a.txt", tmp_path / "b.txt"]
    assert second.env == {"MAX_JOBS": "4", "CXX": "g++-12"}
    assert second.allow_changes == {"numpy", "typing-extensions"}
    assert (second.number, second.name, second.no_build_isolation) == (2, "x", True)
    # Read steps pass through the loader unchanged (the plan reads again).
    assert load(loaded)["steps"] == loaded["steps"]


@pytest.mark.parametrize(
    ("settings", "key", "fragment"),
    [
        ({"bogus": 1}, "bogus", "unknown setting"),
        ({"steps": "req.txt"}, "steps", "must be a list"),
        ({"steps": [{"name": "x"}]}, "steps[1]", "needs 'requirements'"),
        (
            {"steps": [{"packages": "torch"}]},
            "steps[1].packages",
            "must be a list of strings",
        ),
        ({"steps": [{"packages": []}]}, "steps[1].packages", "non-empty list"),
        (
            {"steps": [{"packages": ["a"], "colour": 1}]},
            "steps[1].colour",
            "unknown key",
        ),
        (
            {"steps": [{"packages": ["a"], "no-build-isolation": "yes"}]},
            "steps[1].no-build-isolation",
            "true or false",
        ),
        (
            {"steps": [{"packages": ["a"], "env": {"A-B": "1"}}]},
            "steps[1].env",
            "not a variable name",
        ),
        (
            {"steps": [{"packages": ["a"], "env": {"X": True}}]},
            "steps[1].env.X",
            "quote it",
        ),
        (
            {"steps": [{"packages": ["a"], "pip-args": ["-e", "."]}]},
            "steps[1].pip-args",
            "editable",
        ),
        (
            {"steps": [{"packages": ["a"], "pip-args": ["--target=/x"]}]},
            "steps[1].pip-args",
            "image's Python environment",
        ),
        (
            {"steps": [{"packages": ["a"], "pip-args": ["-f", "./wheels"]}]},
            "steps[1].pip-args",
            "requirements file",
        ),
        (
            {"steps": [{"packages": ["a"], "allow-changes": ["no way"]}]},
            "steps[1].allow-changes",
            "not a package name",
        ),
        ({"cache": "yes"}, "cache", "true or false"),
        ({"cache-dir": ""}, "cache-dir", "directory path"),
    ],
)
def test_invalid_settings_name_the_key(settings, key, fragment):
    with pytest.raises(InputError) as info:
        load(settings)
    assert str(info.value).startswith(f"Invalid setting pip.{key}")
    assert fragment in str(info.value)


def test_steps_file_relative_paths_and_allow_changes(tmp_path, monkeypatch):
    steps_dir = tmp_path / "recipes"
    steps_dir.mkdir()
    (steps_dir / "steps.yml").write_text(DEEPSPEED_STEPS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = steps_from_inputs(inputs=[("steps", "../recipes/steps.yml")])
    first, second = settings["steps"]
    assert first.requirements == [steps_dir / "torch.txt"]
    assert first.base_dir == steps_dir
    assert first.source == f"{steps_dir / 'steps.yml'}, step 1"
    assert first.allow_changes == {"ninja"}
    assert second.allow_changes == {"numpy", "ninja"}
    steps = [step.allowing(["pip"]) for step in settings["steps"]]
    assert steps[1].env == {
        "DS_BUILD_FUSED_ADAM": "1",
        "PYTORCH_ROCM_ARCH": "gfx90a",
        "CC": "gcc-12",
    }
    assert steps[1].no_build_isolation is True
    assert steps[1].allow_changes == {"numpy", "ninja", "pip"}
    assert steps[1].title == f"step 2 'DeepSpeed' ({steps_dir / 'steps.yml'}, step 2)"


def test_command_line_inputs_keep_their_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    (tmp_path / "s.yml").write_text("- requirements: c.txt\n")
    settings = steps_from_inputs(
        inputs=[
            ("requirements", "a.txt"),
            ("steps", "s.yml"),
            ("requirements", "b.txt"),
        ]
    )
    assert [s.requirements for s in settings["steps"]] == [
        [tmp_path / "a.txt"],
        [tmp_path / "c.txt"],
        [tmp_path / "b.txt"],
    ]
    assert settings["steps"][0].source == "a.txt"


def test_missing_requirements_file_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"--pip-requirements nope.txt: no such file"):
        steps_from_inputs(inputs=[("requirements", "nope.txt")])


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("steps: [\n", "not valid YAML at line"),
        ("{}", "non-empty 'steps' list"),
        (
            "steps:\n  - packages: [x]\n  - name: ds\n    packages: [y]\n    env: {CC: [gcc]}\n",
            "line 5, step 2 ('ds'), key 'env.CC': must be a string or a number",
        ),
        (
            "steps:\n  - packages: [x]\n    pip-args: [--user]\n",
            "line 3, step 1, key 'pip-args'",
        ),
    ],
)
def test_bad_steps_file_names_file_step_and_key(tmp_path, text, fragment):
    path = tmp_path / "steps.yml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_steps_file(path=path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "cotainr-lumi" / "pip"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "cotainr-lumi" / "pip"


def test_example_steps_express_the_hand_built_apex_and_deepspeed_steps():
    from cotainr_lumi.stages.pip.requirements import scan_step

    example = (
        Path(__file__).parents[3] / "examples" / "pytorch-rocm6.2" / "pip-steps.yml"
    )
    steps = load_steps_file(path=example)["steps"]
    torch, apex, deepspeed = steps[:3]
    assert any(p.startswith("torch==") for p in torch.packages)
    assert apex.no_build_isolation and deepspeed.no_build_isolation
    assert "--config-settings=--build-option=--cuda_ext" in apex.pip_args
    for step in (apex, deepspeed):
        assert step.env["PYTORCH_ROCM_ARCH"] == "gfx90a"
        assert (step.env["CC"], step.env["CXX"]) == ("gcc-12", "g++-12")
    assert {k: v for k, v in deepspeed.env.items() if k.startswith("DS_BUILD")} == {
        "DS_BUILD_OPS": "0",
        "DS_BUILD_FUSED_ADAM": "1",
        "DS_BUILD_FUSED_LAMB": "1",
        "DS_BUILD_FUSED_LION": "1",
        "DS_BUILD_CCL_COMM": "1",
        "DS_BUILD_STOCHASTIC_TRANSFORMER": "1",
    }
    for step in steps:
        scan_step(step=step)  # every reference is valid


def test_non_utf8_steps_file_is_one_clear_error(tmp_path):
    path = tmp_path / "steps.yml"
    path.write_bytes("steps:\n  - packages: [caf\xe9]\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"is not UTF-8 text \(byte 25\)") as info:
        load_steps_file(path=path)
    assert str(path) in str(info.value)
