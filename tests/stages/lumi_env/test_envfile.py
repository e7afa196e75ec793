"""Tests of cotainr_lumi.stages.lumi_env.envfile: names, quoting and override semantics.

The generated code is run through real shells (bash and POSIX sh) with
hostile values; a marker file proves nothing in a value was executed.
"""

import os
from pathlib import Path
import shutil
import subprocess
import tempfile
import uuid

from hosttools import as_user, racing_user, real_users, remove_dirs_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from cotainr_lumi.stages.lumi_env.envfile import (
    default_assignments,
    forced_assignment,
    path_addition,
    private_dir_defaults,
    render_env_file,
)
from cotainr_lumi.stages.lumi_env.validators import (
    EnvError,
    validate_name,
    validate_value,
)

# Both are essential packages on Debian (always installed).
SHELLS = ["bash", "sh"]

NAMES = st.from_regex(r"\ACXT_[A-Za-z0-9_]{0,12}\Z")
HOSTILE_PIECES = st.sampled_from(
    [
        "$(touch {m})",
        "`touch {m}`",
        "'",
        '"',
        "\\",
        "\n",
        "$HOME",
        "${X:=y}",
        ";touch {m};",
        "|| touch {m}",
        "!",
        "*",
        "~",
        " ",
        "\t",
        "\r",
        "$'\\n'",
        "%s",
        "é",
        "#",
    ]
)


def hostile_values(marker):
    """Text mixing arbitrary characters with shell syntax aimed at `marker`."""
    return st.lists(
        st.one_of(
            st.text(
                st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
                max_size=8,
            ),
            HOSTILE_PIECES.map(lambda s: s.replace("{m}", str(marker))),
        ),
        max_size=8,
    ).map("".join)


def source_and_dump(script, *, shell="bash", env=None):
    """Source `script` in `shell` and return the resulting environment."""
    base = {"PATH": os.environ["PATH"]}
    base.update(env or {})
    proc = subprocess.run(
        [shell, "-c", '. "$1" && env -0', "sh", str(script)],
        env=base,
        capture_output=True,
        check=True,
    )
    result = {}
    for entry in proc.stdout.split(b"\0"):
        if entry:
            key, _, value = entry.partition(b"=")
            result[key.decode()] = value.decode("utf-8", "surrogateescape")
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("envfile")


@pytest.mark.parametrize("shell", SHELLS)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_hostile_values_round_trip_and_never_execute(shell, data, workdir):
    marker = workdir / "PWNED"
    env = data.draw(
        st.dictionaries(NAMES, hostile_values(marker), min_size=1, max_size=4)
    )
    script = workdir / "env.sh"
    script.write_text(render_env_file(header="test", blocks=[default_assignments(env)]))
    result = source_and_dump(script, shell=shell)
    assert not marker.exists(), f"a value was executed: {env!r}"
    for name, value in env.items():
        assert result[name] == value


@pytest.mark.parametrize("shell", SHELLS)
def test_defaults_yield_to_values_already_set_even_empty(shell, tmp_path):
    script = tmp_path / "env.sh"
    script.write_text(
        render_env_file(
            header="t",
            blocks=[
                default_assignments({"A": "1", "B": "2", "C": 3, "D": None}),
                forced_assignment(name="F", value="forced"),
            ],
        )
    )
    result = source_and_dump(
        script, shell=shell, env={"B": "host", "C": "", "F": "host"}
    )
    assert result["A"] == "1"
    assert result["B"] == "host"
    assert result["C"] == ""  # set but empty counts as set
    assert "D" not in result  # None: not set at all
    assert result["F"] == "forced"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("position", ["append", "prepend"])
