"""Tests of the get-master runscript (real bash) and of its reference, tests/nodelist.py.

Node lists are generated from a model (host expressions with bracket groups
of ranges); the expected hosts come from the model, and both the Python
reference and the bash script must produce them.
"""

import itertools
from pathlib import Path
import subprocess
import sys

from hosttools import need_tool
from hypothesis import given, settings
from hypothesis import strategies as st
from nodelist import NodelistError, expand_nodelist, first_host
import pytest

import cotainr_lumi

GET_MASTER = (
    Path(cotainr_lumi.__file__).parent
    / "stages"
    / "lumi_env"
    / "runscripts"
    / "get-master"
)

TEXT = st.text(alphabet="abcxyz019-_.", min_size=0, max_size=4)


@st.composite
def ranges(draw):
    lo = draw(st.integers(0, 120))
    hi = lo + draw(st.integers(0, 3))
    width = draw(st.integers(1, 6))
    lo_text = str(lo).zfill(width)
    hi_text = str(hi).zfill(draw(st.integers(1, 6)))
    text = lo_text if lo == hi and draw(st.booleans()) else f"{lo_text}-{hi_text}"
    return text, [str(n).zfill(len(lo_text)) for n in range(lo, hi + 1)]


@st.composite
def host_expressions(draw):
    n_groups = draw(st.integers(0, 2))
    texts = [draw(TEXT) for _ in range(n_groups + 1)]
    if n_groups == 0 and not texts[0]:
        texts[0] = "n"
    groups = [draw(st.lists(ranges(), min_size=1, max_size=3)) for _ in range(n_groups)]
    rendered = texts[0]
    for group, text in zip(groups, texts[1:]):
        rendered += "[" + ",".join(r[0] for r in group) + "]" + text
    numbers = [[n for r in group for n in r[1]] for group in groups]
    hosts = []
    for combo in itertools.product(*numbers):
        name = texts[0]
        for number, text in zip(combo, texts[1:]):
            name += number + text
        hosts.append(name)
    return rendered, hosts


@st.composite
def nodelists(draw):
    items = draw(st.lists(host_expressions(), min_size=1, max_size=4))
    return ",".join(i[0] for i in items), [h for i in items for h in i[1]]


