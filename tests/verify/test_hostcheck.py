"""``cotainr-lumi check-host`` on a host tree built from LUMI's published facts.

The tree (tests/hostroot.py) is LUMI after January 2026 as its artefacts
show it: all four PEs installed, 25.03 the default.
"""

import json
import os
from pathlib import Path
import re
import shutil
import stat
import threading

from errorlines import one_error
from hostroot import (
    abi_library,
    base_image,
    default_mpich,
    facts,
    libfabric_dir,
    lumi_2026,
    mpich_dir,
    mpich_versions,
    pals_dir,
    pmi_versions,
    write_profile,
)
from hosttools import need_root
import pytest

from cotainr_lumi import cli
from cotainr_lumi.verify.hostcheck import check_host
from cotainr_lumi.verify.status import FAIL, NA, PASS, WARN


@pytest.fixture
def profile(tmp_path, monkeypatch):
    path = write_profile(tmp_path / "site.yaml")
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", path)
    return path


def _rows(report):
    return {r.check: (r.status, r.evidence) for r in report.results}


def test_todays_facts_all_pass(tmp_path, profile):
    root = lumi_2026(tmp_path / "root")
    report = check_host(root=root, system="lumi-2026")
    rows = _rows(report)
    assert not report.failed, report.as_text()
    assert {s for s, _ in rows.values()} == {PASS}
    assert f"mpi {abi_library(default_mpich())}" in rows
    assert "bind /usr/lib64/libcxi.so.1" in rows
    assert f"mpi {libfabric_dir()}" in rows and f"mpi {pals_dir()}" in rows
    # A link shows where it points now (resolved inside the root).
    assert "-> /usr/lib64/libcxi.so.1.5.0" in rows["bind /usr/lib64/libcxi.so.1"][1]
    update = facts("lumi-update-202601")
    assert f"amdgpu driver {update['amdgpu-driver']}" in rows["rocm-driver 6.1-7.0"][1]
    assert f"host ROCm {update['system-rocm']}" in rows["rocm-host 6.1-7.0"][1]


def test_cpe_24_03_is_still_installed_its_libfabric_and_image_are_not(
    tmp_path, profile
):
    """LUST's 24.03 bindings after January 2026: PE 24.03 stays (all four do)."""
    root = lumi_2026(tmp_path / "root")
    rows = _rows(check_host(root=root, system="lumi-2024"))
    for path in (
        abi_library(mpich_versions()["24.03"]),
        f"/opt/cray/pe/pmi/{pmi_versions()['24.03']}/lib",
        pals_dir(),
    ):
        assert rows[f"mpi {path}"][0] == PASS, rows[f"mpi {path}"]
    # The host libfabric moved on: the nearest installed version is named.
    status, words = rows["mpi /opt/cray/libfabric/1.15.2.0/lib64"]
    assert status == FAIL and f"it may be {libfabric_dir()}" in words
    assert "lumi-env.mpi-host.ld-library-path" in words
    # LUST's cotainr 2025.7.1 has no ROCm 6.0.3 base image any more.
    status, words = rows["base-image lumi-rocm-rocm-6.0.3.sif"]
    assert status == FAIL and "does not exist" in words and "base-image" in words
    assert rows["bind /opt/cray"][0] == PASS


def test_a_stale_mpich_path_names_the_same_line_first(tmp_path, profile):
    root = lumi_2026(tmp_path / "root")
    shutil.rmtree(root / "opt/cray/pe/mpich/8.1.29")
    rows = _rows(check_host(root=root, system="lumi-2024"))
    status, words = rows[f"mpi {abi_library('8.1.29')}"]
    assert status == FAIL and f"it may be {abi_library('8.1.32')}" in words
    assert "lumi-env.mpi-host.libmpi" in words


