"""Tests of the host commands make-squashfs, unmake-squashfs, start-shell and list-packages (real bash).

The commands are rendered as the lumi-env stage writes them to
``$CONTAINERROOT/bin`` (a header with ``default_sif`` and ``default_root``,
then the body from ``hostscripts/``). They never replace or overwrite
anything that exists (dangling symbolic links and files of another kind
included), and every failure is one message on one line.
"""

import os
from pathlib import Path
import shlex
import subprocess
from types import SimpleNamespace

import artefacts
from hosttools import need_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

import cotainr_lumi
from cotainr_lumi.stages.lumi_env.modulefile import LayerBase, _host_command_text

HOSTSCRIPTS = Path(cotainr_lumi.__file__).parent / "stages" / "lumi_env" / "hostscripts"
NAMES = ("make-squashfs", "unmake-squashfs", "start-shell", "list-packages", "python")


def render(name, *, sif, root, script=None):
    """The host command as the stage writes it (see modulefile._host_command_text)."""
    body = (HOSTSCRIPTS / (script or name)).read_text()
    return (
        f"#!/bin/bash\n# {name}: test copy.\n"
        f"default_sif={shlex.quote(str(sif))}\n"
        f"default_root={shlex.quote(str(root))}\n{body}"
    )


@pytest.fixture(scope="module")
def squashfs_tools():
    need_tool("mksquashfs", install="apt-get install -y squashfs-tools")
    need_tool("unsquashfs", install="apt-get install -y squashfs-tools")


def run(name, root, *args, path=None, sif=None, env=None, script=None):
    """Run host command `name` with default_root `root` (bash -c TEXT)."""
    text = render(name, sif=sif or root.parent / "image.sif", root=root, script=script)
    return subprocess.run(
        ["bash", "-c", text, name, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": path or "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})},
    )


def snapshot(path):
    """Every entry at and under `path`: kind, link target or content."""
    path = Path(path)
    result = {}
    entries = [path] if (path.exists() or path.is_symlink()) else []
    if path.is_dir() and not path.is_symlink():
        entries += sorted(path.rglob("*"))
    for entry in entries:
        key = str(entry)
        if entry.is_symlink():
            result[key] = ("link", os.readlink(entry))
        elif entry.is_dir():
            result[key] = ("dir",)
        elif entry.is_file():
            result[key] = ("file", entry.read_bytes())
        else:
            result[key] = ("other", entry.stat().st_mode)
    return result


def assert_one_message(proc, name):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    # One line (str.splitlines would also split at \x1c and the like).
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert proc.stderr.startswith(f"{name}: "), proc.stderr
    assert proc.stdout == ""


def make_root(base, name="root"):
    root = Path(base) / name
    (root / "user-software/venv/x/bin").mkdir(parents=True)
    (root / "user-software/venv/x/bin/python").write_text("#!/bin/sh\n")
    (root / "user-software/a file, with: odd\tname").write_text("data\n")
    return root


def make_kind(path, kind, other):
    """Put a `kind` of thing at `path` (`other` is a spare path next to it)."""
    if kind == "file":
        path.write_text("mine\n")
    elif kind == "empty dir":
        path.mkdir()
    elif kind == "dir":
        path.mkdir()
        (path / "mine").write_text("mine\n")
    elif kind == "dangling link":
        path.symlink_to(other)
    elif kind == "link to a file":
        other.write_text("theirs\n")
        path.symlink_to(other)
    elif kind == "link to an empty dir":
        other.mkdir()
        path.symlink_to(other)
    elif kind == "link to a dir":
        other.mkdir()
        (other / "theirs").write_text("theirs\n")
        path.symlink_to(other)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        raise AssertionError(kind)


# --- make-squashfs ---------------------------------------------------------------


def test_make_squashfs_packs_user_software(tmp_path, squashfs_tools):
    root = make_root(tmp_path)
    proc = run("make-squashfs", root)
    assert proc.returncode == 0, proc.stderr
    out = root / "user-software.squashfs"
    assert out.is_file()
    listing = subprocess.run(
        ["unsquashfs", "-l", str(out)], capture_output=True, text=True, check=True
    ).stdout
    assert "venv/x/bin/python" in listing
    # Readable as a file made by mksquashfs itself would be (the umask).
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in root.iterdir()) == [
        "user-software",
        "user-software.squashfs",
    ]