def test_path_addition_adds_missing_entries_once(shell, position, tmp_path):
    script = tmp_path / "env.sh"
    code = path_addition(
        name="LD_LIBRARY_PATH", entries=["/opt/rocm/lib", "/opt/x y"], position=position
    )
    script.write_text(code + "\n" + code + "\n")  # twice: idempotent
    result = source_and_dump(
        script, shell=shell, env={"LD_LIBRARY_PATH": "/base:/opt/rocm/lib"}
    )
    if position == "append":
        assert result["LD_LIBRARY_PATH"] == "/base:/opt/rocm/lib:/opt/x y"
    else:
        assert result["LD_LIBRARY_PATH"] == "/opt/x y:/base:/opt/rocm/lib"
    unset = source_and_dump(script, shell=shell)
    expected = (
        "/opt/rocm/lib:/opt/x y" if position == "append" else "/opt/rocm/lib:/opt/x y"
    )
    assert unset["LD_LIBRARY_PATH"] == expected


@given(st.text(max_size=12))
def test_validate_name_accepts_only_safe_identifiers(name):
    try:
        validate_name(name)
    except EnvError:
        return
    assert name.isascii() and (name[0].isalpha() or name[0] == "_")
    assert all(c.isalnum() or c == "_" for c in name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "LD_LIBRARY_PATH",
        "HOME",
        "IFS",
        "PS1",
        "_",
        "APPTAINER_BIND",
        "SINGULARITYENV_X",
        "1X",
        "A-B",
        "A B",
        "A=B",
        "",
        "X$(id)",
        "Ä",
    ],
)
def test_validate_name_rejects(name):
    with pytest.raises(EnvError):
        validate_name(name)


def test_path_variables_point_to_the_path_settings():
    with pytest.raises(EnvError, match="ld-library-path"):
        validate_name("LD_LIBRARY_PATH")


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}, "a\0b"])
def test_validate_value_rejects(value):
    with pytest.raises(EnvError):
        validate_value(name="X", value=value)


def test_validate_value_accepts_numbers():
    assert validate_value(name="X", value=131072) == "131072"
    assert validate_value(name="X", value=1.5) == "1.5"


@pytest.mark.parametrize("entry", ["relative", "/a:b", "/a\nb", ""])
def test_path_addition_rejects_bad_entries(entry):
    with pytest.raises(EnvError):
        path_addition(name="PATH", entries=[entry])


def test_default_assignment_shape():
    code = default_assignments({"X": "a b"})
    assert code.startswith('if [ -z "${X+x}" ]; then case "${__exported_env__:-}" in')
    assert "X='a b'; export X" in code


@pytest.mark.parametrize("shell", SHELLS)
def test_defaults_yield_to_host_variables_apptainer_hides(shell, tmp_path):
    # Apptainer clears the host environment while env scripts run and lists
    # it in $__exported_env__; a listed variable must not get the default
    # (Apptainer then restores the host value).
    script = tmp_path / "env.sh"
    script.write_text(default_assignments({"A": "1", "B": "2", "C": "3", "AB": "4"}))
    hidden = "A_LONGER=x\nB=host\nZ=a\\nC=escaped newline in a value"
    result = source_and_dump(script, shell=shell, env={"__exported_env__": hidden})
    assert result["A"] == "1"  # A_LONGER is another variable
    assert "B" not in result  # listed: left for Apptainer to restore
    assert result["C"] == "3"  # 'C=' only inside an (escaped) value
    assert result["AB"] == "4"


# Property tests over *arbitrary* names and values (not only well-formed
# ones): whatever validation accepts must render to a file that is valid
# shell and that sets exactly that name to exactly that value.
ANY_NAME = st.one_of(
    st.text(alphabet="AZaz_09\n\t =$-.é", min_size=0, max_size=6),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}\n?\n?"),
    st.text(max_size=6),
)
ANY_VALUE = st.text(max_size=12)  # includes NUL and lone surrogates


def _bash_n(script):
    return subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=ANY_NAME, value=ANY_VALUE)
def test_fuzz_whatever_validation_accepts_is_valid_shell_and_round_trips(
    name, value, workdir
):
    try:
        block = default_assignments({name: value})
    except EnvError:
        return  # one clear error for the user: fine
    script = workdir / "fuzz.sh"
    script.write_text(render_env_file(header="fuzz", blocks=[block]), "utf-8")
    proc = _bash_n(script)
    assert proc.returncode == 0, (name, value, proc.stderr)
    result = source_and_dump(script)
    assert result[name] == value


