"""Stage settings declared once and read by one loader (engine/settings.py)."""

from dataclasses import FrozenInstanceError, dataclass
from typing import Any, Optional

import pytest

from cotainr_lumi.engine.origins import (
    FileOrigin,
    Origin,
    ProfileOrigin,
    dotted,
)
from cotainr_lumi.engine.settings import (
    SettingError,
    StageSettings,
    convert,
    load_sections,
    load_settings,
    setting,
)
from cotainr_lumi.engine.stage import Stage
from cotainr_lumi.engine.yamlfile import read_yaml
from cotainr_lumi.errors import InputError, ProfileError
from cotainr_lumi.pipeline.profiles import sections


def _no_dots(value):
    if "." in value:
        raise ValueError(f"{value!r} contains a dot")


@dataclass(frozen=True)
class DemoSettings(StageSettings):
    strict: bool = setting(False, doc="fail instead of warning")
    dir_name: Optional[str] = setting(None, doc="a directory", check=_no_dots)
    names: list[str] = setting(["a"], doc="names")
    env: dict[str, Any] = setting({}, doc="variables")
    jobs: int = setting(1, doc="parallel jobs")


class DemoStage(Stage):
    name = "test-settings-demo"
    settings_class = DemoSettings

    def run(self, *, context):
        raise AssertionError("not run")


def load_tree(*, raw, origin):
    """The one loader over the settings tree, with the demo stage in it."""
    tree = {**sections(), DemoStage.name: DemoSettings}
    return load_sections(sections=tree, raw=raw, origin=origin)


def test_declaration_gives_keys_types_defaults_and_docs():
    declared = DemoSettings.declared()
    assert list(declared) == ["strict", "dir-name", "names", "env", "jobs"]
    assert declared["dir-name"].type == Optional[str]
    assert declared["names"].default == ["a"]
    assert declared["strict"].doc == "fail instead of warning"


def test_complete_fills_defaults_and_round_trips():
    settings = DemoSettings.complete({"dir-name": "x"})
    assert settings == DemoSettings(dir_name="x")
    assert settings.to_dict() == {
        "strict": False,
        "dir-name": "x",
        "names": ["a"],
        "env": {},
        "jobs": 1,
    }
    assert DemoSettings.complete().names is not DemoSettings.complete().names
    with pytest.raises(FrozenInstanceError):
        settings.strict = True


@pytest.mark.parametrize(
    ("type_", "value", "message", "path"),
    [
        (bool, "yes", "must be true or false (got 'yes')", ()),
        (int, True, "must be an integer (got True)", ()),
        (Optional[str], 3, "must be a string or null (got 3)", ()),
        (list[str], "a", "must be a list of strings (got 'a')", ()),
        (list[str], ["a", 1], "must be a string (got 1)", (1,)),
        (dict[str, int], {"a": "x"}, "must be an integer (got 'x')", ("a",)),
        (dict[str, int], {1: 1}, "1 is not a string", (1,)),
    ],
)
def test_a_value_that_does_not_fit_its_type(type_, value, message, path):
    with pytest.raises(SettingError) as info:
        convert(type_=type_, value=value)
    assert (info.value.message, info.value.path) == (message, path)


def test_values_that_fit_are_copied():
    value = ["a"]
    assert convert(type_=list[str], value=value) == value
    assert convert(type_=list[str], value=value) is not value
    assert convert(type_=float, value=2) == 2
    assert convert(type_=Any, value=object) is object


def test_dotted_paths_count_from_one():
    assert dotted(("pip", "steps", 1, "env", "CC")) == "pip.steps[2].env.CC"


def test_one_loader_one_error_per_problem():
    def load(raw, origin=None):
        return load_settings(
            schema=DemoSettings,
            raw=raw,
            origin=origin or Origin(),
            stage="demo",
        )

    assert load({"strict": True, "names": []}) == {"strict": True, "names": []}
    assert load(None) == {}
    with pytest.raises(InputError, match=r"Invalid setting demo.strict: must be true"):
        load({"strict": "yes"})
    with pytest.raises(InputError, match=r"demo.stirct: unknown setting \(known: "):
        load({"stirct": True})
    with pytest.raises(InputError, match="did you mean 'strict'"):
        load({"stirct": True})
    with pytest.raises(InputError, match=r"demo.dir-name: 'a.b' contains a dot"):
        load({"dir-name": "a.b"})
    with pytest.raises(InputError, match=r"demo.names\[2\]: must be a string"):
        load({"names": ["a", 2]})
    with pytest.raises(InputError, match=r"Invalid setting demo: must be a mapping"):
        load(["strict"])


def test_errors_name_the_option():
    origin = Origin(option="--set 'x=y'")
    with pytest.raises(InputError) as info:
        load_tree(raw={"test-settings-demo": {"jobs": "4"}}, origin=origin)
    assert str(info.value) == (
        "Invalid setting test-settings-demo.jobs (--set 'x=y'): "
        "must be an integer (got '4')"
    )
    with pytest.raises(InputError, match=r"test-settings-dmeo \(--set 'x=y'\): "):
        load_tree(raw={"test-settings-dmeo": {}}, origin=origin)
    with pytest.raises(InputError, match="Invalid settings: must map stage names"):
        load_tree(raw=["x"], origin=Origin())


def test_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "systems.yaml"
    path.write_text(
        "systems:\n  s:\n    settings:\n      test-settings-demo:\n"
        "        names: [a, b]\n        env: {A: 1}\n        jobs: many\n"
    )
    data = read_yaml(path=path, error=ValueError)
    definition = data["systems"]["s"]
    origin = ProfileOrigin(file=path, system="s", data=definition)
    with pytest.raises(ProfileError) as info:
        load_tree(raw=definition["settings"], origin=origin)
    assert str(info.value) == (
        f"Invalid system profile (file {path}, line 7, system 's', key "
        "'settings.test-settings-demo.jobs'): must be an integer (got 'many')"
    )
    assert info.value.line == 7

    steps = tmp_path / "demo.yaml"
    steps.write_text("strict: true\nnames:\n  - a\n  - [b]\n")
    data = read_yaml(path=steps, error=ValueError)
    origin = FileOrigin(file=steps, data=data, what="demo file")
    assert origin.base_dir == tmp_path
    with pytest.raises(InputError) as info:
        load_settings(schema=DemoSettings, raw=data, origin=origin, stage="demo")
    assert str(info.value) == (
        f"Invalid demo file {steps}, line 4, key 'names[2]': "
        "must be a string (got ['b'])."
    )


def test_a_stage_reads_its_settings_once():
    assert DemoStage().settings == DemoSettings()
    stage = DemoStage(settings={"names": ["x"]})
    assert stage.settings.names == ["x"]
    settings = DemoSettings(jobs=3)
    assert DemoStage(settings=settings).settings is settings
    with pytest.raises(InputError, match="test-settings-demo.jobs"):
        DemoStage(settings={"jobs": None})


def test_every_stage_declares_its_settings_with_docs():
    tree = sections()
    assert {
        "pip",
        "prune",
        "lumi-env",
        "provenance",
        "target-env",
        "rocm",
        "build",
    } <= set(tree)
    for name, schema in tree.items():
        for key, spec in schema.declared().items():
            assert spec.doc, f"{name}.{key} has no doc"
