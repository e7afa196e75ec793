import contextlib
import json
import os
from pathlib import Path
import signal
import struct
import subprocess
import time

import pytest
from siffile import JSON, OVERLAY, PARTITION, SQUASHFS, SYSTEM, write_sif

from cotainr_lumi import apptainer
from cotainr_lumi.errors import InputError


def fake_runtime(directory, name):
    """An executable NAME printing its argv and stdin as JSON."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'stdin': sys.stdin.read()}))\n"
    )
    path.chmod(0o755)
    return path


def test_apptainer_is_preferred_to_singularity(tmp_path, monkeypatch):
    # PATH holds only the fakes: a real apptainer on the host's PATH (CI
    # provisions one) must not take part.
    singularity = fake_runtime(tmp_path / "a", "singularity")
    monkeypatch.setenv("PATH", str(singularity.parent))
    assert apptainer.find_runtime() == str(singularity)
    app = fake_runtime(tmp_path / "b", "apptainer")
    monkeypatch.setenv("PATH", f"{singularity.parent}{os.pathsep}{app.parent}")
    assert apptainer.runtime() == str(app)


def test_no_runtime_is_none_or_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert apptainer.find_runtime() is None
    with pytest.raises(InputError, match="Neither 'apptainer' nor 'singularity'"):
        apptainer.exec_in_image(image=tmp_path / "x.sif", args=["true"])


def test_exec_in_image_runs_the_command_line_with_empty_stdin(tmp_path, monkeypatch):
    app = fake_runtime(tmp_path / "bin", "apptainer")
    monkeypatch.setenv("PATH", f"{app.parent}{os.pathsep}{os.environ['PATH']}")
    proc = apptainer.exec_in_image(image=tmp_path / "x.sif", args=["a b"])
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {
        "argv": ["exec", "--no-home", "--cleanenv", str(tmp_path / "x.sif"), "a b"],
        "stdin": "",
    }
    proc = apptainer.exec_in_image(image="/x.sif", args=["env"], env={"A": "1 2"})
    assert json.loads(proc.stdout)["argv"] == [
        "exec",
        "--no-home",
        "--cleanenv",
        "--env",
        "A=1 2",
        "/x.sif",
        "env",
    ]


def sleepy_runtime(directory, pid_file):
    """An `apptainer` that starts a long `sleep` (its pid in `pid_file`) and waits."""
    directory.mkdir(exist_ok=True)
    path = directory / "apptainer"
    path.write_text(f"#!/bin/sh\nsleep 120 &\necho $! > {pid_file}\nwait\n")
    path.chmod(0o755)
    return path


def alive(pid):
    """Whether `pid` runs (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("stop", ["timeout", "interrupt"])
def test_a_timeout_or_ctrl_c_stops_the_whole_container(tmp_path, monkeypatch, stop):
    pid_file = tmp_path / "pid"
    app = sleepy_runtime(tmp_path / "bin", pid_file)
    monkeypatch.setenv("PATH", f"{app.parent}{os.pathsep}{os.environ['PATH']}")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        if stop == "interrupt":
            signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(
            KeyboardInterrupt if stop == "interrupt" else subprocess.TimeoutExpired
        ):
            apptainer.exec_in_image(image=tmp_path / "x.sif", args=["x"], timeout=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not alive(pid)
    finally:  # the test's own fake container, when it was left running
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)


def test_is_sif_reads_the_magic(tmp_path):
    sif = tmp_path / "a.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC\x0001")
    text = tmp_path / "b.sif"
    text.write_text("not an image\n")
    assert apptainer.is_sif(sif) and not apptainer.is_sif(text)
    with pytest.raises(OSError):
        apptainer.is_sif(tmp_path)


def test_env_deadline_hint_names_the_env_scripts():
    hint = apptainer.env_deadline_hint(
        "FATAL:   context deadline exceeded", image="the base image b.sif"
    )
    assert "/.singularity.d/env scripts of the base image b.sif" in hint
    assert "60 s" in hint and "apptainer build --sandbox" in hint
    assert apptainer.env_deadline_hint("FATAL: no such file", image="x") == ""


def test_links_in_a_directory_image_are_read_without_following_them(tmp_path):
    (tmp_path / ".singularity.d").mkdir()
    (tmp_path / ".singularity.d/labels.json").symlink_to("/home/someone/.bashrc")
    (tmp_path / ".singularity.d/Singularity").write_text("bootstrap: x\n")
    assert apptainer.links_in_image(
        image=str(tmp_path), paths=apptainer.SANDBOX_METADATA
    ) == {"/.singularity.d/labels.json": "/home/someone/.bashrc"}
    (tmp_path / "plain").write_bytes(b"not a SIF")  # Apptainer makes no sandbox
    assert apptainer.links_in_image(image=str(tmp_path / "plain"), paths=["/x"]) == {}


def test_a_sif_without_unsquashfs_is_unknown(tmp_path, monkeypatch):
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n".ljust(32) + b"SIF_MAGIC")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert apptainer.links_in_image(image=str(sif), paths=["/x"]) is None


