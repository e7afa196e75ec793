"""Tests of cotainr_lumi.engine.rootfs: hostile symlinks never lead to host files."""

import os

from hosttools import need_root
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from cotainr_lumi.engine.rootfs import (
    SymlinkLoopError,
    image_path_of,
    is_inside,
    resolve_in_root,
    walk_in_root,
    write_file_in_root,
)


@pytest.fixture
def host(tmp_path):
    """A host directory with a precious file, outside the sandbox."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("host data")
    return host


@pytest.fixture
def root(tmp_path, host):
    root = tmp_path / "root"
    (root / "opt/env/lib").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/precious").write_text("image data")
    (root / "opt/abs").symlink_to(host)  # absolute host path
    (root / "opt/dotdot").symlink_to("../../../../../../../../../.." + str(host))
    (root / "opt/loop1").symlink_to("loop2")
    (root / "opt/loop2").symlink_to("loop1")
    (root / "opt/etclink").symlink_to("/etc")
    return root


def test_absolute_and_dotdot_links_stay_inside(root, host):
    for link in ("/opt/abs/precious", "/opt/dotdot/precious"):
        resolved = resolve_in_root(root=root, path=link)
        assert is_inside(parent=root, path=resolved)
        assert resolved == root / str(host / "precious").lstrip("/")
        assert not resolved.exists()
    assert (
        resolve_in_root(root=root, path="/opt/etclink/precious").read_text()
        == "image data"
    )
    assert (
        resolve_in_root(root=root, path="/../../../etc/precious")
        == root / "etc/precious"
    )


def test_loops_raise(root):
    with pytest.raises(SymlinkLoopError):
        resolve_in_root(root=root, path="/opt/loop1/x")
    assert (
        resolve_in_root(root=root, path="/opt/loop1", follow_final=False)
        == root / "opt/loop1"
    )


def test_walk_reports_links_and_never_follows_them(root, host):
    entries = {
        image_path_of(root=root, host_path=e.host_path).as_posix(): e.kind
        for e in walk_in_root(root=root, path="/opt")
    }
    assert entries["/opt/abs"] == "symlink" and entries["/opt/dotdot"] == "symlink"
    assert entries["/opt/env/lib"] == "dir"
    assert not any("precious" in p for p in entries)
    # Starting through a link resolves the start inside the root.
    assert [e.host_path.name for e in walk_in_root(root=root, path="/opt/etclink")] == [
        "precious"
    ]
    assert (
        list(walk_in_root(root=root, path="/opt/abs")) == []
    )  # root/<host> does not exist


def test_walk_of_a_loop_start_raises(root):
    with pytest.raises(SymlinkLoopError):
        list(walk_in_root(root=root, path="/opt/loop1"))


def test_write_never_writes_through_links(root, host):
    (root / "opt/env/lib/out").symlink_to(host / "precious")
    write_file_in_root(root=root, path="/opt/env/lib/out", content="x")
    write_file_in_root(root=root, path="/opt/abs/new", content="y")
    assert (host / "precious").read_text() == "host data"
    assert not (host / "new").exists()
    assert (root / str(host).lstrip("/") / "new").read_text() == "y"


def test_is_inside():
    assert is_inside(parent="/a/b", path="/a/b")
    assert is_inside(parent="/a/b", path="/a/b/c")
    assert not is_inside(parent="/a/b", path="/a/bc")
    assert not is_inside(parent="/a/b", path="/a")


# -- property: resolve_in_root agrees with the kernel under chroot ------------

NAMES = ["a", "b", "c"]
component = st.sampled_from(NAMES + ["..", "."])
rel_target = st.lists(component, min_size=1, max_size=4).map("/".join)
abs_target = st.lists(component, min_size=0, max_size=4).map(
    lambda p: "/" + "/".join(p)
)
tree = st.dictionaries(
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join),
    st.one_of(st.just("dir"), st.just("file"), rel_target, abs_target),
    max_size=8,
)
query = st.lists(component, min_size=1, max_size=5).map(lambda p: "/" + "/".join(p))


def _kernel_stat_in_chroot(root, paths):
    """(dev, ino) of each path as the kernel resolves it with `root` as /, or None."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_fd)
            os.chroot(root)
            os.chdir("/")
            out = []
            for p in paths:
                try:
                    s = os.stat(p)
                    out.append(f"{s.st_dev}:{s.st_ino}")
                except OSError:
                    out.append("-")
            os.write(write_fd, "\n".join(out).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 65536):
        data += chunk
    os.close(read_fd)
    os.waitpid(pid, 0)
    return [
        None if x == "-" else tuple(map(int, x.split(":")))
        for x in data.decode().split("\n")
    ]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(layout=tree, queries=st.lists(query, min_size=1, max_size=6))
def test_resolve_matches_kernel_under_chroot(tmp_path_factory, layout, queries):
    need_root("the kernel's own resolution is observed under chroot")
    root = tmp_path_factory.mktemp("chroot")
    for path, kind in sorted(layout.items()):
        host = root / path
        # Never build the layout through a link made earlier: it may point
        # out of the root, and the test must not write outside it.
        parents = [
            root.joinpath(*path.split("/")[:i]) for i in range(1, path.count("/") + 1)
        ]
        if any(p.is_symlink() for p in parents):
            continue
        try:
            host.parent.mkdir(parents=True, exist_ok=True)
            if kind == "dir":
                host.mkdir(exist_ok=True)
            elif kind == "file":
                host.write_text(path)
            else:
                host.symlink_to(kind)
        except OSError:
            continue  # a parent is a file or link: that entry cannot exist
    expected = _kernel_stat_in_chroot(root, queries)
    for q, want in zip(queries, expected):
        try:
            got = resolve_in_root(root=root, path=q)
        except SymlinkLoopError:
            assert want is None, q
            continue
        assert is_inside(parent=root, path=got)
        if want is not None:
            st_got = os.stat(got, follow_symlinks=False)
            assert (st_got.st_dev, st_got.st_ino) == want, (q, got)
