"""Tests of the host MPI discovery (mpi.discover_host_mpi, hostscripts/discover-mpi).

Host trees laid out like LUMI after its January 2026 update, in a test root
bound at /opt/cray: the rules in order, in Python, real Lmod and POSIX sh.
"""

import os
import subprocess

from hosttools import LMOD_INIT, need_lmod, need_tool
import pytest

from cotainr_lumi.stages.lumi_env.modulefile import render
from cotainr_lumi.stages.lumi_env.mpi import (
    HostBinding,
    discover_host_mpi,
    discovery_program,
    mpi_module_ops,
)

GNU = "ofi/gnu/12.3"


def abi(version, gnu=GNU):
    return f"/opt/cray/pe/mpich/{version}/{gnu}/lib-abi-mpich/libmpi.so.12"


def lumi_tree(root, versions=("8.1.32", "9.0.1"), *, default=None, relative=False):
    """`root`/cray like LUMI: Cray MPICH versions, pe/lib64 linking to `default`."""
    cray = root / "cray"
    for version in versions:
        for sub in ("lib", "lib-abi-mpich"):
            (cray / f"pe/mpich/{version}/{GNU}/{sub}").mkdir(parents=True)
        (cray / f"pe/mpich/{version}/{GNU}/lib/libmpi_gnu_123.so.12").touch()
        (cray / abi(version).removeprefix("/opt/cray/")).touch()
    (cray / "pe/mpich/8.1.29/ofi/gnu/12.3/lib").mkdir(parents=True)  # no ABI dir
    for v in ("1.15.2.0", "1.22.0"):
        (cray / f"libfabric/{v}/lib64").mkdir(parents=True)
    (cray / "pe/lib64").mkdir(parents=True, exist_ok=True)
    if default:
        target = f"{GNU}/lib/libmpi_gnu_123.so.12"
        target = (
            f"../mpich/{default}/{target}"
            if relative
            else f"{cray}/pe/mpich/{default}/{target}"
        )
        (cray / "pe/lib64/libmpi_gnu_123.so.12").symlink_to(target)
    return cray


def setting(cray, libmpi="discover"):
    return {
        "libmpi": libmpi,
        "ld-library-path": ["/opt/cray/pe/lib64", "/opt/cray/libfabric/*/lib64"],
        "binds": [f"{cray}:/opt/cray", "/var/spool/slurmd"],
    }


def found(cray, **env):
    return discover_host_mpi(
        setting=setting(cray), env={"PATH": os.environ["PATH"], **env}
    )


@pytest.mark.parametrize("relative", [False, True])
def test_the_default_pe_link_decides_absolute_or_relative(tmp_path, relative):
    cray = lumi_tree(tmp_path, default="8.1.32", relative=relative)
    got = found(cray)
    assert got.libmpi == abi("8.1.32") and got.version == "8.1.32"
    assert got.source == "default PE (/opt/cray/pe/lib64)" and got.problem is None
    assert got.ld_library_path == (
        abi("8.1.32").rsplit("/", 1)[0],
        "/opt/cray/pe/lib64",
        "/opt/cray/libfabric/1.22.0/lib64",  # the newest installed
    )


def test_a_link_written_for_opt_cray_is_followed_into_the_test_root(tmp_path):
    cray = lumi_tree(tmp_path)
    link = cray / "pe/lib64/libmpi_gnu_123.so.12"
    link.symlink_to(f"/opt/cray/pe/mpich/9.0.1/{GNU}/lib/libmpi_gnu_123.so.12")
    got = found(cray)
    assert got.libmpi == abi("9.0.1") and got.version == "9.0.1"


def test_a_loaded_cray_mpich_wins_with_its_library_path_first(tmp_path):
    cray = lumi_tree(tmp_path, default="8.1.32")
    loaded = f"{cray}/pe/mpich/9.0.1/{GNU}"
    got = found(
        cray,
        CRAY_MPICH_DIR=loaded,
        CRAY_LD_LIBRARY_PATH=f"{loaded}/lib:/somewhere/else",
    )
    assert got.libmpi == abi("9.0.1") and got.source.startswith("cray-mpich module")
    assert got.ld_library_path[:3] == (
        abi("9.0.1").rsplit("/", 1)[0],
        f"/opt/cray/pe/mpich/9.0.1/{GNU}/lib",
        "/opt/cray/pe/lib64",
    )


def test_the_default_directory_then_the_newest_installed(tmp_path):
    cray = lumi_tree(tmp_path, ("8.1.32", "9.0.1", "10.0.0"))
    (cray / "pe/mpich/11.0.0/ofi").mkdir(parents=True)  # newest, but no library
    got = found(cray)
    assert got.libmpi == abi("10.0.0") and got.source == "newest installed"
    (cray / "pe/mpich/default").symlink_to("9.0.1")
    got = found(cray)
    assert (
        got.libmpi
        == "/opt/cray/pe/mpich/default/ofi/gnu/12.3/lib-abi-mpich/libmpi.so.12"
    )
    assert got.version == "9.0.1" and "mpich/default" in got.source