def test_the_unpacked_size_of_a_sif_is_the_sum_of_its_listed_files(
    tmp_path, monkeypatch
):
    sif = tmp_path / "x.sif"
    offset = write_sif(sif, [(PARTITION, b"squashfs", SQUASHFS, SYSTEM, "")])[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "unsquashfs": f"""[ "$2" = {offset} ] || exit 9
cat <<'EOF'
drwxr-xr-x root/root                53 2026-11-27 04:00 /opt
-rw-r--r-- root/root              1000 2026-11-27 04:00 /opt/a
-rwxr-xr-x root/root                24 2026-11-27 04:00 /opt/b c
lrwxrwxrwx root/root                 1 2026-11-27 04:00 /opt/l -> a
crw-rw-rw- root/root             1,  3 2026-11-27 04:00 /dev/null
EOF""",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert apptainer.unpacked_bytes(image=str(sif)) == 1024
    assert apptainer.unpacked_bytes(image=str(tmp_path / "none.sif")) is None


def test_the_objects_of_a_sif_are_read_from_its_descriptors(tmp_path):
    sif = tmp_path / "x.sif"
    objects = [
        (JSON, b"{}", 0, 0, "inspect-metadata.json"),
        (PARTITION, b"system", SQUASHFS, SYSTEM, ""),
        (PARTITION, b"layer", SQUASHFS, OVERLAY, ""),
    ]
    offsets = write_sif(sif, objects)
    meta, system, layer = apptainer.sif_objects(sif)
    assert (meta.id, meta.datatype, meta.name, meta.size) == (1, JSON, objects[0][4], 2)
    assert (system.parttype, system.fstype, system.arch) == (SYSTEM, SQUASHFS, 2)
    assert (layer.id, layer.parttype, layer.offset, layer.size) == (
        3,
        OVERLAY,
        offsets[2],
        5,
    )
    assert sif.read_bytes()[layer.offset : layer.offset + layer.size] == b"layer"
    sif.write_bytes(sif.read_bytes()[:60])  # cut short
    with pytest.raises(ValueError, match="not a SIF image"):
        apptainer.sif_objects(sif)


@pytest.mark.parametrize(
    "total, offset, what",
    [
        (2**40, 128, "1099511627776 descriptors"),  # the issue's: a MemoryError
        (-1, 128, "-1 descriptors"),
        (3, 2**62, "at offset"),
        (48, 128, "cut short"),
    ],
)
def test_a_malformed_sif_header_is_one_input_error(tmp_path, total, offset, what):
    sif = tmp_path / "x.sif"
    write_sif(sif, [(PARTITION, b"system", SQUASHFS, SYSTEM, "")])
    data = bytearray(sif.read_bytes())
    struct.pack_into("<qq", data, 88, total, offset)
    sif.write_bytes(bytes(data))
    with pytest.raises(InputError, match=f"not a valid SIF image: .*{what}"):
        apptainer.sif_objects(sif)


def test_a_sif_object_outside_the_file_is_one_input_error(tmp_path):
    sif = tmp_path / "x.sif"
    write_sif(sif, [(PARTITION, b"system", SQUASHFS, SYSTEM, "")])
    data = bytearray(sif.read_bytes())
    struct.pack_into("<q", data, 128 + 25, 2**40)  # the object's size
    sif.write_bytes(bytes(data))
    with pytest.raises(InputError, match="object 1 lies outside the file"):
        apptainer.sif_objects(sif)


def test_a_fifo_is_no_sif_and_is_never_opened(tmp_path):
    os.mkfifo(tmp_path / "x.sif")  # opening it for reading would block
    with pytest.raises(OSError, match="not a regular file"):
        apptainer.is_sif(tmp_path / "x.sif")
    with pytest.raises(OSError, match="not a regular file"):
        apptainer.sif_objects(tmp_path / "x.sif")


def test_bind_mounts_add_to_the_bind_variable_and_restore_it(monkeypatch):
    monkeypatch.delenv(apptainer.BIND_VARIABLE, raising=False)
    with apptainer.bind_mounts(["/a:/b:ro"]):
        assert os.environ[apptainer.BIND_VARIABLE] == "/a:/b:ro"
        with apptainer.bind_mounts(["/c:/d", "/e:/f:ro"]):
            assert os.environ[apptainer.BIND_VARIABLE] == "/a:/b:ro,/c:/d,/e:/f:ro"
        with apptainer.bind_mounts([]):
            assert os.environ[apptainer.BIND_VARIABLE] == "/a:/b:ro"
        assert os.environ[apptainer.BIND_VARIABLE] == "/a:/b:ro"
    assert apptainer.BIND_VARIABLE not in os.environ
    with pytest.raises(RuntimeError), apptainer.bind_mounts(["/a:/b"]):
        raise RuntimeError
    assert apptainer.BIND_VARIABLE not in os.environ
    assert apptainer.can_bind("/p/torch-2.13.0+cpu.whl")
    assert not apptainer.can_bind("/p/a,b.whl") and not apptainer.can_bind("/p:q")
