"""``cotainr-lumi check-host`` on a test root laid out like LUMI after January 2026."""

import json

from hostroot import MPICH, SIF_DIR, lumi_2026, write_profile
import pytest

from cotainr_lumi import cli
from cotainr_lumi.verify.hostcheck import check_host
from cotainr_lumi.verify.status import FAIL, NA, PASS


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
    libmpi = f"{MPICH.format('8.1.32')}/lib-abi-mpich/libmpi.so.12"
    assert f"mpi {libmpi}" in rows and "bind /usr/lib64/libcxi.so.1" in rows
    assert "mpi /opt/cray/libfabric/1.22.0/lib64" in rows
    # A link shows where it points now (resolved inside the root).
    image = rows["base-image lumi-rocm-rocm-6.2.4.sif"][1]
    assert f"-> {SIF_DIR}/lumi-rocm-rocm-6.2.4-dockerhash-20260115.sif" in image
    assert "amdgpu driver 6.3.60300" in rows["rocm-driver 6.1-7.0"][1]
    assert "host ROCm 6.3.4-128" in rows["rocm-host 6.1-7.0"][1]


def test_facts_of_cpe_24_03_are_stale_with_the_fix(tmp_path, profile):
    root = lumi_2026(tmp_path / "root")
    rows = _rows(check_host(root=root, system="lumi-2024"))
    old = f"mpi {MPICH.format('8.1.29')}/lib-abi-mpich/libmpi.so.12"
    status, words = rows[old]
    assert status == FAIL
    # The nearest installed version with the rest of the path, same line first.
    new = f"{MPICH.format('8.1.32')}/lib-abi-mpich/libmpi.so.12"
    assert f"it may be {new}" in words and "lumi-env.mpi-host.libmpi" in words
    status, words = rows["mpi /opt/cray/libfabric/1.15.2.0/lib64"]
    assert status == FAIL and "it may be /opt/cray/libfabric/1.22.0/lib64" in words
    assert (
        "it may be /opt/cray/pe/pmi/6.1.15/lib"
        in rows["mpi /opt/cray/pe/pmi/6.1.14/lib"][1]
    )
    assert (
        "it may be /opt/cray/pals/1.2.12/lib" in rows["mpi /opt/cray/pals/1.3.2/lib"][1]
    )
    status, words = rows["base-image lumi-rocm-rocm-6.0.3.sif"]
    assert status == FAIL and "does not exist" in words and "base-image" in words
    assert rows["bind /opt/cray"][0] == PASS


def test_a_moved_link_and_a_newer_driver_fail(tmp_path, profile):
    root = lumi_2026(
        tmp_path / "root",
        driver="7.1.70100",
        image_target="lumi-rocm-rocm-6.3.4-dockerhash-20260115.sif",
    )
    report = check_host(root=root, system="lumi-2026")
    rows = _rows(report)
    status, words = rows["base-image lumi-rocm-rocm-6.2.4.sif"]
    assert status == FAIL and "now points at ROCm 6.3, not 6.2" in words
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
    (root / SIF_DIR.lstrip("/") / "escape.sif").symlink_to("../../../../../outside.sif")
    status, words = _rows(check_host(root=root, system="lumi-escape"))[
        "base-image escape.sif"
    ]
    assert status == FAIL and "links to outside" in words
    # An absolute link is read inside the root: the host's file is not found.
    (root / SIF_DIR.lstrip("/") / "escape.sif").unlink()
    (root / SIF_DIR.lstrip("/") / "escape.sif").symlink_to(tmp_path / "outside.sif")
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
    abi = "/lib-abi-mpich/libmpi.so.12"
    assert status == PASS and f"finds {MPICH.format('8.1.32')}{abi}" in words
    assert "/opt/cray/pe/pmi/6.1.15/lib" in words
    # The default PE moved to 25.09: the same profile follows it.
    nine = root / MPICH.format("9.0.1").lstrip("/")
    link = root / "opt/cray/pe/lib64/libmpi_gnu_123.so.12"
    link.unlink()
    link.symlink_to(nine / "lib/libmpi_gnu_123.so.12")
    status, words = _rows(check_host(root=root, system="lumi-2026"))["mpi-host"]
    assert status == PASS and f"finds {MPICH.format('9.0.1')}{abi}" in words
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
    assert code == 1 and "mpi /opt/cray/pals/1.3.2/lib" in json.loads(out)["failed"]


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
    assert err.count("\n") == 1 and err.startswith("cotainr: error:") and words in err


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
