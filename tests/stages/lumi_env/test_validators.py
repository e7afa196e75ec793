"""Tests of cotainr_lumi.stages.lumi_env.validators: the room's validators, a leaf."""

import ast
from pathlib import Path

import pytest

from cotainr_lumi.stages.lumi_env import validators


def test_validators_is_a_leaf_of_the_room():
    tree = ast.parse(Path(validators.__file__).read_text())
    imported = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert imported == []


@pytest.mark.parametrize(
    ("value", "rule", "problem"),
    [
        ("/a/b", {}, None),
        ("a/b", {}, "must be an absolute path"),
        ("a b", {"absolute": False}, "without ',', ':', white space"),
        ("a b", {"absolute": False, "spaces": True}, None),
        ("/a\x07", {"spaces": True}, "or control characters"),
        ("", {"absolute": False}, "must be non-empty text"),
        (3, {}, "(got 3)"),
    ],
)
def test_text_problem(value, rule, problem):
    found = validators.text_problem(value, what="x", **rule)
    if problem is None:
        assert found is None
    else:
        assert problem in found and found.startswith("x must be")
