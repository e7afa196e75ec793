"""Tests of the init-conda-venv runscript (and its init-user-venv link), real bash.

``python`` on PATH is a wrapper around the test interpreter that adds
``--without-pip`` to ``-m venv`` (a real venv in a fraction of a second).
The script never replaces or overwrites anything: an existing venv is
reused, a free place (nothing there, or an empty directory) gets a new one,
and anything else is one error message with nothing changed.
"""

import os
from pathlib import Path
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

import cotainr_lumi

RUNSCRIPTS = Path(cotainr_lumi.__file__).parent / "stages" / "lumi_env" / "runscripts"
SCRIPTS = [RUNSCRIPTS / "init-conda-venv", RUNSCRIPTS / "init-user-venv"]

PYTHON_WRAPPER = f"""#!/bin/bash
if [[ ${{1:-}} == -m && ${{2:-}} == venv ]]; then
    shift 2
    exec {sys.executable} -m venv --without-pip "$@"
fi
exec {sys.executable} "$@"
"""


@pytest.fixture(scope="module")
def pybin(tmp_path_factory):
    path = tmp_path_factory.mktemp("pybin")
    (path / "python").write_text(PYTHON_WRAPPER)
    (path / "python").chmod(0o755)
    return path


def env_for(pybin, **extra):
    return {"PATH": f"{pybin}:/usr/bin:/bin", "HOME": "/nonexistent", **extra}


def run(pybin, *args, script=SCRIPTS[0], **extra):
    return subprocess.run(
        ["bash", str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(pybin, **extra),
    )


def snapshot(path):
    """Every entry under `path` (itself included): kind, target or content."""
    path = Path(path)
    result = {}
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        entries += sorted(path.rglob("*"))
    for entry in entries:
        key = str(entry.relative_to(path.parent))
        if entry.is_symlink():
            result[key] = ("link", os.readlink(entry))
        elif entry.is_dir():
            result[key] = ("dir", oct(entry.stat().st_mode))
        elif entry.is_file():
            result[key] = ("file", entry.read_bytes(), entry.stat().st_mtime_ns)
        elif entry.exists():
            result[key] = ("other", entry.stat().st_mode)
    return result


def assert_one_error(proc, target):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    # One line (str.splitlines would also split at \x1c and the like).
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert proc.stderr.startswith("init-conda-venv: "), proc.stderr
    assert "nothing was changed" in proc.stderr, proc.stderr
    assert "init-conda-venv: created" not in proc.stderr


def make_venv(pybin, path):
    subprocess.run(
        [str(pybin / "python"), "-m", "venv", "--system-site-packages", str(path)],
        check=True,
    )
    return path


# --- Finding 1: never replace or overwrite --------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_existing_directory_that_is_not_a_venv_is_left_alone(pybin, tmp_path, script):
    # Today: `python -m venv` ran over it and replaced pyvenv.cfg and
    # bin/activate, then said "created".
    target = tmp_path / "mine"
    (target / "bin").mkdir(parents=True)
    (target / "pyvenv.cfg").write_text("my own settings\n")
    (target / "bin/activate").write_text("echo my own activate\n")
    (target / "notes.txt").write_text("keep\n")
    before = snapshot(target)
    proc = run(pybin, target, script=script)
    assert_one_error(proc, target)
    assert str(target) in proc.stderr
    assert "not a venv" in proc.stderr or "broken venv" in proc.stderr
    assert snapshot(target) == before


@pytest.mark.parametrize(
    "kind", ["file", "dangling link", "link to a file", "link to a dir", "fifo", "dir"]
)
def test_anything_that_is_not_a_venv_is_one_error(pybin, tmp_path, kind):
    target = tmp_path / "target"
    other = tmp_path / "other"
    if kind == "file":
        target.write_text("data\n")
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "nowhere")
    elif kind == "link to a file":
        other.write_text("data\n")
        target.symlink_to(other)
    elif kind == "link to a dir":
        other.mkdir()
        target.symlink_to(other)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "dir":
        target.mkdir()
        (target / "x").write_text("x")
    before = snapshot(tmp_path)
    proc = run(pybin, target)
    assert_one_error(proc, target)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "nowhere").exists()


def test_broken_venv_is_one_error(pybin, tmp_path):
    target = tmp_path / "broken"
    target.mkdir()
    (target / "pyvenv.cfg").write_text("home = /usr/bin\n")
    before = snapshot(target)
    proc = run(pybin, target)
    assert_one_error(proc, target)
    assert "broken venv" in proc.stderr
    assert snapshot(target) == before


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_existing_venv_is_reused_and_not_modified(pybin, tmp_path, script):
    venv = make_venv(pybin, tmp_path / "venv")
    (venv / "bin/activate").write_text("# edited by the user\n")
    before = snapshot(venv)
    proc = run(pybin, venv, script=script)
    assert proc.returncode == 0, proc.stderr
    assert "init-conda-venv: created" not in proc.stderr
    assert f"source {venv}/bin/activate" in proc.stderr
    assert snapshot(venv) == before


def test_link_to_a_venv_is_reused(pybin, tmp_path):
    venv = make_venv(pybin, tmp_path / "venv")
    link = tmp_path / "link"
    link.symlink_to(venv)
    before = snapshot(tmp_path)
    proc = run(pybin, link)
    assert proc.returncode == 0, proc.stderr
    assert snapshot(tmp_path) == before