@pytest.mark.parametrize(
    "kind",
    [
        "file",
        "empty dir",
        "dir",
        "dangling link",
        "link to a file",
        "link to a dir",
        "fifo",
    ],
)
def test_make_squashfs_never_replaces_what_is_there(tmp_path, squashfs_tools, kind):
    # Today a dangling symbolic link at user-software.squashfs was replaced.
    root = make_root(tmp_path)
    make_kind(root / "user-software.squashfs", kind, tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    proc = run("make-squashfs", root)
    assert_one_message(proc, "make-squashfs")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["missing", "file", "dangling link"])
def test_make_squashfs_without_a_directory_is_one_message(
    tmp_path, squashfs_tools, kind
):
    root = tmp_path / "root"
    root.mkdir()
    if kind != "missing":
        make_kind(root / "user-software", kind, tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    proc = run("make-squashfs", root)
    assert_one_message(proc, "make-squashfs")
    assert snapshot(tmp_path) == before


def test_make_squashfs_failure_is_one_message_and_leaves_nothing(tmp_path):
    root = make_root(tmp_path)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "mksquashfs").write_text(
        '#!/bin/bash\necho "partial" > "$2"\necho "FATAL ERROR: disk full" >&2\nexit 1\n'
    )
    (fake / "mksquashfs").chmod(0o755)
    before = snapshot(root)
    proc = run("make-squashfs", root, path=f"{fake}:/usr/bin:/bin")
    assert_one_message(proc, "make-squashfs")
    assert "disk full" in proc.stderr
    assert snapshot(root) == before


# --- unmake-squashfs -------------------------------------------------------------


def packed_root(base):
    root = make_root(base)
    subprocess.run(
        [
            "mksquashfs",
            str(root / "user-software"),
            str(root / "user-software.squashfs"),
            "-no-progress",
            "-quiet",
        ],
        check=True,
        capture_output=True,
    )
    return root


@pytest.mark.parametrize("existing", ["nothing", "empty dir"])
def test_unmake_squashfs_unpacks(tmp_path, squashfs_tools, existing):
    root = packed_root(tmp_path)
    subprocess.run(["rm", "-rf", str(root / "user-software")], check=True)
    if existing == "empty dir":
        (root / "user-software").mkdir()
    proc = run("unmake-squashfs", root)
    assert proc.returncode == 0, proc.stderr
    assert (root / "user-software/venv/x/bin/python").read_text() == "#!/bin/sh\n"
    assert (root / "user-software/a file, with: odd\tname").read_text() == "data\n"
    assert sorted(p.name for p in root.iterdir()) == [
        "user-software",
        "user-software.squashfs",
    ]


@pytest.mark.parametrize(
    "kind",
    [
        "file",
        "dir",
        "dangling link",
        "link to a file",
        "link to an empty dir",
        "link to a dir",
        "fifo",
    ],
)
def test_unmake_squashfs_never_replaces_what_is_there(tmp_path, squashfs_tools, kind):
    root = packed_root(tmp_path)
    subprocess.run(["rm", "-rf", str(root / "user-software")], check=True)
    make_kind(root / "user-software", kind, tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    proc = run("unmake-squashfs", root)
    assert_one_message(proc, "unmake-squashfs")
    assert snapshot(tmp_path) == before


def test_unmake_squashfs_keeps_the_not_empty_wording(tmp_path, squashfs_tools):
    root = packed_root(tmp_path)  # user-software/ still there, with files
    proc = run("unmake-squashfs", root)
    assert_one_message(proc, "unmake-squashfs")
    assert "not empty" in proc.stderr


@pytest.mark.parametrize("kind", ["missing", "dir", "dangling link"])
def test_unmake_squashfs_without_a_file_is_one_message(tmp_path, squashfs_tools, kind):
    root = tmp_path / "root"
    root.mkdir()
    if kind != "missing":
        make_kind(root / "user-software.squashfs", kind, tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    proc = run("unmake-squashfs", root)
    assert_one_message(proc, "unmake-squashfs")
    assert snapshot(tmp_path) == before


def test_unmake_squashfs_of_a_bad_file_is_one_message_and_leaves_nothing(
    tmp_path, squashfs_tools
):
    root = tmp_path / "root"
    root.mkdir()
    (root / "user-software.squashfs").write_bytes(b"not a squashfs file\n" * 100)
    before = snapshot(tmp_path)
    proc = run("unmake-squashfs", root)
    assert_one_message(proc, "unmake-squashfs")
    assert snapshot(tmp_path) == before


# --- Paths with ':', ',', spaces, control characters --------------------------------

ROOT_NAMES = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"),
    min_size=1,
    max_size=10,
).filter(lambda n: n not in (".", ".."))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=ROOT_NAMES | st.sampled_from(["a:b", "a,b", "a b", "a\nb", "-x", "*"]))
def test_fuzz_round_trip_with_odd_container_roots(
    tmp_path_factory, squashfs_tools, name
):
    base = tmp_path_factory.mktemp("odd")
    root = make_root(base, name)
    made = run("make-squashfs", root)
    assert made.returncode == 0, made.stderr
    assert (root / "user-software.squashfs").is_file()
    # Every message is one line per message, the path quoted when it must be.
    assert all(
        line.startswith("make-squashfs: ") for line in made.stderr.split("\n")[:-1]
    )
    again = run("make-squashfs", root)
    assert_one_message(again, "make-squashfs")
    subprocess.run(["rm", "-rf", str(root / "user-software")], check=True)
    unmade = run("unmake-squashfs", root, env={"CONTAINERROOT": str(root)})
    assert unmade.returncode == 0, unmade.stderr
    assert (root / "user-software/a file, with: odd\tname").read_text() == "data\n"
    assert sorted(p.name for p in root.iterdir()) == [
        "user-software",
        "user-software.squashfs",
    ]