@pytest.mark.parametrize("name", ["X\n", "CXT_A\n", "PATH\n", "BASH_ENV\n", "X\r"])
def test_names_with_trailing_newline_or_cr_are_rejected(name):
    with pytest.raises(EnvError, match="not a valid environment variable name"):
        validate_name(name)
    with pytest.raises(EnvError):
        path_addition(name=name, entries=["/x"])


def test_non_utf8_values_are_rejected():
    value = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(EnvError, match="not valid UTF-8"):
        validate_value(name="V", value=value)


# --- A private directory per user on a shared /tmp (issue 29) -------------------


@pytest.fixture(scope="module")
def users():
    """A victim and an attacker: two real users sharing /tmp."""
    with real_users(2, why="two real users share /tmp") as names:
        yield names


@pytest.fixture
def private_env(users):
    """(env file both users can read, the victim's directory, a 0777 trap dir)."""
    victim, attacker = users
    where = Path(tempfile.mkdtemp(prefix="cl29-env-"))
    where.chmod(0o755)
    tag = f"cache-{uuid.uuid4().hex[:8]}"
    script = where / "env.sh"
    block = private_dir_defaults(
        groups=[(("CACHE_A", "CACHE_B"), f"/tmp/$(id -un)-{tag}")]
    )
    script.write_text(render_env_file(header="test", blocks=[block]))
    trap = where / "trap"
    trap.mkdir(mode=0o777)
    trap.chmod(0o777)
    shutil.chown(trap, attacker)
    cache = Path(f"/tmp/{victim}-{tag}")
    yield script, cache, trap
    if cache.is_symlink():
        cache.unlink()
    remove_dirs_of(victim, cache, *Path("/tmp").glob(f"{cache.name}.*"))
    remove_dirs_of(attacker, cache)
    shutil.rmtree(where)


def source_as(user, script):
    """Source `script` in sh as `user`; return (proc, [A, B, how A looks])."""
    show = 'printf "%s\\n" "$CACHE_A" "$CACHE_B" "$(stat -c "%U %a %F" -- "$CACHE_A")"'
    proc = subprocess.run(
        as_user(user)
        + ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", f'. "$1" && {show}']
        + ["sh", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, proc.stdout.splitlines()


def test_private_dir_is_made_for_the_user_and_kept(users, private_env):
    script, cache, _ = private_env
    victim = users[0]
    for _ in range(2):  # made, then found as it was left
        proc, (a, b, looks) = source_as(victim, script)
        assert (a, b, looks, proc.stderr) == (
            str(cache),
            str(cache),
            f"{victim} 700 directory",
            "",
        )


@pytest.mark.parametrize("planted", ["open dir", "link"])
def test_private_dir_of_a_co_user_or_a_link_is_never_used(users, private_env, planted):
    # Before: the image-wide default /tmp/<user>-miopen-cache was used
    # whoever made it.
    script, cache, trap = private_env
    victim, attacker = users
    attack = 'mkdir -m 777 -- "$1"' if planted == "open dir" else 'ln -s "$2" "$1"'
    subprocess.run(
        as_user(attacker) + ["sh", "-c", attack, "sh", str(cache), str(trap)],
        check=True,
    )
    proc, (a, b, looks) = source_as(victim, script)
    assert a.startswith(f"{cache}.") and b == a
    assert looks == f"{victim} 700 directory"
    assert proc.stderr == (
        f"cotainr-lumi: not using {cache}: not a private directory of yours "
        f"(another user's, a link, or writable by others); using {a}\n"
    )
    assert list(trap.iterdir()) == []


def test_private_dir_against_a_racing_co_user(users, private_env):
    script, cache, trap = private_env
    victim, attacker = users
    seen = []
    with racing_user(attacker, path=cache, target=trap):
        for _ in range(200):
            _, (a, _, looks) = source_as(victim, script)
            seen.append(looks)
            remove_dirs_of(victim, a, cache)
    assert seen.count(f"{victim} 700 directory") == 200, set(seen)
    assert list(trap.iterdir()) == []
