"""Layered builds' host side (cotainr_lumi/engine/layer.py)."""

import errno
import json
import os
from pathlib import Path
import shutil
import subprocess

from hosttools import need_root, need_tool
import pytest
from siffile import EXT3, JSON, OVERLAY, PARTITION, SQUASHFS, SYSTEM, write_sif

from cotainr_lumi import apptainer
from cotainr_lumi.engine import layer
from cotainr_lumi.errors import InputError


def sif(path, *overlays, labels=None):
    """A SIF with a squashfs system partition, `overlays` (fs types) and metadata."""
    objects = [(PARTITION, b"system", SQUASHFS, SYSTEM, "")]
    objects += [(PARTITION, b"layer", fstype, OVERLAY, "") for fstype in overlays]
    if labels is not None:
        data = {"data": {"attributes": {"labels": labels}}}
        objects.append((JSON, json.dumps(data).encode(), 0, 0, layer.METADATA_NAME))
    write_sif(path, objects)
    return path


def test_a_squashfs_sif_can_be_mounted_as_root_with_mksquashfs(tmp_path, monkeypatch):
    need_tool("mksquashfs", install="apt-get install -y squashfs-tools")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert layer.mount_problem(sif(tmp_path / "a.sif", SQUASHFS)) is None
    problem = layer.mount_problem(sif(tmp_path / "b.sif", EXT3))
    assert "partitions are not squashfs" in problem  # a writable ext3 overlay
    (tmp_path / "c.sif").write_text("not a SIF")
    assert "not a SIF image" in layer.mount_problem(tmp_path / "c.sif")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "squashfuse and fuse-overlayfs" in layer.mount_problem(tmp_path / "a.sif")


def test_the_partitions_mount_newest_layer_first(tmp_path):
    objects = apptainer.sif_objects(sif(tmp_path / "a.sif", SQUASHFS, SQUASHFS))
    parts = layer._partitions(objects)
    assert [(p.id, p.parttype) for p in parts] == [
        (3, OVERLAY),
        (2, OVERLAY),
        (1, SYSTEM),
    ]


def test_fuse_whiteout_files_become_overlay_whiteouts(tmp_path):
    upper = tmp_path / "upper"
    (upper / "d").mkdir(parents=True)
    (upper / "a b").mkdir()
    for name in (".wh.gone", "d/.wh..wh..opq", "d/new", "a b/.wh.x y", "keep"):
        (upper / name).touch()
    args = layer.whiteout_arguments(upper)
    assert args == [
        *("-p", "/gone c 0 0 0 0 0"),
        *("-p", "/a\\ b/x\\ y c 0 0 0 0 0"),
        *("-p", "/d x trusted.overlay.opaque=y"),
        *("-wildcards", "-e", "... .wh.*"),  # -e last: it takes all after it
    ]
    assert layer.whiteout_arguments(tmp_path / "empty") == []
    need_tool("unsquashfs", install="apt-get install -y squashfs-tools")
    (upper / "d/.wh..wh..opq").unlink()  # mksquashfs < 4.6 has no xattr pseudo
    out = tmp_path / "layer.sqfs"
    subprocess.run(
        ["mksquashfs", upper, out, "-quiet", *layer.whiteout_arguments(upper)],
        check=True,
    )
    listing = subprocess.run(
        ["unsquashfs", "-lls", out], capture_output=True, text=True, check=True
    ).stdout
    entries = {ln[ln.index("squashfs-root") :]: ln[0] for ln in listing.splitlines()}
    assert entries["squashfs-root/gone"] == entries["squashfs-root/a b/x y"] == "c"
    assert entries["squashfs-root/d/new"] == "-"
    assert not [name for name in entries if "/.wh." in name]


