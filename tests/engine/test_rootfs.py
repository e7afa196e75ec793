"""Tests of cotainr_lumi.engine.rootfs: hostile symlinks never lead to host files."""

import os

from hosttools import need_root
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from cotainr_lumi.engine.rootfs import (
    SymlinkLoopError,
    claim_build_dirs,
    image_path_of,
    is_inside,
    resolve_in_root,
    walk_in_root,
    write_file_in_root,
)
from cotainr_lumi.errors import CotainrLumiError


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
        image_path_of(root=root, host_path=e.path).as_posix(): e.kind
        for e in walk_in_root(root=root, path="/opt")
    }
    assert entries["/opt/abs"] == "symlink" and entries["/opt/dotdot"] == "symlink"
    assert entries["/opt/env/lib"] == "dir"
    assert not any("precious" in p for p in entries)
    # Starting through a link resolves the start inside the root.
    assert [
        os.path.basename(e.path) for e in walk_in_root(root=root, path="/opt/etclink")
    ] == ["precious"]
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


# -- claim_build_dirs: the build's directories are real ones (issue 29) -------

#: Image paths the build writes (records, pip, runscripts, env scripts).
WRITTEN = [
    "/opt/cotainr-lumi/provenance.json",
    "/opt/cotainr-lumi/pip/step1/reqs.txt",
    "/opt/cotainr-lumi/.pip-work/staging/step1/x.whl",
    "/runscripts/conda-python-simple",
    "/.singularity.d/env/93-cotainr-lumi-env.sh",
]


@pytest.fixture
def sandbox(tmp_path):
    """A sandbox with the directories the build writes into (none yet a link)."""
    root = tmp_path / "sandbox"
    for path in ("opt", ".singularity.d/env", "usr/share/runscripts.d"):
        (root / path).mkdir(parents=True)
    (root / ".singularity.d/env/90-environment.sh").write_text("base env\n")
    (root / "usr/share/runscripts.d/base-tool").write_text("base tool\n")
    return root


def written_inside(root):
    """Whether every path the build writes resolves to its plain path in `root`."""
    return all(
        resolve_in_root(root=root, path=p) == root / p.lstrip("/") for p in WRITTEN
    )


def host_files(host):
    """Every path below `host` with its content (None for a directory)."""
    return {p: p.read_bytes() if p.is_file() else None for p in host.rglob("*")}


@pytest.mark.parametrize(
    "link",
    [
        "{host}",  # absolute: in the container, the host's directory
        "../../../../../../../..{host}",  # relative, escaping the root
        "../tmp/x",  # relative, inside the root: the host's /tmp/x at run time
    ],
)
def test_a_records_dir_linking_out_becomes_a_real_directory(sandbox, host, link):
    # Before: records were written inside the sandbox, but pip in the
    # container read the host directory the link named.
    (host / "pip/step1").mkdir(parents=True)
    (host / "pip/step1/reqs.txt").write_text("planted-package\n")
    before = host_files(host)
    (sandbox / "opt/cotainr-lumi").symlink_to(link.format(host=host))
    claim_build_dirs(root=sandbox)
    records = sandbox / "opt/cotainr-lumi"
    assert records.is_dir() and not records.is_symlink()
    assert list(records.iterdir()) == []
    assert written_inside(sandbox)
    write_file_in_root(root=sandbox, path=WRITTEN[1], content="wanted\n")
    assert (records / "pip/step1/reqs.txt").read_text() == "wanted\n"
    assert host_files(host) == before


def test_links_inside_the_records_dir_are_removed(sandbox, host):
    records = sandbox / "opt/cotainr-lumi"
    (records / "history/1").mkdir(parents=True)
    (records / "with-conda.sh").write_text("kept\n")
    (records / "pip").symlink_to(host)
    (records / ".pip-work").symlink_to("/tmp/x")
    (records / "history/1/pip").symlink_to(host)
    before = host_files(host)
    claim_build_dirs(root=sandbox)
    assert sorted(p.name for p in records.rglob("*")) == [
        "1",
        "history",
        "with-conda.sh",
    ]
    assert (records / "with-conda.sh").read_text() == "kept\n"
    assert written_inside(sandbox)
    assert host_files(host) == before


def test_runscripts_and_env_dirs_linked_inside_the_image_keep_their_files(sandbox):
    (sandbox / "runscripts").symlink_to("usr/share/runscripts.d")
    (sandbox / ".singularity.d/env").rename(sandbox / "opt/env.d")
    (sandbox / ".singularity.d/env").symlink_to("/opt/env.d")
    claim_build_dirs(root=sandbox)
    for path, name, text in (
        ("runscripts", "base-tool", "base tool\n"),
        (".singularity.d/env", "90-environment.sh", "base env\n"),
    ):
        assert not (sandbox / path).is_symlink()
        assert (sandbox / path / name).read_text() == text
    assert written_inside(sandbox)
    # The link targets are left as they were.
    assert (sandbox / "usr/share/runscripts.d/base-tool").read_text() == "base tool\n"


def test_a_link_to_an_enclosing_directory_is_not_copied_into_itself(sandbox):
    (sandbox / "runscripts").symlink_to("/")
    claim_build_dirs(root=sandbox)
    assert (sandbox / "runscripts").is_dir()
    assert list((sandbox / "runscripts").iterdir()) == []


@pytest.mark.parametrize(
    "above", ["opt", ".singularity.d", ".singularity.d/labels.json"]
)
def test_a_link_above_the_build_dirs_or_at_the_labels_is_one_error(
    sandbox, host, above
):
    # Before: cotainr's metadata step rewrote the host's labels.json.
    (sandbox / ".singularity.d/labels.json").write_text("{}")
    (sandbox / above).rename(sandbox / "moved")
    (sandbox / above).symlink_to(
        host / "labels.json" if above.endswith(".json") else host
    )
    before = host_files(host)
    with pytest.raises(CotainrLumiError, match=f"base image's /{above} is a symbolic"):
        claim_build_dirs(root=sandbox)
    assert (sandbox / above).is_symlink()
    assert host_files(host) == before


def test_real_build_dirs_are_left_alone(sandbox):
    (sandbox / "opt/cotainr-lumi/pip").mkdir(parents=True)
    (sandbox / "opt/cotainr-lumi/pip/steps.json").write_text("{}")
    before = sorted(sandbox.rglob("*"))
    claim_build_dirs(root=sandbox)
    assert sorted(sandbox.rglob("*")) == before
    assert written_inside(sandbox)


def test_resolve_in_root_clamps_dotdot_unless_confined(tmp_path):
    (tmp_path / "a").symlink_to("../../etc")
    assert resolve_in_root(root=tmp_path, path="/a") == tmp_path / "etc"
    with pytest.raises(OSError, match="links to outside"):
        resolve_in_root(root=tmp_path, path="/a", confine=True)