def run_get_master(*args, env=None):
    return subprocess.run(
        ["bash", str(GET_MASTER), *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


@settings(max_examples=150, deadline=None)
@given(nodelists())
def test_python_reference_matches_model(case):
    nodelist, hosts = case
    assert expand_nodelist(nodelist) == hosts
    assert first_host(nodelist) == hosts[0]


@settings(max_examples=80, deadline=None)
@given(nodelists())
def test_get_master_bash_matches_python_reference(case):
    nodelist, hosts = case
    first = run_get_master("--", nodelist)
    assert first.returncode == 0, first.stderr
    assert first.stdout == hosts[0] + "\n"
    every = run_get_master("--all", "--", nodelist)
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, expected",
    [
        (
            "nid[005252-005254,005256],nid007000",
            ["nid005252", "nid005253", "nid005254", "nid005256", "nid007000"],
        ),
        ("nid[8-10]", ["nid8", "nid9", "nid10"]),
        ("nid[08-10]", ["nid08", "nid09", "nid10"]),
        ("a[1-2]b[7,9]", ["a1b7", "a1b9", "a2b7", "a2b9"]),
        ("login1,gpu[3],cpu[0001-0002]", ["login1", "gpu3", "cpu0001", "cpu0002"]),
        ("  nid001 ", ["nid001"]),
    ],
)
def test_examples(nodelist, expected):
    assert expand_nodelist(nodelist) == expected
    assert run_get_master("--all", nodelist).stdout.splitlines() == expected


@pytest.mark.parametrize(
    "nodelist",
    [
        "",
        "a,,b",
        "a[]",
        "a[1,]",
        "a[2-1]",
        "a[1",
        "a]",
        "a[[1]]",
        "a[x]",
        "a[1-]",
        ",a",
        "a b",
    ],
)
def test_malformed_lists_are_rejected_by_both(nodelist):
    with pytest.raises(NodelistError):
        expand_nodelist(nodelist)
    for args in (["--", nodelist], ["--all", "--", nodelist]):
        proc = run_get_master(*args)
        assert proc.returncode == 2
        assert proc.stdout == ""
        assert proc.stderr.startswith("get-master: ")


def test_get_master_reads_slurm_variables():
    proc = run_get_master(
        env={"SLURM_JOB_NODELIST": "nid[000100-000103]", "SLURM_NODELIST": "x"}
    )
    assert proc.stdout == "nid000100\n"
    proc = run_get_master(env={"SLURM_NODELIST": "nid[7-8]"})
    assert proc.stdout == "nid7\n"
    proc = run_get_master()
    assert proc.returncode == 2 and "SLURM_JOB_NODELIST" in proc.stderr


def test_runscripts_pass_bash_n():
    for script in GET_MASTER.parent.iterdir():
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_runscripts_are_shellcheck_clean():
    shellcheck = need_tool("shellcheck", install="apt-get install -y shellcheck")
    for script in GET_MASTER.parent.iterdir():
        proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_first_host_does_not_expand_the_ranges():
    # Run in a child process with a time limit: expanding 10^11 hosts would
    # never finish (and would fill the memory).
    code = (
        "from nodelist import first_host\n"
        "print(first_host('n[0-99999999999],m[5-6]'))\n"
        "print(first_host('a[0009-99999999999]b[3-999999999999]c'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(Path(__file__).parents[2])},  # tests/
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["n0", "a0009b3c"]
    first = run_get_master("--", "a[0009-99999999999]b[3-999999999999]c")
    assert first.stdout == "a0009b3c\n"


@pytest.mark.parametrize(
    "nodelist",
    [
        "n[18446744073709551617]",
        "n[9223372036854775808]",
        "n[1-18446744073709551617]",
        "n[0001000000000000000000]",
        "a,n[5,99999999999999999999999]",
    ],
)
def test_numbers_too_large_for_bash_are_rejected_by_both(nodelist):
    with pytest.raises(NodelistError, match="too large"):
        first_host(nodelist)
    with pytest.raises(NodelistError, match="too large"):
        expand_nodelist(nodelist)
    for args in (["--", nodelist], ["--all", "--", nodelist]):
        proc = run_get_master(*args)
        assert proc.returncode == 2 and proc.stdout == ""
        assert "too large (more than 18 digits)" in proc.stderr


def test_largest_numbers_give_the_same_host_in_both():
    big = "9" * 18  # nodelist.MAX_DIGITS
    nodelist = f"n[{big}],m[00000000000000000000000{big}]"
    expected = [f"n{big}", f"m00000000000000000000000{big}"]
    assert expand_nodelist(nodelist) == expected
    assert first_host(nodelist) == expected[0]
    assert run_get_master("--all", "--", nodelist).stdout.splitlines() == expected


@pytest.mark.parametrize(
    "nodelist", ["a\n,b", "n[5\n]", "n[5,\n6]", "a\x0bb", "n[1]\x0cx,b"]
)
def test_white_space_inside_is_rejected_by_both(nodelist):
    with pytest.raises(NodelistError):
        first_host(nodelist)
    assert run_get_master("--", nodelist).returncode == 2


# Hostile text: every character the grammar cares about, white space,
# control characters and non-ASCII; both implementations must agree on
# rejecting it or on its first host.
HOSTILE = st.text(
    alphabet=st.sampled_from(list("n0159[]-,, \t\n\x0b\x1c\x1f$`'\"\\*é")),
    max_size=14,
)


@settings(max_examples=150, deadline=None)
@given(HOSTILE)
def test_fuzz_python_and_bash_agree_on_hostile_node_lists(nodelist):
    try:
        expected = first_host(nodelist) + "\n"
    except NodelistError:
        expected = None
    proc = run_get_master("--", nodelist)
    if expected is None:
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.startswith("get-master: ")
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == expected


# --- Size: get-master is linear in the node list -------------------------------
#
# Linux limits one argument or environment string to 128 KiB, so Slurm never
# hands over a longer list; the 200 KB lists are read from a file by a small
# bash wrapper that sources get-master with the list as its argument. The
# bound is the subprocess timeout, not a timing assertion: the quadratic
# script took 6 s for 21 KB and minutes for these.
SIZE = 200_000
BOUND = 60  # seconds; the linear script needs well under one

_SOURCE_WITH_LIST = (
    'list=$(<"$1"); script=$2; shift 2; set -- "$@" -- "$list"; . "$script"'
)


def _repeat(make, size=SIZE):
    """`make(i)` for i = 0, 1, ... joined with commas, about `size` bytes."""
    parts, total, i = [], -1, 0
    while total < size:
        part = make(i)
        parts.append(part)
        total += len(part) + 1
        i += 1
    return ",".join(parts)


BIG_LISTS = {
    "many hosts": lambda: _repeat(lambda i: f"nid{i:06d}"),
    "one group, many numbers": lambda: "nid[" + _repeat(lambda i: f"{2 * i:06d}") + "]",
    "one group, many ranges": lambda: (
        "nid[" + _repeat(lambda i: f"{3 * i:06d}-{3 * i + 1:06d}") + "]"
    ),
    "many groups": lambda: _repeat(lambda i: f"nid[{i:06d}-{i + 1:06d},{i + 5}]"),
    "many groups in one host": lambda: "".join(
        f"x{i % 10}[{i % 7}]" for i in range(SIZE // 5 + 1)
    ),
    "one long host name": lambda: "n" * SIZE,
    "long leading zeros": lambda: "n[" + "0" * SIZE + "7-" + "0" * 10 + "9],m",
    "white space around": lambda: " " * (SIZE // 2) + "nid[1-2]" + "\t" * (SIZE // 2),
    "bad at the end": lambda: _repeat(lambda i: f"nid{i:06d}") + ",n[1-",
    "comma after many": lambda: _repeat(lambda i: f"a[{i}]b") + ",",
}


def run_get_master_on_file(tmp_path, nodelist, *args):
    path = tmp_path / "nodelist"
    path.write_text(nodelist)
    return subprocess.run(
        ["bash", "-c", _SOURCE_WITH_LIST, "bash", str(path), str(GET_MASTER), *args],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("shape", BIG_LISTS)
def test_get_master_on_a_200kb_node_list_completes(tmp_path, shape):
    nodelist = BIG_LISTS[shape]()
    assert len(nodelist) >= SIZE
    try:
        expected = first_host(nodelist) + "\n"
    except NodelistError:
        expected = None
    proc = run_get_master_on_file(tmp_path, nodelist)
    if expected is None:
        assert proc.returncode == 2 and proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1
        assert proc.stderr.startswith("get-master: ")
        assert len(proc.stderr) < 1000  # the list is not repeated in full
    else:
        assert proc.returncode == 0, proc.stderr[:500]
        assert proc.stdout == expected


@pytest.mark.parametrize(
    "shape", ["many hosts", "one group, many ranges", "many groups in one host"]
)
def test_get_master_all_on_a_200kb_node_list_completes(tmp_path, shape):
    nodelist = BIG_LISTS[shape]()
    proc = run_get_master_on_file(tmp_path, nodelist, "--all")
    assert proc.returncode == 0, proc.stderr[:500]
    assert proc.stdout.splitlines() == expand_nodelist(nodelist)


def test_get_master_reads_a_120kb_slurm_variable(tmp_path):
    # The longest value the kernel passes on (128 KiB per string).
    nodelist = _repeat(lambda i: f"nid{i:06d}", size=120_000)
    proc = subprocess.run(
        ["bash", str(GET_MASTER)],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_NODELIST": nodelist},
    )
    assert proc.returncode == 0, proc.stderr[:500]
    assert proc.stdout == "nid000000\n"


@st.composite
def long_nodelists(draw):
    items = draw(st.lists(host_expressions(), min_size=1, max_size=40))
    return ",".join(i[0] for i in items), [h for i in items for h in i[1]]


@settings(max_examples=25, deadline=None)
@given(long_nodelists())
def test_get_master_matches_the_reference_on_longer_lists(case):
    nodelist, hosts = case
    every = run_get_master("--all", "--", nodelist)
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == expand_nodelist(nodelist) == hosts
    assert run_get_master("--", nodelist).stdout == hosts[0] + "\n"