def test_fuse_overlayfs_writes_wh_files_and_refuses_them_from_users(tmp_path):
    """
    What fuse-overlayfs (Debian 12's 1.10) writes where it cannot mknod.

    FUSE_OVERLAYFS_DISABLE_OVL_WHITEOUT takes that path as root (main.c,
    check_can_mknod): an empty ``.wh.NAME`` per removed file, ``.wh..wh..opq``
    in a directory made again; a user's ``.wh.`` name is EINVAL. So in its
    upper dir every ``.wh.`` file is a whiteout (the kernel's overlay, which
    writes a character device 0/0, keeps a package's ``.wh.`` file as it is).
    """
    need_root("mounts fuse-overlayfs (/dev/fuse)")
    need_tool("fuse-overlayfs", install="apt-get install -y fuse-overlayfs")
    for name in ("lower/d", "upper", "work", "m"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "lower/gone").write_text("x")
    (tmp_path / "lower/d/old").write_text("y")
    dirs = (
        f"lowerdir={tmp_path}/lower,upperdir={tmp_path}/upper,workdir={tmp_path}/work"
    )
    env = {**os.environ, "FUSE_OVERLAYFS_DISABLE_OVL_WHITEOUT": "1"}
    subprocess.run(["fuse-overlayfs", "-o", dirs, tmp_path / "m"], env=env, check=True)
    try:
        (tmp_path / "m/gone").unlink()
        shutil.rmtree(tmp_path / "m/d")
        (tmp_path / "m/d").mkdir()
        with pytest.raises(OSError) as refused:
            (tmp_path / "m/.wh.pip").write_text("a package's file")
    finally:
        subprocess.run(["fusermount3", "-u", tmp_path / "m"], check=True)
    assert refused.value.errno == errno.EINVAL
    upper = tmp_path / "upper"
    found = {str(p.relative_to(upper)): p.stat().st_size for p in upper.rglob("*")}
    assert found == {".wh.gone": 0, "d": found["d"], "d/.wh..wh..opq": 0}
    assert layer.whiteout_arguments(upper)[:2] == ["-p", "/gone c 0 0 0 0 0"]


def test_the_layers_label_names_the_base_and_its_layers(tmp_path):
    view = layer.BaseView(base=sif(tmp_path / "b.sif", labels={}), work=tmp_path)
    assert view.label() == "b.sif + this build"
    assert view.label(sha256="ab12") == "b.sif sha256:ab12 + this build"
    earlier = {"cotainr-lumi.layers": "a.sif sha256:ab12 + layer sha256:cd34"}
    view = layer.BaseView(
        base=sif(tmp_path / "c.sif", SQUASHFS, labels=earlier), work=tmp_path
    )
    assert view.label(sha256="ef56") == f"{earlier['cotainr-lumi.layers']} + this build"


def test_a_killed_builds_mounts_are_unmounted(tmp_path):
    need_root("mounts a tmpfs")
    build = tmp_path / "cotainr-lumi-build-1-x"
    for name in ("merged", "lower-1"):
        (build / name).mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", build / name], check=True)
    (build / "merged/file").touch()
    layer.unmount_below(build)
    mounts = Path("/proc/self/mounts").read_text()
    assert str(build) not in mounts
    assert not (build / "merged/file").exists()
    shutil.rmtree(build)


def test_an_interrupted_mount_leaves_nothing_mounted(tmp_path, monkeypatch):
    # SIGTERM while the overlay is mounted: cotainr then removes the sandbox
    # directory, which must not hold the base's files any more.
    from cotainr_lumi.processes import BuildInterruptedError

    unmounted = []

    def run(cmd):
        if cmd[0] == "fuse-overlayfs":
            raise BuildInterruptedError(15)

    monkeypatch.setattr(layer, "_run", run)
    monkeypatch.setattr(layer, "unmount", unmounted.append)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    view = layer.BaseView(base=sif(tmp_path / "a.sif"), work=tmp_path / "build")
    with pytest.raises(BuildInterruptedError):
        view.mount(at=tmp_path / "sandbox")
    assert unmounted == [tmp_path / "sandbox", tmp_path / "build" / "lower-1"]
    assert view.merged is None