def test_new_venv_is_created_and_sees_the_image_env(pybin, tmp_path):
    target = tmp_path / "a" / "b" / "venv"
    proc = run(pybin, target)
    assert proc.returncode == 0, proc.stderr
    assert f"created {target}" in proc.stderr
    assert (target / "pyvenv.cfg").is_file()
    assert os.access(target / "bin/python", os.X_OK)
    assert list(target.glob("lib/python*/site-packages/_cotainr_lumi_image_env.pth"))
    # Run again: reused, nothing changed.
    before = snapshot(target)
    again = run(pybin, target)
    assert again.returncode == 0 and "init-conda-venv: created" not in again.stderr
    assert snapshot(target) == before


def test_empty_directory_gets_a_venv(pybin, tmp_path):
    target = tmp_path / "empty"
    target.mkdir()
    proc = run(pybin, target)
    assert proc.returncode == 0, proc.stderr
    assert (target / "pyvenv.cfg").is_file()


def test_parent_that_is_a_file_is_one_error(pybin, tmp_path):
    (tmp_path / "file").write_text("x")
    proc = run(pybin, tmp_path / "file" / "venv")
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("init-conda-venv: ")
    assert (tmp_path / "file").read_text() == "x"


def test_sourced_with_a_non_venv_directory_says_so_and_changes_nothing(pybin, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "pyvenv.cfg").write_text("mine\n")
    before = snapshot(target)
    script = SCRIPTS[0]
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'source {script}; echo "status=$? VIRTUAL_ENV=${{VIRTUAL_ENV:-}}"',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_for(pybin, COTAINR_LUMI_USER_VENV=str(target)),
    )
    assert proc.stdout == "status=1 VIRTUAL_ENV=\n", proc.stdout
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "not a venv" in proc.stderr and "nothing was changed" in proc.stderr
    assert snapshot(target) == before


def test_sourced_with_a_venv_activates_it(pybin, tmp_path):
    venv = make_venv(pybin, tmp_path / "venv")
    before = snapshot(venv)
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'source {SCRIPTS[0]}; echo "status=$? $VIRTUAL_ENV"; command -v python',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_for(pybin, COTAINR_LUMI_USER_VENV=str(venv)),
    )
    assert proc.stdout.splitlines() == [f"status=0 {venv}", f"{venv}/bin/python"]
    assert proc.stderr == ""
    assert snapshot(venv) == before


# --- Paths with ':', ',', spaces, control characters ------------------------------


@pytest.mark.parametrize(
    "name", ["a:b", "a\nb", "a\tb", "a\x1bb", 'a"b', "a$b", "a`b", "a\\b"]
)
def test_paths_the_activate_scripts_cannot_hold_are_one_error(pybin, tmp_path, name):
    target = tmp_path / name
    proc = run(pybin, target)
    assert_one_error(proc, target)
    assert list(tmp_path.iterdir()) == []


SAFE_CHARS = st.characters(
    blacklist_categories=("Cs", "Cc"),
    blacklist_characters=':"$`\\/\x7f',
)
PATH_NAMES = st.text(
    st.sampled_from(list(" ,;'!*?[]{}()~#&|<>=%@^+-_.é")) | SAFE_CHARS,
    min_size=1,
    max_size=12,
).filter(lambda n: n not in (".", ".."))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=PATH_NAMES)
def test_fuzz_odd_paths_get_a_venv_exactly_there(pybin, tmp_path_factory, name):
    base = tmp_path_factory.mktemp("odd")
    target = base / name
    proc = run(pybin, target)
    assert proc.returncode == 0, proc.stderr
    assert (target / "pyvenv.cfg").is_file()
    assert [p.name for p in base.iterdir()] == [name]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    name=st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"),
        min_size=1,
        max_size=10,
    ).filter(lambda n: n not in (".", "..")),
    kind=st.sampled_from(["file", "dir with a file", "dangling link"]),
)
def test_fuzz_whatever_is_there_is_never_changed(pybin, tmp_path_factory, name, kind):
    base = tmp_path_factory.mktemp("there")
    target = base / name
    if kind == "file":
        target.write_text("data")
    elif kind == "dir with a file":
        target.mkdir()
        (target / "pyvenv.cfg").write_text("mine")
    else:
        target.symlink_to(base / "nowhere")
    before = snapshot(base)
    proc = run(pybin, target)
    assert_one_error(proc, target)
    assert snapshot(base) == before


# --- An image env exposed through PYTHONPATH (the LUMI AI Factory /opt/venv) ----


def shadow_package(site, version):
    """A package ``shadowpkg`` of `version` in the directory `site`."""
    (site / "shadowpkg").mkdir(parents=True)
    (site / "shadowpkg" / "__init__.py").write_text(f"VERSION = {version!r}\n")


def test_the_user_venvs_copy_wins_over_an_image_env_on_pythonpath(pybin, tmp_path):
    # The image env on PYTHONPATH comes before every venv's own
    # site-packages: before the fix the user venv's newer copy stayed hidden.
    image_site = tmp_path / "image-site"
    shadow_package(image_site, "1.0")
    venv = make_venv(pybin, tmp_path / "venv")
    (user_site,) = venv.glob("lib/python*/site-packages")
    shadow_package(user_site, "2.0")
    probe = "import shadowpkg, os; print(shadowpkg.VERSION, os.environ['PYTHONPATH'])"
    proc = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS[1]} && python -c "{probe}"'],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_for(
            pybin, COTAINR_LUMI_USER_VENV=str(venv), PYTHONPATH=str(image_site)
        ),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.0", f"{user_site}:{image_site}"]
    # Without PYTHONPATH nothing is added (the venv's site-packages come first).
    proc = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS[1]} && echo "${{PYTHONPATH-unset}}"'],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_for(pybin, COTAINR_LUMI_USER_VENV=str(venv)),
    )
    assert proc.stdout == "unset\n", proc.stderr
