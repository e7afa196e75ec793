"""Tests of the conda-python-distributed runscript (real bash) under hostile Slurm values.

The script ends with ``exec python "$@"``; a fake ``python`` on PATH prints
the variables named by its arguments instead, and a fake ``id`` gives the
user name. Slurm integers (SLURM_LOCALID, SLURM_NODEID, SLURM_PROCID,
SLURM_NTASKS, SLURM_JOB_ID, the tasks-per-node list) are read as decimal
numbers or rejected with one message; no value gives a bash error, and the
MIOpen cache is always a private directory directly under /tmp: with two real
users, no directory or link of the other user's is ever used, even when the
other user races the script with a mkdir/rmdir loop.
"""

import os
from pathlib import Path
import re
import shutil
import subprocess
import tempfile
import uuid

from hosttools import as_user, racing_user, real_users, remove_dirs_of
from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

import cotainr_lumi

RUNSCRIPTS = Path(cotainr_lumi.__file__).parent / "stages" / "lumi_env" / "runscripts"
SCRIPT = RUNSCRIPTS / "conda-python-distributed"

#: Prints NAME=VALUE (or NAME unset) for every argument.
FAKE_PYTHON = """#!/bin/bash
for n in "$@"; do
    if [[ -v $n ]]; then printf '%s=%s\\n' "$n" "${!n}"; else printf '%s unset\\n' "$n"; fi
done
"""

NAMES = [
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "ROCR_VISIBLE_DEVICES",
    "MIOPEN_USER_DB_PATH",
    "MIOPEN_CUSTOM_CACHE_DIR",
]