# --- start-shell -----------------------------------------------------------------

FAKE_SINGULARITY = """#!/bin/bash
printf '%s\\0' "$@"
"""


@pytest.fixture
def fake_singularity(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "singularity").write_text(FAKE_SINGULARITY)
    (fake / "singularity").chmod(0o755)
    return fake


@pytest.mark.parametrize("name", ["image.sif", "my image, v1: new.sif", "a\nb.sif"])
def test_start_shell_passes_the_image_path_as_one_argument(
    tmp_path, fake_singularity, name
):
    sif = tmp_path / name
    sif.write_text("sif")
    proc = run(
        "start-shell",
        tmp_path / "root",
        "-c",
        "echo hi; echo $HOME",
        sif=sif,
        path=f"{fake_singularity}:/usr/bin:/bin",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\0")[:-1] == [
        "exec",
        str(sif),
        "bash",
        "-c",
        "echo hi; echo $HOME",
    ]


def test_start_shell_without_the_image_is_one_message(tmp_path, fake_singularity):
    proc = run(
        "start-shell",
        tmp_path / "root",
        sif=tmp_path / "gone.sif",
        path=f"{fake_singularity}:/usr/bin:/bin",
    )
    assert_one_message(proc, "start-shell")
    assert "gone.sif" in proc.stderr