def test_a_mount_the_runtime_cannot_run_is_undone(tmp_path, monkeypatch):
    # LUMI's setuid runtime may not see a user's FUSE mounts (no allow_other):
    # the view is unmounted and the build unpacks the base instead.
    done, unmounted, runs = [], [], []

    def exec_in_image(**kwargs):
        runs.append(kwargs)
        return subprocess.CompletedProcess([], 255, "", "FATAL: permission denied\n")

    monkeypatch.setattr(layer, "_run", lambda cmd: done.append(str(cmd[0])))
    monkeypatch.setattr(layer, "unmount", unmounted.append)
    monkeypatch.setattr(layer.apptainer, "exec_in_image", exec_in_image)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    view = layer.BaseView(base=sif(tmp_path / "a.sif"), work=tmp_path / "build")
    with pytest.raises(
        layer.LayerError, match="cannot run .*: FATAL: permission denied"
    ):
        view.mount(at=tmp_path / "sandbox")
    assert done == ["squashfuse", "fuse-overlayfs"]
    assert runs == [
        {
            "image": tmp_path / "sandbox",
            "args": ["true"],
            "writable": True,
            "timeout": 300,
        }
    ]
    assert unmounted == [tmp_path / "sandbox", tmp_path / "build/lower-1"]
    assert view.merged is None and view.mounts == []


def test_a_base_whose_env_scripts_never_finish_stops_the_build(tmp_path, monkeypatch):
    # Unpacking it would wait for the same env scripts again (Apptainer's 60 s).
    deadline = "FATAL: while running env scripts: context deadline exceeded\n"
    monkeypatch.setattr(layer, "_run", lambda cmd: None)
    monkeypatch.setattr(layer, "unmount", lambda path: None)
    monkeypatch.setattr(
        layer.apptainer,
        "exec_in_image",
        lambda **kwargs: subprocess.CompletedProcess([], 255, "", deadline),
    )
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    base = sif(tmp_path / "a.sif")
    view = layer.BaseView(base=base, work=tmp_path / "build")
    with pytest.raises(InputError) as caught:
        view.mount(at=tmp_path / "sandbox")
    assert str(caught.value).startswith(
        f"The base image {base} does not start: {deadline.strip()}. The "
        f"/.singularity.d/env scripts of the base image {base} did not finish"
    )
    assert view.merged is None and view.mounts == []


@pytest.mark.parametrize(
    "name, shown", [("i.sqfs", True), ("i.sqfs", False), ("a,b:c.sqfs", True)]
)
def test_a_layer_only_image_is_checked_on_the_base_as_the_module_runs_it(
    tmp_path, monkeypatch, name, shown
):
    """--layer-only: the layer at the image path, run as ``exec --overlay LAYER BASE``."""
    runs, labels = [], '{"a": "b"}'

    def exec_in_image(**kwargs):
        runs.append(kwargs)
        return subprocess.CompletedProcess([], 0, labels if shown else "{}", "")

    monkeypatch.setattr(layer, "_run", lambda cmd: Path(cmd[2]).write_text("sqfs"))
    monkeypatch.setattr(layer.apptainer, "exec_in_image", exec_in_image)
    monkeypatch.setattr(layer.apptainer, "runtime", lambda: "apptainer")
    base = sif(tmp_path / "base.sif")
    view = layer.BaseView(base=base, work=tmp_path, only=True)
    view.merged = tmp_path / "merged"
    (view.merged / ".singularity.d").mkdir(parents=True)
    (view.merged / ".singularity.d/labels.json").write_text(labels)
    image, kept = tmp_path / name, shown and "," not in name  # else: the whole SIF
    assert view.write_image(path=image) is kept
    args = ["cat", "/.singularity.d/labels.json"]
    run = {"image": base, "args": args, "overlay": f"{image}:ro"}
    assert runs == ([] if "," in name else [run])
    assert image.exists() is kept and view.kept is kept
    assert base.read_bytes() == sif(tmp_path / "again.sif").read_bytes()


def test_a_work_dir_the_runtime_cannot_take_in_a_list_is_refused(tmp_path):
    work = tmp_path / "a,b"
    view = layer.BaseView(base=sif(tmp_path / "a.sif"), work=work)
    with pytest.raises(layer.LayerError, match=r"has a ',' or ':'"):
        view.mount(at=tmp_path / "sandbox")
    assert view.merged is None and not (tmp_path / "sandbox").exists()
