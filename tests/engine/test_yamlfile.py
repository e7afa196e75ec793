"""The one reader of users' YAML files (engine/yamlfile.py)."""

import copy

import pytest

from cotainr_lumi.engine.yamlfile import LineDict, LineList, line_of, read_yaml

TEXT = """\
defaults: &d
  x: 1
systems:
  a:
    <<: *d
    settings:
      pip:
        steps:
          - a.txt
          - name: two
            env: {CC: [gcc]}
"""


def read(tmp_path, text):
    path = tmp_path / "f.yaml"
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return read_yaml(path=path, error=ValueError)


def test_lines_of_keys_and_items(tmp_path):
    data = read(tmp_path, TEXT)
    assert isinstance(data["systems"], LineDict)
    assert isinstance(data["systems"]["a"]["settings"]["pip"]["steps"], LineList)
    steps = ("systems", "a", "settings", "pip", "steps")
    assert line_of(data=data, path=steps) == 8
    assert line_of(data=data, path=(*steps, 0)) == 9
    assert line_of(data=data, path=(*steps, 1, "env", "CC")) == 11
    # A merged key has the line of its anchor; a missing key its parent's.
    assert line_of(data=data, path=("systems", "a", "x")) == 2
    assert line_of(data=data, path=("systems", "a", "nope", "deeper")) == 4
    # Plain data (the Python API) has no lines.
    assert line_of(data={"a": 1}, path=("a",)) is None
    assert copy.deepcopy(data) == data


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("a: [1\n", "is not valid YAML at line 2, column 1"),
        (b"a: caf\xe9\n", "is not UTF-8 text (byte 6); save it as UTF-8"),
    ],
)
def test_one_message_per_kind_of_unreadable_file(tmp_path, content, fragment):
    with pytest.raises(
        ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")
    ):
        read(tmp_path, content)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot be read: No such file"):
        read_yaml(path=tmp_path / "nope.yaml", error=ValueError)


def test_empty_file_is_none(tmp_path):
    assert read(tmp_path, "") is None


# ------------------------------------------------------------------ bounds
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cotainr_lumi.engine import yamlfile  # noqa: E402


class _RefusedError(Exception):
    pass


def _read(text):
    return yamlfile.read_yaml_text(text=text, error=_RefusedError)


@given(depth=st.integers(min_value=0, max_value=3000), kind=st.sampled_from("[{"))
@settings(max_examples=60, deadline=None)
def test_any_nesting_is_data_or_one_error(depth, kind):
    close = "]" if kind == "[" else "}"
    opener = "[" if kind == "[" else "{a: "
    text = opener * depth + ("" if kind == "[" else "1") + close * depth
    try:
        _read(text)
    except _RefusedError as e:
        assert depth > yamlfile.MAX_DEPTH - 2 and "nested more than" in str(e)


@given(
    width=st.integers(min_value=1, max_value=12),
    levels=st.integers(min_value=1, max_value=12),
)
@settings(max_examples=60, deadline=None)
def test_alias_trees_are_bounded(width, levels):
    lines = ["l0: &l0 [x]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    text = "\n".join(lines) + "\n"
    expanded = sum(width**i for i in range(levels + 1))
    try:
        data = _read(text)
    except _RefusedError as e:
        assert "aliases" in str(e)
        assert width * levels > yamlfile.MAX_ALIASES or expanded > 1000
    else:
        assert len(data) == levels + 1


def test_a_few_aliases_are_fine():
    data = _read("common: &c {A: 1}\nsteps: [{env: *c}, {env: *c}]\n")
    assert data["steps"][1]["env"] == {"A": 1}
