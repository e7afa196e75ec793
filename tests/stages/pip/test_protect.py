"""Unit tests of cotainr_lumi.stages.pip.protect (protection of installed packages).

The constraint and conflict handling is checked against a real pip (the one
running these tests) resolving fake wheels offline, so the parsed messages are
pip's real ones.
"""

import json
import os
import subprocess
import sys

from pkgfixtures import make_wheel
import pytest

from cotainr_lumi.errors import StageError
from cotainr_lumi.stages.pip.protect import (
    check_protected,
    constraints_text,
    describe_changes,
    explain_conflicts,
    parse_pip_check,
    parse_pip_list,
)
from cotainr_lumi.stages.pip.steps import PipStep

PIP_LIST = [
    {"name": "torch", "version": "2.13.0+cpu"},
    {"name": "NumPy", "version": "1.26.4"},
    {"name": "pip", "version": "23.0.1"},
]
INSTALLED, LISTED = parse_pip_list(text=f"WARNING: noise\n{json.dumps(PIP_LIST)}\n")


def test_parse_pip_list_uses_canonical_names():
    assert INSTALLED == {
        "torch": ("torch", "2.13.0+cpu"),
        "numpy": ("NumPy", "1.26.4"),
        "pip": ("pip", "23.0.1"),
    }
    assert LISTED == PIP_LIST
    with pytest.raises(ValueError, match="no package list"):
        parse_pip_list(text="ERROR: boom\n")


def test_constraints_pin_everything_but_allowed():
    text = constraints_text(installed=INSTALLED, allowed={"pip"})
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == ["NumPy==1.26.4", "torch==2.13.0+cpu"]
    assert "# pip==23.0.1  (allow-changes)" in text


def test_non_pep440_versions_are_not_pinned():
    installed = {"odd": ("odd", "1.0-custom-build")}
    text = constraints_text(installed=installed, allowed=set())
    assert "odd==" not in text


def test_changed_distributions_and_summary():
    before = INSTALLED
    after = {
        "torch": ("torch", "2.12.0"),
        "pip": ("pip", "24.0"),
        "sympy": ("sympy", "1.14.0"),
    }
    step = PipStep(number=1, source="s.yml", allow_changes=frozenset({"pip"}))
    with pytest.raises(StageError) as info:
        check_protected(step=step, before=before, after=after)
    assert str(info.value).endswith(
        "step 1 (s.yml) changed protected package(s) NumPy, torch despite the "
        "constraints:\n  NumPy 1.26.4 -> removed\n  torch 2.13.0+cpu -> 2.12.0\n"
        "Add 'allow-changes: [NumPy, torch]' to the step if this is intended."
    )
    check_protected(step=step, before=before, after=before)
    assert describe_changes(before=before, after=after) == {
        "added": {"sympy": "1.14.0"},
        "changed": {"torch": ["2.13.0+cpu", "2.12.0"], "pip": ["23.0.1", "24.0"]},
        "removed": ["NumPy"],
    }


def test_explain_conflict_blocks():
    output = (
        "ERROR: Cannot install -r /x/req.txt (line 1) and foo==1.0 because these "
        "package versions have conflicting dependencies.\n\n"
        "The conflict is caused by:\n"
        "    The user requested torch==2.12.0\n"
        "    foo 1.0 depends on torch<2.13\n"
        "    The user requested (constraint) torch==2.13.0+cpu\n"
        "\nTo fix this you could try to:\n"
    )
    (conflict,) = explain_conflicts(output=output, installed=INSTALLED, allowed=set())
    assert conflict.name == "torch"
    assert conflict.installed == "2.13.0+cpu"
    assert conflict.wanted == ["torch==2.12.0", "foo 1.0 depends on torch<2.13"]
    assert "torch 2.13.0+cpu is installed" in conflict.describe()
    assert (
        explain_conflicts(output=output, installed=INSTALLED, allowed={"torch"}) == []
    )
    assert (
        explain_conflicts(
            output="ERROR: no such thing", installed=INSTALLED, allowed=set()
        )
        == []
    )


def test_explain_not_found_of_protected_package():
    output = (
        "ERROR: Could not find a version that satisfies the requirement "
        "numpy>=2 (from foo) (from versions: 1.26.4)\n"
    )
    (conflict,) = explain_conflicts(output=output, installed=INSTALLED, allowed=set())
    assert (conflict.name, conflict.wanted) == ("NumPy", ["numpy>=2 (from foo)"])


@pytest.fixture
def offline_pip(tmp_path):
    """Run the test interpreter's pip offline against fake wheels."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "torch", "2.13.0+cpu")
    make_wheel(wheels, "torch", "2.14.0")
    make_wheel(wheels, "torch", "2.12.0")
    make_wheel(wheels, "needs-torch", "1.0", requires=["torch"])
    make_wheel(wheels, "old-torch-user", "1.0", requires=["torch<2.13"])
    constraints = tmp_path / "protected.txt"
    constraints.write_text(constraints_text(installed=INSTALLED, allowed=set()))
    report = tmp_path / "report.json"

    def run(*requirements):
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
        env.pop("PIP_FIND_LINKS", None)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--no-index",
                "--find-links",
                str(wheels),
                "--report",
                str(report),
                "-c",
                str(constraints),
                *requirements,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    run.report = report
    return run


def test_real_pip_keeps_the_installed_local_version(offline_pip):
    proc = offline_pip("needs-torch")
    assert proc.returncode == 0, proc.stderr
    chosen = {
        item["metadata"]["name"]: item["metadata"]["version"]
        for item in json.loads(offline_pip.report.read_text())["install"]
    }
    # Without the constraint pip would pick torch 2.14.0.
    assert chosen["torch"] == "2.13.0+cpu"


@pytest.mark.parametrize(
    ("requirement", "wanted"),
    [
        ("torch==2.12.0", "torch==2.12.0"),
        ("old-torch-user", "old-torch-user 1.0 depends on torch<2.13"),
    ],
)
def test_real_pip_conflicts_are_explained(offline_pip, requirement, wanted):
    proc = offline_pip(requirement)
    assert proc.returncode != 0
    conflicts = explain_conflicts(
        output=proc.stdout + proc.stderr, installed=INSTALLED, allowed=set()
    )
    assert [c.name for c in conflicts] == ["torch"], proc.stderr
    assert conflicts[0].installed == "2.13.0+cpu"
    assert any(wanted in w for w in conflicts[0].wanted), conflicts[0].wanted


def test_parse_pip_check_lines_of_real_pip():
    text = (
        "x 1.0 has requirement y>=2, but you have y 1.0.\n"
        "x 1.0 requires z, which is not installed.\n"
        'a-b 2.0 has requirement numpy<2,>=1.2; python_version >= "3.9", '
        "but you have numpy 2.1.0.\n"
        "win-only 1.0 is not supported on this platform\n"
    )
    assert parse_pip_check(text=text) == [
        ("x 1.0", "has requirement y>=2, but you have y 1.0", ["x", "y"]),
        ("x 1.0", "requires z, which is not installed", ["x", "z"]),
        (
            "a-b 2.0",
            'has requirement numpy<2,>=1.2; python_version >= "3.9", but you have '
            "numpy 2.1.0",
            ["a-b", "numpy"],
        ),
        ("win-only 1.0", "is not supported on this platform", ["win-only"]),
    ]
    assert parse_pip_check(text="No broken requirements found.\n") == []