SLURM = {
    "SLURM_JOB_ID": "4242424",
    "SLURM_JOB_NODELIST": "nid[005252-005254,005256],nid007000",
    "SLURM_PROCID": "13",
    "SLURM_LOCALID": "5",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "40",
    "SLURM_TASKS_PER_NODE": "8(x5)",
    "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}

# A bash error message ("line 7: 08: value too great for base", "syntax
# error", "unbound variable", "command not found").
BASH_ERROR = re.compile(r"line [0-9]+:|syntax error|unbound variable|not found|bash:")


#: Prints $FAKE_USER for -un, the real answer otherwise (the cache's owner).
FAKE_ID = """#!/bin/bash
if [[ ${1:-} == -un ]]; then printf '%s\\n' "$FAKE_USER"; else exec /usr/bin/id "$@"; fi
"""

#: A user name unique to this test module: the per-node caches made under
#: /tmp for it are removed by the `cleanup_tmp` fixture.
CLEANUP_USER = f"cltest-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def fakebin(tmp_path_factory):
    path = tmp_path_factory.mktemp("fakebin")
    for name, text in (("python", FAKE_PYTHON), ("id", FAKE_ID)):
        (path / name).write_text(text)
        (path / name).chmod(0o755)
    return path


@pytest.fixture(scope="module", autouse=True)
def cleanup_tmp():
    """Remove the per-node caches the script made for this module's user.

    Only this module's own names: the series check runs two suites at once,
    and a glob over every ``cltest*`` directory removed the other run's
    caches under it (a FileNotFoundError in CI's 0002-alone row).
    """
    yield
    for entry in Path("/tmp").glob(f"{CLEANUP_USER}-*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def run(fakebin, env=None, *, user=CLEANUP_USER):
    """Run the script with the Slurm values and `env`; return (proc, values)."""
    env = {**SLURM, **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}
    proc = subprocess.run(
        ["bash", str(SCRIPT), *NAMES],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{fakebin}:/usr/bin:/bin", "FAKE_USER": user, **env},
    )
    values = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name] = value
    return proc, values


def assert_one_message(proc):
    """Exit status 2 and exactly one line, from the script, on stderr."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("conda-python-distributed: "), proc.stderr
    assert not BASH_ERROR.search(proc.stderr), proc.stderr
    assert proc.stdout == ""


def test_slurm_values_become_torch_variables(fakebin):
    proc, got = run(fakebin)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert got["MASTER_ADDR"] == "nid005252"
    assert got["MASTER_PORT"] == str(20000 + 4242424 % 12000)
    assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"]) == ("13", "5", "40")
    assert (got["NODE_RANK"], got["LOCAL_WORLD_SIZE"]) == ("1", "8")
    assert got["ROCR_VISIBLE_DEVICES"] == "5"
    assert got["MIOPEN_USER_DB_PATH"] == f"/tmp/{CLEANUP_USER}-miopen-cache-4242424-1"


# --- Finding 4: Slurm integers are decimal (08, 09), or one message ---------


TWELVE_GPUS = ",".join(str(n) for n in range(10, 22))


@pytest.mark.parametrize("value", ["08", "09", "0009", "010", "00"])
def test_localid_with_leading_zeros_is_decimal(fakebin, value):
    # Today: "value too great for base" from bash, and the script goes on.
    proc, got = run(
        fakebin, {"SLURM_LOCALID": value, "ROCR_VISIBLE_DEVICES": TWELVE_GPUS}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert got["LOCAL_RANK"] == str(int(value))
    assert got["ROCR_VISIBLE_DEVICES"] == str(10 + int(value))


def test_localid_without_a_gpu_is_one_message(fakebin):
    proc, _ = run(fakebin, {"SLURM_LOCALID": "08"})  # 8 GPUs: 0-7
    assert_one_message(proc)
    assert "local task 8 has no GPU" in proc.stderr


@pytest.mark.parametrize(
    "name", ["SLURM_NODEID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"]
)
@pytest.mark.parametrize("value", ["08", "0000000000000000000000000000012"])
def test_every_slurm_integer_is_decimal(fakebin, name, value):
    proc, got = run(fakebin, {name: value, "COTAINR_LUMI_GPU_BIND": "none"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    variable = {
        "SLURM_NODEID": "NODE_RANK",
        "SLURM_PROCID": "RANK",
        "SLURM_NTASKS": "WORLD_SIZE",
        "SLURM_LOCALID": "LOCAL_RANK",
    }[name]
    assert got[variable] == str(int(value))


@pytest.mark.parametrize(
    "name", ["SLURM_NODEID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"]
)
@pytest.mark.parametrize(
    "value",
    ["x", "-1", "1e3", "0x10", " 3", "3 ", "3\n", "1" * 19, "9" * 40, "$(id)", "2#11"],
)
def test_bad_slurm_integers_are_one_message(fakebin, name, value):
    proc, _ = run(fakebin, {name: value})
    assert_one_message(proc)
    assert name in proc.stderr


@pytest.mark.parametrize(
    "spec", ["08(x5)", "8(x05)", "1(x99999999999999999999)", "8(x1),08", "x", "8(x)"]
)
def test_tasks_per_node_lists_never_give_bash_errors(fakebin, spec):
    proc, got = run(fakebin, {"SLURM_TASKS_PER_NODE": spec})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    if spec in ("08(x5)", "8(x1),08"):
        assert got["LOCAL_WORLD_SIZE"] == "8"
    elif spec == "8(x05)":
        assert got["LOCAL_WORLD_SIZE"] == "8"
    else:
        # Not understood: LOCAL_WORLD_SIZE is not set (documented).
        assert "LOCAL_WORLD_SIZE" not in got


# --- Finding 5: MASTER_PORT in [20000, 31999], a user's value honoured ---------


@pytest.mark.parametrize(
    "job_id",
    [
        "1",
        "11999",
        "12000",
        "9223372036854775807",  # 2^63-1
        "9223372036854775808",  # 2^63: wraps to negative in bash
        "18446744073709551615",
        "99999999999999999999999999999999999999",
        "000000000000000000000000000000000004242424",
    ],
)
def test_master_port_from_any_job_id_is_in_range(fakebin, job_id):
    proc, got = run(fakebin, {"SLURM_JOB_ID": job_id})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert got["MASTER_PORT"] == str(20000 + int(job_id) % 12000)
    assert 20000 <= int(got["MASTER_PORT"]) <= 31999


@pytest.mark.parametrize("job_id", [None, "", "x", "-5", "12 3", "4242424_7"])
def test_master_port_without_a_numeric_job_id_is_29500(fakebin, job_id):
    proc, got = run(fakebin, {"SLURM_JOB_ID": job_id})
    assert proc.returncode == 0, proc.stderr
    assert got["MASTER_PORT"] == "29500"


@pytest.mark.parametrize("port", ["31000", "65535", "1234"])
def test_master_port_set_by_the_user_is_honoured(fakebin, port):
    proc, got = run(fakebin, {"MASTER_PORT": port, "SLURM_JOB_ID": "9" * 30})
    assert proc.returncode == 0, proc.stderr
    assert got["MASTER_PORT"] == port


def test_master_addr_set_by_the_user_is_honoured(fakebin):
    proc, got = run(fakebin, {"MASTER_ADDR": "me", "SLURM_JOB_NODELIST": "bad[["})
    assert proc.returncode == 0, proc.stderr
    assert got["MASTER_ADDR"] == "me"


def test_bad_node_list_is_one_message(fakebin):
    proc, _ = run(fakebin, {"SLURM_JOB_NODELIST": "nid[1-"})
    assert_one_message(proc)
    assert "master node" in proc.stderr and "MASTER_ADDR" in proc.stderr


# --- Finding 6: the MIOpen cache stays directly under /tmp -----------------------


def test_user_name_with_dotdot_cannot_move_the_cache(fakebin, tmp_path):
    # An older script built /tmp/<user>-miopen-cache-<node> from the raw name:
    # with "../<tmp_path>/victim" the rank-0 `rm -rf` hit tmp_path/victim-...
    victim = tmp_path / "victim-miopen-cache-4242424-0"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    hostile = f"..{tmp_path}/victim"
    proc, got = run(fakebin, {"SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, user=hostile)
    assert proc.returncode == 0, proc.stderr
    assert (victim / "precious").read_text() == "keep me"
    cache = got["MIOPEN_USER_DB_PATH"]
    assert cache.startswith("/tmp/") and "/" not in cache[len("/tmp/") :]
    assert ".." not in cache
    assert Path(cache).is_dir()
    shutil.rmtree(cache)


#: Any text; the fuzz test puts it after "..<tmp dir>/a/b/c/d/e/f/g/h/", so that
#: a script that used the raw name would stay inside the test's directory.
USER_TEXT = st.text(
    st.characters(blacklist_characters="\0\n", blacklist_categories=("Cs",)),
    max_size=16,
)


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    return tmp_path_factory.mktemp("jail")


@settings(max_examples=60, deadline=None)
@given(user=USER_TEXT)
def test_fuzz_user_names_give_a_cache_directly_under_tmp(fakebin, jail, user):
    user = f"..{jail}/a/b/c/d/e/f/g/h/{user}"
    check_cache_for_user(fakebin, user)
    assert list(jail.iterdir()) == []


@pytest.mark.parametrize(
    "user", ["", ".", "..", "...", "....", ".hidden", "-rf", "..a", "a..b", "*", " "]
)
def test_odd_user_names_give_a_cache_directly_under_tmp(fakebin, user):
    check_cache_for_user(fakebin, user)


#: The node id of the odd-user-name tests: the cache is a real directory
#: under /tmp named by the (odd) user and the node, so two test runs at once
#: (the series check runs suites in parallel) need different nodes.
ODD_NODE = str(os.getpid())


def check_cache_for_user(fakebin, user):
    proc, got = run(
        fakebin, {"SLURM_LOCALID": "0", "SLURM_NODEID": ODD_NODE}, user=user
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    cache = got["MIOPEN_USER_DB_PATH"]
    name = cache[len("/tmp/") :]
    assert cache.startswith("/tmp/")
    assert re.fullmatch(
        rf"[A-Za-z0-9_-][A-Za-z0-9._-]*-miopen-cache-4242424-{ODD_NODE}", name
    ), cache
    assert ".." not in name
    assert os.path.realpath(cache) == cache
    assert Path(cache).is_dir()
    shutil.rmtree(cache)


def test_cache_set_by_the_user_is_kept_and_never_wiped(fakebin, tmp_path):
    mine = tmp_path / "my cache, with: odd chars"
    mine.mkdir()
    (mine / "db").write_text("x")
    proc, got = run(
        fakebin,
        {"SLURM_LOCALID": "0", "MIOPEN_USER_DB_PATH": str(mine)},
    )
    assert proc.returncode == 0, proc.stderr
    assert got["MIOPEN_USER_DB_PATH"] == str(mine)
    assert got["MIOPEN_CUSTOM_CACHE_DIR"] == str(mine)
    assert (mine / "db").read_text() == "x"


def test_a_cache_of_ours_is_reused_and_nothing_is_removed(fakebin):
    # The same job's next step on the node finds its cache as it left it.
    cache = Path(f"/tmp/{CLEANUP_USER}-miopen-cache-77-3")
    cache.mkdir(mode=0o700)
    (cache / "kernels").write_text("compiled")
    for local_id in ("0", "1"):
        proc, got = run(
            fakebin,
            {"SLURM_JOB_ID": "77", "SLURM_LOCALID": local_id, "SLURM_NODEID": "03"},
        )
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert (
            got["MIOPEN_USER_DB_PATH"] == got["MIOPEN_CUSTOM_CACHE_DIR"] == str(cache)
        )
    assert (cache / "kernels").read_text() == "compiled"


def test_without_a_job_id_the_cache_is_per_node(fakebin):
    proc, got = run(fakebin, {"SLURM_JOB_ID": None, "SLURM_NODEID": "4"})
    assert proc.returncode == 0, proc.stderr
    assert got["MIOPEN_USER_DB_PATH"] == f"/tmp/{CLEANUP_USER}-miopen-cache-4"


@pytest.mark.parametrize("local_id", ["0", "5"])
@pytest.mark.parametrize("planted", ["link", "open dir"])
def test_a_planted_link_or_open_dir_is_not_used(fakebin, tmp_path, planted, local_id):
    # Before: ranks other than 0 used it as it was; rank 0 removed it first.
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "precious").write_text("keep me")
    cache = Path(f"/tmp/{CLEANUP_USER}-miopen-cache-4242424-1{local_id}")
    if planted == "link":
        cache.symlink_to(victim)
    else:
        cache.mkdir()
        cache.chmod(0o777)
    try:
        proc, got = run(
            fakebin, {"SLURM_LOCALID": local_id, "SLURM_NODEID": f"1{local_id}"}
        )
        assert proc.returncode == 0, proc.stderr
        used = Path(got["MIOPEN_USER_DB_PATH"])
        assert used.parent == Path("/tmp") and used.name.startswith(f"{cache.name}.")
        assert used.is_dir() and not used.is_symlink()
        assert used.stat().st_mode & 0o777 == 0o700
        assert got["MIOPEN_CUSTOM_CACHE_DIR"] == str(used)
        if local_id == "0":  # one message per node
            assert proc.stderr == (
                f"cotainr-lumi: not using {cache}: not a private directory of yours "
                "(another user's, a link, or writable by others); using "
                f"{used}\n"
            )
        else:
            assert proc.stderr == ""
        assert (victim / "precious").read_text() == "keep me"
        assert cache.is_symlink() == (planted == "link")
    finally:
        if cache.is_symlink():
            cache.unlink()


@pytest.mark.parametrize("suffix", ["", ".Ab3dE6gH"])
def test_image_default_cache_gives_way_to_the_per_node_one(fakebin, suffix):
    # The env file's default, or the fresh directory it fell back to.
    default = f"/tmp/{CLEANUP_USER}-miopen-cache{suffix}"
    proc, got = run(
        fakebin,
        {
            "SLURM_NODEID": "2",
            "MIOPEN_USER_DB_PATH": default,
            "MIOPEN_CUSTOM_CACHE_DIR": default,
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert got["MIOPEN_USER_DB_PATH"] == f"/tmp/{CLEANUP_USER}-miopen-cache-4242424-2"
    assert got["MIOPEN_CUSTOM_CACHE_DIR"] == got["MIOPEN_USER_DB_PATH"]


# --- Property tests: the Slurm-value parsers ------------------------------------

DIGITS = st.text("0123456789", min_size=1, max_size=40)
HOSTILE_TEXT = st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
    max_size=12,
) | st.sampled_from(["08", "09", "-0", "+1", "1_000", "0x1f", "8#7", "1 2", "${X}"])


def as_decimal(text):
    """What the script accepts: digits, at most 18 significant."""
    if re.fullmatch(r"[0-9]+", text) and len(text.lstrip("0")) <= 18:
        return int(text)
    return None


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["SLURM_LOCALID", "SLURM_NODEID", "SLURM_PROCID"]),
    value=DIGITS | HOSTILE_TEXT,
)
def test_fuzz_slurm_ids(fakebin, name, value):
    env = {name: value, "ROCR_VISIBLE_DEVICES": None, "COTAINR_LUMI_GPU_BIND": "none"}
    proc, got = run(fakebin, env)
    expected = as_decimal(value)
    if value == "" and name != "SLURM_PROCID":
        expected = 0  # unset or empty: 0 (documented)
    if expected is None:
        assert_one_message(proc)
        assert name in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    variable = {"SLURM_LOCALID": "LOCAL_RANK", "SLURM_NODEID": "NODE_RANK"}.get(
        name, "RANK"
    )
    assert got[variable] == str(expected)


@settings(max_examples=60, deadline=None)
@given(job_id=DIGITS | HOSTILE_TEXT)
def test_fuzz_job_id_gives_a_port_in_range(fakebin, job_id):
    proc, got = run(fakebin, {"SLURM_JOB_ID": job_id})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    port = int(got["MASTER_PORT"])
    if re.fullmatch(r"[0-9]+", job_id):
        assert port == 20000 + int(job_id) % 12000
        assert 20000 <= port <= 31999
    else:
        assert port == 29500


@settings(max_examples=40, deadline=None)
@given(
    spec=st.lists(
        st.tuples(DIGITS, st.none() | DIGITS).map(
            lambda t: t[0] if t[1] is None else f"{t[0]}(x{t[1]})"
        ),
        min_size=1,
        max_size=4,
    ).map(",".join)
    | HOSTILE_TEXT,
    node=st.integers(0, 12),
)
def test_fuzz_tasks_per_node(fakebin, spec, node):
    proc, got = run(
        fakebin,
        {
            "SLURM_TASKS_PER_NODE": spec,
            "SLURM_NODEID": str(node),
            "COTAINR_LUMI_GPU_BIND": "none",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    expected = None
    rest = node
    entries = spec.split(",")
    for entry in entries:
        m = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", entry)
        if not m or any(g is not None and len(g.lstrip("0")) > 18 for g in m.groups()):
            expected = None
            break
        count, reps = int(m.group(1)), int(m.group(2) or 1)
        if rest < reps:
            expected = count
            break
        rest -= reps
    if expected is None:
        assert "LOCAL_WORLD_SIZE" not in got
    else:
        assert got["LOCAL_WORLD_SIZE"] == str(expected)


# --- NCCL_NET_GDR_LEVEL: the family's default, never forced (issue 19) --------


def _gdr(fakebin, env):
    env = {**SLURM, **env}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "NCCL_NET_GDR_LEVEL"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{fakebin}:/usr/bin:/bin", "FAKE_USER": CLEANUP_USER, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize(
    "env,expected",
    [
        # An image without the variable (built before it existed): as before.
        ({}, "NCCL_NET_GDR_LEVEL=3"),
        # The 2024 families' profile default.
        ({"COTAINR_LUMI_NCCL_NET_GDR_LEVEL": "3"}, "NCCL_NET_GDR_LEVEL=3"),
        ({"COTAINR_LUMI_NCCL_NET_GDR_LEVEL": "PHB"}, "NCCL_NET_GDR_LEVEL=PHB"),
        # The LUMI AI Factory family: the profile says never force it.
        ({"COTAINR_LUMI_NCCL_NET_GDR_LEVEL": ""}, "NCCL_NET_GDR_LEVEL unset"),
        # A user's value always wins, whatever the profile says (even empty).
        (
            {"COTAINR_LUMI_NCCL_NET_GDR_LEVEL": "", "NCCL_NET_GDR_LEVEL": "SYS"},
            "NCCL_NET_GDR_LEVEL=SYS",
        ),
        (
            {"COTAINR_LUMI_NCCL_NET_GDR_LEVEL": "3", "NCCL_NET_GDR_LEVEL": "PHB"},
            "NCCL_NET_GDR_LEVEL=PHB",
        ),
        ({"NCCL_NET_GDR_LEVEL": ""}, "NCCL_NET_GDR_LEVEL="),
    ],
)
def test_gdr_level_comes_from_the_profile_and_yields_to_the_user(
    fakebin, env, expected
):
    assert _gdr(fakebin, env) == expected


# --- Two real users on one node's /tmp (issue 29) -------------------------------

#: The fake python, and how the cache it was given looks: owner, mode, type.
FAKE_PYTHON_STAT = (
    FAKE_PYTHON
    + """printf 'CACHE=%s\\n' "$(stat -c '%U %a %F' -- "$MIOPEN_USER_DB_PATH" 2>&1)"
"""
)


@pytest.fixture(scope="module")
def users():
    """A victim and an attacker: two real users sharing /tmp."""
    with real_users(2, why="two real users share /tmp") as names:
        yield names


@pytest.fixture(scope="module")
def shared_bin():
    """The fake python in a directory both users can read."""
    path = Path(tempfile.mkdtemp(prefix="cl29-bin-"))
    path.chmod(0o755)
    (path / "python").write_text(FAKE_PYTHON_STAT)
    (path / "python").chmod(0o755)
    yield path
    shutil.rmtree(path)


def run_as(user, shared_bin, *, job, local_id="0"):
    """The script as `user` (real id); return (proc, {name: value})."""
    env = {
        **SLURM,
        "SLURM_JOB_ID": job,
        "SLURM_LOCALID": local_id,
        "SLURM_NODEID": "0",
        "MASTER_ADDR": "nid1",
        "PATH": f"{shared_bin}:/usr/bin:/bin",
    }
    proc = subprocess.run(
        as_user(user)
        + ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
        + ["bash", str(SCRIPT), "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, dict(line.partition("=")[::2] for line in proc.stdout.splitlines())


def remove_caches(path, owner):
    """Remove `path` and its fallbacks (path.XXXXXXXX) if `owner` owns them."""
    remove_dirs_of(owner, path, *path.parent.glob(f"{path.name}.*"))


@pytest.mark.parametrize("local_id", ["0", "5"])
@pytest.mark.parametrize("planted", ["open dir", "link"])
def test_a_co_users_dir_or_link_is_never_used(users, shared_bin, planted, local_id):
    # Before: ranks other than 0 used the attacker's 0777 directory, or
    # followed the attacker's link, as they were.
    victim, attacker = users
    job = str(uuid.uuid4().int % 10**9)
    cache = Path(f"/tmp/{victim}-miopen-cache-{job}-0")
    trap = Path(tempfile.mkdtemp(prefix=f"{attacker}-trap-"))
    attack = 'mkdir -m 777 -- "$1"' if planted == "open dir" else 'ln -s "$2" "$1"'
    trap.chmod(0o777)
    shutil.chown(trap, attacker)
    try:
        subprocess.run(
            as_user(attacker) + ["sh", "-c", attack, "sh", str(cache), str(trap)],
            check=True,
        )
        proc, got = run_as(victim, shared_bin, job=job, local_id=local_id)
        assert proc.returncode == 0, proc.stderr
        used = got["MIOPEN_USER_DB_PATH"]
        assert used.startswith(f"{cache}.") and got["MIOPEN_CUSTOM_CACHE_DIR"] == used
        assert got["CACHE"] == f"{victim} 700 directory"
        if local_id == "0":
            assert proc.stderr.count("\n") == 1 and f"not using {cache}:" in proc.stderr
        else:
            assert proc.stderr == ""
        assert list(trap.iterdir()) == []
        assert cache.owner() == attacker
    finally:
        if cache.is_symlink():
            cache.unlink()
        remove_caches(cache, attacker)
        remove_caches(cache, victim)
        shutil.rmtree(trap)


def test_a_racing_co_user_never_gets_the_cache(users, shared_bin):
    # Before: rank 0's `rm -rf` then `mkdir -p` lost the race to a co-user
    # looping mkdir/rmdir (28 of 200 runs in the issue).
    victim, attacker = users
    job = str(uuid.uuid4().int % 10**9)
    cache = Path(f"/tmp/{victim}-miopen-cache-{job}-0")
    trap = Path(tempfile.mkdtemp(prefix=f"{attacker}-trap-"))
    trap.chmod(0o777)
    shutil.chown(trap, attacker)
    seen = []
    try:
        with racing_user(attacker, path=cache, target=trap):
            for _ in range(200):
                proc, got = run_as(victim, shared_bin, job=job)
                assert proc.returncode == 0, proc.stderr
                seen.append(got["CACHE"])
                remove_caches(cache, victim)
        assert seen.count(f"{victim} 700 directory") == 200, set(seen)
        assert list(trap.iterdir()) == []
    finally:
        if cache.is_symlink():
            cache.unlink()
        remove_caches(cache, attacker)
        remove_caches(cache, victim)
        shutil.rmtree(trap)
