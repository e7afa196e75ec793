"""Tests of cotainr_lumi.stages.prune.libstdcxx on a fake sandbox root with real ELF files."""

import os
from pathlib import Path
import shutil

import elfbuild
import pytest

from cotainr_lumi.engine import elfinfo
from cotainr_lumi.stages.prune.libstdcxx import (
    check_libstdcxx,
    find_system_libstdcxx,
    format_missing,
    parse_ldconfig,
    remove_libstdcxx,
    version_sort_key,
)
from cotainr_lumi.stages.prune.manifest import PruneManifest

ENV = "/opt/cotainr/conda/envs/conda_container_env"
DEB_DIR = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return elfbuild.Kit(tmp_path_factory.mktemp("kit"))


def install_lib(directory, lib, *, links=("libstdc++.so.6",)):
    """Copy a fake libstdc++ into `directory` with its usual symlinks."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy2(lib, directory / lib.name)
    for link in links:
        (directory / link).symlink_to(lib.name)
    return directory / lib.name


@pytest.fixture
def root(tmp_path, kit):
    """A sandbox: a 'system' libstdc++ up to GLIBCXX_3.4.20 and an env with 3.4.30."""
    root = tmp_path / "sandbox"
    install_lib(root / DEB_DIR, kit.sys_lib)
    env = root / ENV.lstrip("/")
    install_lib(env / "lib", kit.env_lib, links=("libstdc++.so.6", "libstdc++.so"))
    site = env / "lib/python3.11/site-packages/pkg"
    site.mkdir(parents=True)
    shutil.copy2(kit.old_user, site / "_old.so")
    (site / "__init__.py").write_text("")
    return root


def env_lib(root):
    return root / ENV.lstrip("/") / "lib"


def test_safe_when_system_defines_every_needed_version(root):
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status == "safe", check.reason
    assert check.system.image_path == f"/{DEB_DIR}/libstdc++.so.6"
    assert check.requirers == 1 and check.missing == {}
    assert "GLIBCXX_3.4.9" in check.reason
    names = sorted(p.name for p in check.candidates)
    assert names == ["libstdc++.so", "libstdc++.so.6", "libstdc++.so.6.0.30"]
    manifest = PruneManifest()
    freed = remove_libstdcxx(check=check, root=root, manifest=manifest)
    assert not any(env_lib(root).glob("libstdc++.so*"))
    assert (root / DEB_DIR / "libstdc++.so.6.0.20").is_file()
    assert freed == manifest.bytes_saved > 1000
    assert {e.path for e in manifest.entries} == {f"{ENV}/lib/{n}" for n in names}
    assert all(
        e.action == "removed" and e.group == "libstdcxx" for e in manifest.entries
    )


def test_unsafe_lists_objects_and_missing_versions(root, kit):
    shutil.copy2(kit.new_user, env_lib(root) / "libnew.so")
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status == "unsafe"
    assert check.missing == {
        f"{ENV}/lib/libnew.so": ["CXXABI_1.3.13", "GLIBCXX_3.4.30"]
    }
    text = format_missing(check=check)
    assert f"{ENV}/lib/libnew.so: needs CXXABI_1.3.13, GLIBCXX_3.4.30" in text
    with pytest.raises(ValueError):
        remove_libstdcxx(check=check, root=root, manifest=PruneManifest())
    assert (env_lib(root) / "libstdc++.so.6.0.30").is_file()


def test_absent_when_env_has_no_libstdcxx(root):
    for p in env_lib(root).glob("libstdc++.so*"):
        p.unlink()
    assert check_libstdcxx(root=root, env_prefix=ENV).status == "absent"
    assert check_libstdcxx(root=root, env_prefix="/no/such/env").status == "absent"


def test_system_prefix_is_never_an_environment(root):
    check = check_libstdcxx(root=root, env_prefix="/usr")
    assert check.status == "unsupported" and "system itself" in check.reason


def test_no_system_libstdcxx_is_unsafe_when_used(root):
    shutil.rmtree(root / DEB_DIR)
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status == "unsafe"
    assert check.system is None and "has no libstdc++.so.6" in check.reason
    assert list(check.missing) == [f"{ENV}/lib/python3.11/site-packages/pkg/_old.so"]


def test_ldconfig_cache_entry_is_preferred(root, kit):
    # The loader cache names /usr/lib64 (as on SLES): that one decides, and it lacks 3.4.30.
    install_lib(root / "usr/lib64", kit.sys_lib)
    shutil.rmtree(root / DEB_DIR)
    install_lib(root / DEB_DIR, kit.host_lib)  # newer, but not what the loader uses
    shutil.copy2(kit.new_user, env_lib(root) / "libnew.so")
    ldconfig = (
        "1234 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibstdc++.so.6 (libc6,x86-64) => /usr/lib64/libstdc++.so.6\n"
        "\tlibstdc++.so.6 (libc6) => /usr/lib/libstdc++.so.6\n"
    )
    assert parse_ldconfig(text=ldconfig)[0] == (
        "libstdc++.so.6",
        "libc6,x86-64",
        "/usr/lib64/libstdc++.so.6",
    )
    check = check_libstdcxx(root=root, env_prefix=ENV, ldconfig_text=ldconfig)
    assert (
        check.system.image_path == "/usr/lib64/libstdc++.so.6"
        and check.system.how == "ld.so.cache"
    )
    assert check.status == "unsafe"
    # Without the cache, the standard directories are searched in order: /usr/lib64 first.
    assert find_system_libstdcxx(root=root).image_path == "/usr/lib64/libstdc++.so.6"


def test_version_sort_is_numeric():
    versions = [
        "GLIBCXX_3.4.30",
        "GLIBCXX_3.4.9",
        "GLIBCXX_3.4",
        "CXXABI_1.3.13",
        "CXXABI_1.3.2",
    ]
    assert sorted(versions, key=version_sort_key) == [
        "CXXABI_1.3.2",
        "CXXABI_1.3.13",
        "GLIBCXX_3.4",
        "GLIBCXX_3.4.9",
        "GLIBCXX_3.4.30",
    ]


# -- hostile symlinks ---------------------------------------------------------


@pytest.fixture
def host_dir(tmp_path, kit):
    """A host directory holding a libstdc++ that defines every version."""
    host = tmp_path / "host-usr-lib"
    install_lib(host, kit.host_lib)
    return host


@pytest.fixture
def spy_reads(mocker):
    """Record every file the ELF reader opens."""
    opened = []
    real = elfinfo._open_fd

    def spy(path):
        opened.append(os.path.abspath(path))
        return real(path)

    mocker.patch.object(elfinfo, "_open_fd", side_effect=spy)
    return opened


@pytest.mark.parametrize("style", ["absolute", "dotdot"])
def test_system_lib_link_to_host_is_never_read(root, kit, host_dir, spy_reads, style):
    """A system libstdc++ that links to a host path resolves inside the root."""
    shutil.rmtree(root / DEB_DIR)
    (root / DEB_DIR).mkdir(parents=True)
    target = host_dir / "libstdc++.so.6"
    link = root / DEB_DIR / "libstdc++.so.6"
    if style == "absolute":
        link.symlink_to(target)
    else:
        link.symlink_to("../" * 12 + str(target).lstrip("/"))
    shutil.copy2(kit.new_user, env_lib(root) / "libnew.so")
    check = check_libstdcxx(root=root, env_prefix=ENV)
    # Had the host file been used, every version would be defined ("safe").
    assert check.status == "unsafe" and check.system is None
    assert spy_reads and all(p.startswith(str(root) + os.sep) for p in spy_reads)
    assert (host_dir / kit.host_lib.name).is_file()


def test_symlink_loop_is_skipped(root, kit):
    shutil.rmtree(root / DEB_DIR)
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64/libstdc++.so.6").symlink_to("libstdc++.so.6")
    (root / "lib64").symlink_to("usr/lib64")
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.system is None and check.status == "unsafe"


def test_symlinked_lib_dir_out_of_env_is_left_alone(root, kit):
    """env/lib -> /usr/lib/x86_64-linux-gnu must not make us delete the system library."""
    lib = env_lib(root)
    shutil.rmtree(lib)
    lib.symlink_to(f"/{DEB_DIR}")
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status == "unsupported" and "outside the environment" in check.reason
    assert not check.candidates
    assert (root / DEB_DIR / "libstdc++.so.6.0.20").is_file()


def test_symlinked_lib_dir_to_host_resolves_inside_root(root, host_dir):
    lib = env_lib(root)
    shutil.rmtree(lib)
    lib.symlink_to(
        host_dir
    )  # an absolute host path: inside the image it is root/<host_dir>
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status in ("absent", "unsupported")
    assert (host_dir / "libstdc++.so.6").is_symlink() and (
        host_dir / "libstdc++.so.6.0.30"
    ).is_file()


def test_env_link_to_system_lib_removes_only_the_link(root):
    lib = env_lib(root)
    for p in lib.glob("libstdc++.so*"):
        p.unlink()
    (lib / "libstdc++.so.6").symlink_to(f"/{DEB_DIR}/libstdc++.so.6.0.20")
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status == "safe"
    manifest = PruneManifest()
    remove_libstdcxx(check=check, root=root, manifest=manifest)
    assert not os.path.lexists(lib / "libstdc++.so.6")
    assert (root / DEB_DIR / "libstdc++.so.6.0.20").is_file()
    assert manifest.entries[0].kind == "symlink" and manifest.entries[0].size == 0


def test_env_walk_never_leaves_the_env(root, host_dir, spy_reads):
    env = root / ENV.lstrip("/")
    (env / "hostlink").symlink_to(host_dir)
    (env / "rootlink").symlink_to("/")
    (env / "dotdot").symlink_to("../../../../../../../../../..")
    check = check_libstdcxx(root=root, env_prefix=ENV)
    assert check.status == "safe"
    env_real = str(env)
    assert all(
        p.startswith(env_real + os.sep) or p.startswith(str(root / DEB_DIR))
        for p in spy_reads
    )
    assert not any(p.startswith(str(host_dir)) for p in spy_reads)
    assert Path(host_dir / "libstdc++.so.6.0.30").is_file()
