"""Tests of cotainr_lumi.engine.elfinfo on real ELF files compiled here."""

import os

import elfbuild
import pytest

from cotainr_lumi.engine import elfinfo
from cotainr_lumi.engine.elfinfo import read_elf_info, scan_elf_files


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return elfbuild.Kit(tmp_path_factory.mktemp("kit"))


def test_reads_soname_needed_and_runpath(kit):
    info = read_elf_info(path=kit.torch_hip_user)
    assert info.soname == "libtorch_hip.so"
    assert info.needed[:2] == ("libamdhip64.so.6", "librccl.so.1")
    assert info.runpath == ("$ORIGIN",)
    assert info.elfclass == 64


def test_reads_version_definitions_without_the_base_entry(kit):
    info = read_elf_info(path=kit.sys_lib)
    assert info.soname == "libstdc++.so.6"
    assert info.version_defs == frozenset(kit.sys_versions)
    assert "libstdc++.so.6" not in info.version_defs


def test_reads_version_needs_per_library(kit):
    info = read_elf_info(path=kit.new_user)
    assert info.version_needs["libstdc++.so.6"] == {
        "GLIBCXX_3.4.30",
        "GLIBCXX_3.4.9",
        "CXXABI_1.3.13",
    }
    assert info.needs_from(prefix="libstdc++.so.") == {
        "GLIBCXX_3.4.30",
        "GLIBCXX_3.4.9",
        "CXXABI_1.3.13",
    }
    assert "GLIBC_2.2.5" in info.version_needs["libc.so.6"]
    assert info.compatible_with(read_elf_info(path=kit.sys_lib))


def test_non_elf_truncated_and_symlinked_files_are_not_read(tmp_path, kit):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    truncated = tmp_path / "trunc.so"
    truncated.write_bytes(kit.sys_lib.read_bytes()[:100])
    link = tmp_path / "link.so"
    link.symlink_to(kit.sys_lib)
    assert read_elf_info(path=text) is None
    assert read_elf_info(path=truncated) is None
    # O_NOFOLLOW: a symlink is never read through.
    assert read_elf_info(path=link) is None
    assert read_elf_info(path=kit.sys_lib) is not None


def test_non_elf_files_cost_one_small_read(tmp_path, mocker):
    data = tmp_path / "big.dat"
    data.write_bytes(b"x" * 1_000_000)
    fds = []
    real_open = elfinfo._open_fd

    def spy(path):
        fds.append(real_open(path))
        return fds[-1]

    mocker.patch.object(elfinfo, "_open_fd", side_effect=spy)
    reads = mocker.spy(elfinfo.os, "pread")
    fdopen = mocker.spy(elfinfo.os, "fdopen")
    assert read_elf_info(path=data) is None
    assert len(fds) == 1 and reads.call_args_list == [mocker.call(fds[0], 4, 0)]
    fdopen.assert_not_called()  # no buffered stream for a non-ELF file
    with pytest.raises(OSError):
        os.fstat(fds[0])  # closed


def test_cached_structs_read_like_plain_pyelftools(kit):
    from elftools.elf.elffile import ELFFile

    for path in (
        kit.sys_lib,
        kit.new_user,
        kit.torch_hip_user,
        os.path.realpath("/bin/sh"),
    ):
        with open(path, "rb") as f:
            plain = ELFFile(f)
            dyn = plain.get_section_by_name(".dynamic")
            needed = tuple(t.needed for t in dyn.iter_tags("DT_NEEDED"))
            verneed = plain.get_section_by_name(".gnu.version_r")
            needs = {}
            if verneed is not None:
                for vn, auxs in verneed.iter_versions():
                    needs[vn.name] = frozenset(a.name for a in auxs)
        info = read_elf_info(path=path)
        assert info.needed == needed and info.version_needs == needs


def test_scan_walks_without_following_links(tmp_path, kit):
    root = tmp_path / "root"
    env = root / "opt/env"
    (env / "lib").mkdir(parents=True)
    (env / "lib/libold.so").write_bytes(kit.old_user.read_bytes())
    (env / "lib/readme.txt").write_text("not elf")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "libhost.so").write_bytes(kit.new_user.read_bytes())
    (env / "escape").symlink_to(outside)  # a host path: must not be walked
    (env / "abs").symlink_to("/")
    found = {
        os.path.basename(i.path) for i in scan_elf_files(root=root, path="/opt/env")
    }
    assert found == {"libold.so"}