def test_nothing_found_is_one_message_naming_the_paths(tmp_path):
    (tmp_path / "cray").mkdir()
    got = found(tmp_path / "cray", CRAY_MPICH_DIR=str(tmp_path / "gone"))
    assert got.libmpi is None and got.ld_library_path == ()
    assert f"$CRAY_MPICH_DIR ({tmp_path}/gone)" in got.problem
    assert f"{tmp_path}/cray/pe/lib64/libmpi_gnu_*.so.12" in got.problem
    assert "export COTAINR_LUMI_MPI=container" in got.problem
    assert "\n" not in got.problem


def test_a_fixed_profile_library_overrides_discovery(tmp_path):
    cray = lumi_tree(tmp_path, default="9.0.1")
    fixed = setting(cray, abi("8.1.32"))
    got = discover_host_mpi(setting=fixed, env={"PATH": os.environ["PATH"]})
    assert got.libmpi == abi("8.1.32") and got.source == "lumi-env.mpi-host.libmpi"
    gone = discover_host_mpi(setting=setting(cray, abi("8.1.29")), env={})
    assert gone.libmpi is None and f"{cray}/pe/mpich/8.1.29" in gone.problem


def ops(cray, *, mode="host"):
    binding = HostBinding.from_setting(setting(cray))
    return mpi_module_ops(mode=mode, binding=binding, image="/images/x.sif")


def lmod(module_dir, script, env=None):
    need_lmod()
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'source {LMOD_INIT} && module use "$1" && {script} && env -0',
            "bash",
            str(module_dir),
        ],
        env={"PATH": os.environ["PATH"], "HOME": str(module_dir), **(env or {})},
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    env = dict(e.decode().partition("=")[::2] for e in proc.stdout.split(b"\0") if e)
    return env, proc.stderr.decode()


def test_the_module_file_discovers_on_load_and_unload_reverses(tmp_path):
    cray = lumi_tree(tmp_path, default="8.1.32")
    (tmp_path / "x.lua").write_text(render(ops(cray), language="lua"))
    env, _ = lmod(tmp_path, "module load x")
    assert env["COTAINR_LUMI_MPI_HOST_LIBMPI"] == abi("8.1.32")
    assert env["COTAINR_LUMI_MPI_HOST_PATH"].endswith(
        "/opt/cray/libfabric/1.22.0/lib64"
    )
    loaded = {"CRAY_MPICH_DIR": f"{cray}/pe/mpich/9.0.1/{GNU}"}
    env, _ = lmod(tmp_path, "module load x", loaded)
    assert env["COTAINR_LUMI_MPI_HOST_LIBMPI"] == abi("9.0.1")
    env, _ = lmod(tmp_path, "module load x && module unload x")
    assert "COTAINR_LUMI_MPI_HOST_LIBMPI" not in env
    assert "COTAINR_LUMI_MPI_HOST_PATH" not in env


def test_the_module_file_says_once_when_nothing_is_found(tmp_path):
    (tmp_path / "cray").mkdir()
    (tmp_path / "x.lua").write_text(render(ops(tmp_path / "cray"), language="lua"))
    env, err = lmod(tmp_path, "module load x")
    assert "COTAINR_LUMI_MPI_HOST_LIBMPI" not in env
    assert err.count("no Cray MPICH for the container") == 1, err
    (tmp_path / "x.lua").write_text(
        render(ops(tmp_path / "cray", mode="container"), language="lua")
    )
    assert "no Cray MPICH" not in lmod(tmp_path, "module load x")[1]


def test_the_shell_snippet_agrees_and_is_shellcheck_clean(tmp_path):
    cray = lumi_tree(tmp_path, default="9.0.1", relative=True)
    snippet = render(ops(cray), language="sh")
    shellcheck = need_tool("shellcheck", install="apt-get install -y shellcheck")
    for text in (snippet, discovery_program()):
        proc = subprocess.run(
            [shellcheck, "-s", "sh", "-"], input=text, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout
    for shell in ("sh", "bash"):
        script = '. "$1" && printf "%s|%s" "$COTAINR_LUMI_MPI_HOST_LIBMPI" "$COTAINR_LUMI_MPI_HOST_PATH"'
        (tmp_path / "x.sh").write_text(snippet)
        out = subprocess.run(
            [shell, "-c", script, shell, str(tmp_path / "x.sh")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.startswith(abi("9.0.1") + "|" + abi("9.0.1").rsplit("/", 1)[0] + ":")
    (tmp_path / "empty").mkdir()
    empty = render(ops(tmp_path / "empty"), language="sh")
    proc = subprocess.run(
        ["sh", "-c", empty], capture_output=True, text=True, check=True
    )
    assert proc.stderr.count("no Cray MPICH for the container") == 1
