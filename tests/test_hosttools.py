"""The host-tool policy of the test suite, checked on its source.

A test that needs a host tool (Lmod, shellcheck, gcc, a file put on the
machine by hand) goes through ``hosttools.py``: a failure in CI, a skip with
the install command elsewhere. A bare ``assert`` on the tool, a
``shutil.which`` of its own or a plain ``pytest.skip`` turns a fresh
machine's first test run red (or hides a missing tool in CI). This scan
finds such code in ``tests/``; a line that really means something else says
so with ``# hosttools: ok (why)``.
"""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ALLOW = "# hosttools: ok"
#: Words in an assert message that mark it as a host-tool check.
TOOL_HINTS = ("install", "is needed", "not found", "missing on this machine")


def _is_call_to(node, *names):
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in names


def _string_constants(node):
    return [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _mentions_a_tool(node):
    text = " ".join(_string_constants(node)).lower()
    return any(hint in text for hint in TOOL_HINTS)


def host_tool_problems(source, *, filename="<test>"):
    """(line, what) for each bare host-tool check in `source`."""
    lines = source.splitlines()
    problems = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        what = None
        if isinstance(node, ast.Call) and _is_call_to(node, "which"):
            what = "which() outside hosttools.py: use need_tool()"
        elif isinstance(node, ast.Call) and _is_call_to(
            node, "skip", "skipif", "importorskip"
        ):
            what = "a skip outside hosttools.py: use unavailable()/need_*()"
        elif isinstance(node, ast.Assert) and node.msg is not None:
            if _mentions_a_tool(node.msg):
                what = "an assert on a host tool: use need_tool()/need_file()"
        elif isinstance(node, ast.Call) and _is_call_to(node, "fail"):
            if any(_mentions_a_tool(arg) for arg in node.args):
                what = "pytest.fail on a host tool: use need_tool()/need_file()"
        if what and ALLOW not in lines[node.lineno - 1]:
            problems.append((node.lineno, what))
    return sorted(problems)


def test_no_bare_host_tool_checks_in_the_tests():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in ("hosttools.py", Path(__file__).name):
            continue
        for line, what in host_tool_problems(path.read_text(), filename=str(path)):
            found.append(f"{path.relative_to(TESTS.parent)}:{line}: {what}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'assert LMOD_INIT.exists(), "Lmod is needed: apt-get install -y lmod"\n',
        'assert shutil.which("shellcheck")\n',
        'SHELLS = [s for s in ("bash", "zsh") if shutil.which(s)]\n',
        'if not TOOL.is_file():\n    pytest.skip("no tool")\n',
        '@pytest.mark.skipif(not HAVE_GCC, reason="gcc")\ndef test_x():\n    pass\n',
        'assert WHEEL.is_file(), f"{WHEEL} is missing on this machine"\n',
        'if not WHEEL.is_file():\n    pytest.fail(f"{WHEEL} is missing on this machine")\n',
    ],
)
def test_the_scan_finds_bare_host_tool_checks(source):
    assert len(host_tool_problems(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "lmod = need_lmod()\nassert lmod.is_file()\n",
        'gcc = need_tool("gcc", install="apt-get install -y gcc")\n',
        "assert proc.returncode == 0, proc.stderr\n",
        'pytest.fail(f"step {n} did not finish", pytrace=False)\n',
        'assert "installed 42" in out, out\n',
        'p = shutil.which("apptainer")  # hosttools: ok (checks the fixture)\n',
    ],
)
def test_the_scan_leaves_other_code_alone(source):
    assert host_tool_problems(source) == []