def test_a_moved_link_and_a_newer_driver_fail(tmp_path, profile):
    # A test variation of an update: the 6.2 path links to a ROCm 6.0 image
    # (a real name of LUST's), and the driver is newer.
    other = Path(facts("lust-pytorch-user-md")["example-image"]).name
    root = lumi_2026(tmp_path / "root", driver="7.1.70100", image_target=other)
    report = check_host(root=root, system="lumi-2026")
    rows = _rows(report)
    status, words = rows["base-image lumi-rocm-rocm-6.2.4.sif"]
    assert status == FAIL and "now points at ROCm 6.0, not 6.2" in words
    status, words = rows["rocm-driver 6.1-7.0"]
    assert status == FAIL and "7.1.70100 is outside" in words
    assert "rocm.supported" in words
    assert sorted(report.failed) == [
        "base-image lumi-rocm-rocm-6.2.4.sif",
        "rocm-driver 6.1-7.0",
    ]


def test_missing_binds_and_a_dir_for_a_file(tmp_path, profile):
    root = lumi_2026(tmp_path / "root")
    (root / "flash").rmdir()
    (root / "usr/lib64/libcxi.so.1").unlink()
    (root / "usr/lib64/libcxi.so.1").mkdir()
    rows = _rows(check_host(root=root, system="lumi-2026"))
    assert rows["bind /flash"][0] == FAIL and "lumi-env binds" in rows["bind /flash"][1]
    assert "is not a file" in rows["bind /usr/lib64/libcxi.so.1"][1]


def test_a_link_out_of_the_root_is_reported_not_followed(tmp_path, profile):
    root = lumi_2026(tmp_path / "root")
    (tmp_path / "outside.sif").write_text("a real file outside the root")
    escape = root / Path(base_image("rocm-6.2")).with_name("escape.sif").relative_to(
        "/"
    )
    escape.symlink_to("../../../../../outside.sif")
    status, words = _rows(check_host(root=root, system="lumi-escape"))[
        "base-image escape.sif"
    ]
    assert status == FAIL and "links to outside" in words
    # An absolute link is read inside the root: the host's file is not found.
    escape.unlink()
    escape.symlink_to(tmp_path / "outside.sif")
    status, words = _rows(check_host(root=root, system="lumi-escape"))[
        "base-image escape.sif"
    ]
    assert status == FAIL and "does not exist" in words


def test_discover_finds_the_default_pe_and_follows_it_and_says_when_none(
    tmp_path, profile, monkeypatch
):
    site = tmp_path / "discover.yaml"
    site.write_text(
        "systems:\n  lumi-2026:\n    settings:\n      lumi-env:\n"
        "        mpi-host: {libmpi: discover, binds: [/opt/cray],\n"
        "                   ld-library-path: ['/opt/cray/pe/pmi/*/lib']}\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", f"{profile}:{site}")
    monkeypatch.delenv("CRAY_MPICH_DIR", raising=False)
    root = lumi_2026(tmp_path / "root")
    status, words = _rows(check_host(root=root, system="lumi-2026"))["mpi-host"]
    # The default PE's (25.03), not the newest installed (25.09's 9.0.1).
    assert status == PASS and f"finds {abi_library(default_mpich())}" in words
    assert "(default PE (/opt/cray/pe/lib64))" in words
    # A '*' is the newest installed: 25.09's PMI, not the default PE's (so
    # lumi-g-ext-rocm-6.2 takes PMI from /opt/cray/pe/lib64, the default PE's).
    assert f"/opt/cray/pe/pmi/{pmi_versions()['25.09']}/lib" in words
    # The default PE moved to 25.09: the same profile follows it.
    nine = root / mpich_dir(mpich_versions()["25.09"]).lstrip("/")
    link = root / "opt/cray/pe/lib64/libmpi_gnu_123.so.12"
    link.unlink()
    link.symlink_to(nine / "lib/libmpi_gnu_123.so.12")
    status, words = _rows(check_host(root=root, system="lumi-2026"))["mpi-host"]
    assert status == PASS and f"finds {abi_library(mpich_versions()['25.09'])}" in words
    # No Cray MPICH at all: the load-time message, with what to do.
    (tmp_path / "empty").mkdir()
    rows = _rows(check_host(root=tmp_path / "empty", system="lumi-2026"))
    assert rows["rocm-driver 6.1-7.0"][0] == NA
    status, words = rows["mpi-host"]
    assert status == FAIL and "COTAINR_LUMI_MPI=container" in words