def test_start_shell_without_singularity_is_one_message(tmp_path):
    sif = tmp_path / "image.sif"
    sif.write_text("sif")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(
        ["/bin/bash", "-c", render("start-shell", sif=sif, root=tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(empty)},
    )
    assert_one_message(proc, "start-shell")


def test_host_commands_are_shellcheck_clean():
    shellcheck = need_tool("shellcheck", install="apt-get install -y shellcheck")
    for name in NAMES:
        proc = subprocess.run(
            [shellcheck, "-s", "bash", "-"],
            # (The header's two values are used by some commands only.)
            input=render(name, sif="/x.sif", root="/x")
            + ': "$default_sif" "$default_root"\n',
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, (name, proc.stdout)


# --- list-packages (as LUST's PyTorch 2.7.1 module's) ---------------------------


def test_list_packages_lists_the_images_packages_with_pips_arguments(
    tmp_path, fake_singularity
):
    """LUST's list-packages: `singularity exec $SIF pip3 list` on the host."""
    lust = artefacts.load("lust-pytorch-2.7.1").facts
    assert "list-packages" in lust["host-commands"]
    sif = tmp_path / "my image, v1.sif"
    sif.write_text("sif")
    proc = run(
        "list-packages",
        tmp_path / "root",
        "--format=json",
        sif=sif,
        path=f"{fake_singularity}:/usr/bin:/bin",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\0")[:-1] == [
        "exec",
        str(sif),
        *"python3 -m pip list --format=json".split(),
    ]
    # No image: one message and a non-zero exit, as LUST's (which exits 1).
    proc = run(
        "list-packages",
        tmp_path / "root",
        sif=tmp_path / "gone.sif",
        path=f"{fake_singularity}:/usr/bin:/bin",
    )
    assert_one_message(proc, "list-packages")
    assert "gone.sif" in proc.stderr and lust["list-packages"]["no-image"] == "exit 1"


# --- python (the wrappers: copies of one script named python, pip, torchrun...) ----


@pytest.mark.parametrize("name", ["python", "pip3.12", "torchrun"])
def test_wrapper_runs_its_own_name_in_the_image(tmp_path, fake_singularity, name):
    sif = tmp_path / "my image, v1.sif"
    sif.write_text("sif")
    args = ["-c", "import sys; print(sys.prefix)", "a b", ""]
    proc = run(
        name,
        tmp_path / "root",
        *args,
        sif=sif,
        path=f"{fake_singularity}:/usr/bin:/bin",
        script="python",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\0")[:-1] == ["exec", str(sif), name, *args]
    # SIF, as the module sets it, wins over the image the file was written for.
    other = tmp_path / "other.sif"
    other.write_text("sif")
    proc = run(
        name,
        tmp_path / "root",
        sif=sif,
        env={"SIF": str(other)},
        path=f"{fake_singularity}:/usr/bin:/bin",
        script="python",
    )
    assert proc.stdout.split("\0")[:2] == ["exec", str(other)]


@pytest.mark.parametrize("var", ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"])
def test_wrapper_refuses_to_run_in_a_container(tmp_path, fake_singularity, var):
    """(Apptainer sets these in a container; /.singularity.d is tested too.)"""
    sif = tmp_path / "image.sif"
    sif.write_text("sif")
    proc = run(
        "pip",
        tmp_path / "root",
        "list",
        sif=sif,
        env={var: str(sif)},
        path=f"{fake_singularity}:/usr/bin:/bin",
        script="python",
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("pip: this host wrapper of the module does not run")
    assert proc.stderr.count("\n") == 1


def test_wrapper_without_the_image_or_singularity_is_one_message(
    tmp_path, fake_singularity
):
    proc = run(
        "python",
        tmp_path / "root",
        sif=tmp_path / "gone.sif",
        path=f"{fake_singularity}:/usr/bin:/bin",
        script="python",
    )
    assert_one_message(proc, "python")
    assert "gone.sif does not exist" in proc.stderr
    sif = tmp_path / "image.sif"
    sif.write_text("sif")
    only_bash = tmp_path / "only-bash"
    only_bash.mkdir()
    (only_bash / "bash").symlink_to("/bin/bash")
    proc = run(
        "torchrun", tmp_path / "root", sif=sif, path=str(only_bash), script="python"
    )
    assert_one_message(proc, "torchrun")


@pytest.mark.parametrize("name", ["python", "start-shell"])
def test_a_layer_only_wrapper_runs_the_layer_on_its_base_without_the_module(
    tmp_path, name
):
    """``$CONTAINERROOT/bin/python``: SIF unset, the layer on the base (issue 38, 5)."""
    base, layer = tmp_path / "base v1.sif", tmp_path / "my.sqfs"
    base.write_text("the base")
    on_base = LayerBase.of(SimpleNamespace(resolved=str(base), pinned=None))
    text = _host_command_text(name, image=layer, root=tmp_path / "root", base=on_base)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "singularity").write_text(
        '#!/bin/bash\nprintf "%s\\0" "$APPTAINER_OVERLAY" "$SINGULARITY_OVERLAY" "$@"\n'
    )
    (fake / "singularity").chmod(0o755)

    def wrapper():
        env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": "/nonexistent"}
        cmd = ["bash", "-c", text, name, "-c", "x"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    proc = wrapper()
    assert proc.returncode == 0, proc.stderr
    ro = f"{layer}:ro"
    assert proc.stdout.split("\0")[:4] == [ro, ro, "exec", str(base)]
    base.write_text("another base")
    assert_one_message(wrapper(), name)
    assert "is not the one the layer" in wrapper().stderr
    shellcheck = need_tool("shellcheck", install="apt-get install -y shellcheck")
    text += ': "$default_root"\n'  # (used by other commands)
    check = subprocess.run([shellcheck, "-s", "bash", "-"], input=text, text=True)
    assert check.returncode == 0