def test_shipped_systems_are_all_checked(tmp_path):
    report = check_host(root=lumi_2026(tmp_path / "root"))
    checked = " ".join(r.evidence for r in report.results)
    assert "lumi-g-ext-pytorch" in checked and "lumi-aif-torch" in checked


def _run(args, capsys):
    with pytest.raises(SystemExit) as e:
        command = cli.CotainrLumiCLI(args=["check-host", *args])
        command.execute()
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_cli_exit_codes_and_json(tmp_path, profile, capsys):
    root = str(lumi_2026(tmp_path / "root"))
    code, out, _ = _run(["--root", root, "--system", "lumi-2026"], capsys)
    assert code == 0 and out.startswith("STATUS") and "0 FAIL" in out
    code, out, _ = _run(["--root", root, "--system", "lumi-2024", "--json"], capsys)
    failed = json.loads(out)["failed"]
    assert code == 1 and "mpi /opt/cray/libfabric/1.15.2.0/lib64" in failed


@pytest.mark.parametrize(
    "args, words",
    [
        (["--system", "nope"], "System 'nope' does not exist"),
        (["--root", "/nonexistent/dir"], "--root /nonexistent/dir: not a directory"),
    ],
)
def test_bad_input_is_one_error_line(args, words, profile, capsys):
    code, out, err = _run(args, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and one_error(err, words)


def test_a_relative_root_works_and_one_with_a_colon_is_one_error(
    tmp_path, profile, capsys, monkeypatch
):
    lumi_2026(tmp_path / "root")
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(["--root", "root", "--system", "lumi-2026"], capsys)
    assert code == 0 and "0 FAIL" in out
    (tmp_path / "a:b").mkdir()
    code, out, err = _run(["--root", "a:b"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"--root {tmp_path}/a:b: host paths are looked up through binds" in err


def test_a_rocm_7_system_with_a_host_binding_warns_gpu_aware_mpi(
    tmp_path, profile, monkeypatch
):
    """LUMI's Update-202601: no Cray MPICH up to PE 25.09 is GPU-aware with ROCm 7."""
    assert facts("lumi-update-202601")["gpu-aware-mpi-with-rocm7"].startswith("none")
    site = tmp_path / "rocm7.yaml"
    site.write_text(
        "systems:\n  my-rocm7:\n    extends: lumi-2026\n"
        '    rocm-version: "7.0"\n    settings:\n      rocm: {supported: "6.1-7.0"}\n'
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", f"{profile}:{site}")
    root = lumi_2026(tmp_path / "root")
    report = check_host(root=root, system="my-rocm7")
    status, words = _rows(report)["mpi-gpu-aware"]
    assert status == WARN and "ROCm 7.0" in words and "PE 25.09" in words
    assert "MPICH_GPU_SUPPORT_ENABLED" in words and not report.failed
    # ROCm 6.2 (lumi-2026): no such row.
    assert "mpi-gpu-aware" not in _rows(check_host(root=root, system="lumi-2026"))


def test_lumi_g_ext_rocm_6_2_checks_its_conditional_libjansson_bind(tmp_path):
    root = lumi_2026(tmp_path / "root")
    rows = _rows(check_host(root=root, system="lumi-g-ext-rocm-6.2"))
    status, words = rows["bind /usr/lib64/libjansson.so.4"]
    jansson = Path(facts("lust-ccpe-25.09")["host-libjansson"]).name
    assert status == PASS and f"-> /usr/lib64/{jansson}" in words


def test_readme_example_is_what_check_host_prints(tmp_path, monkeypatch):
    """README's check-host example: produced on this host tree, and labelled so."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    label = "produced on a host tree built from LUMI's published facts, not on LUMI"
    assert label in " ".join(readme.split())
    block = readme.split("$ cotainr-lumi check-host --root /tmp/lumi-host/root")[1]
    lines = block.split("```")[0].splitlines()[2:]
    site = tmp_path / "site.yaml"
    write_profile(site)
    site.write_text(site.read_text().replace("  lumi-2024:", "  my-lumi:"))
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(site))
    root = lumi_2026(tmp_path / "lumi-host/root")
    report = check_host(root=root, system="my-lumi")
    got = {r.check: (r.status, r.evidence) for r in report.results}
    for line in lines[:-1]:
        status, check, evidence = re.split(r"\s{2,}", line, maxsplit=2)
        shown = re.escape(evidence).replace(r"\.\.\.", ".*")
        assert got[check][0] == status, line
        assert re.fullmatch(shown, got[check][1]), (line, got[check][1])
    summary = lines[-1].replace("/tmp/lumi-host/root", str(root))
    assert report.summary() == summary


# -- Issue 37: LUST's systems.json against the built-in defaults ---------------


def test_lusts_systems_json_is_compared_with_the_built_in_defaults(
    tmp_path, lust_cotainr_module
):
    root = lumi_2026(tmp_path / "root")
    rows = _rows(check_host(root=root))
    assert rows["site lumi-g"][0] == NA  # no module loaded
    assert "builds use the built-in /appl/local/" in rows["site lumi-g"][1]
    current = lust_cotainr_module("lust-cotainr-2025.7.1")
    rows = _rows(check_host(root=root))
    for name in ("lumi-g", "rocm-6.2", "rocm-6.4"):  # LUST's current module
        status, words = rows[f"site {name} of {current}"]
        assert status == PASS and "the same as the built-in default" in words
    older = lust_cotainr_module("lust-cotainr-2025.03.0")
    rows = _rows(check_host(root=root))
    status, words = rows[f"site lumi-g of {older}"]
    assert status == WARN and "lumi-rocm-rocm-6.0.3.sif; builds use it, not " in words
    assert "[lumi-g-ext]" in words
    status, words = rows["site rocm-6.4"]
    assert status == WARN and f"{older} has no rocm-6.4" in words


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_version_files_that_are_no_files_neither_hang_nor_fill_memory(
    tmp_path, profile, kind
):
    """A FIFO hung check-host; a character device ate 23 GB (issue 38, 6)."""
    root = lumi_2026(tmp_path / "root")
    for name in ("sys/module/amdgpu/version", "opt/rocm-6.3.4/.info/version"):
        path = root / name
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        else:
            need_root("makes a character device (/dev/zero's numbers)")
            os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    done = []
    thread = threading.Thread(
        target=lambda: done.append(check_host(root=root, system="lumi-2026")),
        daemon=True,
    )
    thread.start()
    thread.join(timeout=60)
    assert done, "check-host hung"
    rows = _rows(done[0])
    assert "host ROCm unreadable here" in rows["rocm-host 6.1-7.0"][1]
    assert rows["rocm-driver 6.1-7.0"][0] == NA


def test_the_hosts_runtime_reports_the_compressors_it_mounts(profile, monkeypatch):
    """On / only (a test tree has no runtime): each compressor, a tiny image run."""
    problems = {"zstd": "FATAL: failed to mount squashfs filesystem: invalid argument"}
    monkeypatch.setattr(
        "cotainr_lumi.verify.hostcheck.mount_problem",
        lambda compression: problems.get(compression.name),
    )
    rows = _rows(check_host(root="/", system="lumi-2026"))
    assert rows["squashfs gzip"] == (PASS, "the runtime mounts gzip images")
    assert rows["squashfs zstd"] == (
        NA,
        f"the runtime cannot run a zstd image: {problems['zstd']}; builds asking "
        "for zstd write gzip images here",
    )
    problems["gzip"] = "FATAL: no loop devices"
    assert _rows(check_host(root="/", system="lumi-2026"))["squashfs gzip"][0] == FAIL
