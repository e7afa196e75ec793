"""Tests of the host MPI discovery (HostBinding.find_here, hostscripts/discover-mpi).

The host is tests/hostroot.py's tree built from LUMI's published facts (all
four PEs installed, 25.03 the default; its /opt/cray bound at /opt/cray):
the rules in order, in Python, real Lmod and POSIX sh.
"""

import os
import subprocess

from hostroot import (
    DEFAULT_LINK,
    abi_library,
    default_mpich,
    facts,
    libfabric_dir,
    lumi_2026,
    mpich_dir,
    mpich_versions,
)
from hosttools import LMOD_INIT, need_lmod, need_tool
import pytest

from cotainr_lumi.pipeline.profiles import get_system, load_systems
from cotainr_lumi.stages.lumi_env.mpi import (
    HostBinding,
    MpiPlan,
    discovery_program,
)
from cotainr_lumi.stages.lumi_env.mpiscan import MpiScan
from cotainr_lumi.stages.lumi_env.ops import render

NEWEST = mpich_versions()["25.09"]  # 9.0.1: installed, not the default


def lumi_tree(root):
    """LUMI's /opt/cray (tests/hostroot.py) under `root`; its host path."""
    return lumi_2026(root / "host") / "opt/cray"


def setting(cray, libmpi="discover"):
    return {
        "libmpi": libmpi,
        "ld-library-path": ["/opt/cray/pe/lib64", "/opt/cray/libfabric/*/lib64"],
        "binds": [f"{cray}:/opt/cray", "/var/spool/slurmd"],
    }


def found(cray, **env):
    binding = HostBinding.from_setting(setting(cray))
    return binding.find_here(env={"PATH": os.environ["PATH"], **env})


def dir_of(path):
    return path.rsplit("/", 1)[0]


@pytest.mark.parametrize("relative", [False, True])
def test_the_default_pe_wins_over_the_newest_installed(tmp_path, relative):
    cray = lumi_tree(tmp_path)
    if relative:  # a variation: LUMI's link is absolute (lumi-course-102-cpe-2026)
        link = cray / "pe/lib64/libmpi_gnu_123.so.12"
        link.unlink()
        link.symlink_to(f"../mpich/{default_mpich()}/ofi/gnu/12.3/lib/{link.name}")
    got = found(cray)
    assert got.libmpi == abi_library(default_mpich()) != abi_library(NEWEST)
    assert got.version == default_mpich() and got.problem is None
    assert got.source == "default PE (/opt/cray/pe/lib64)"
    assert got.ld_library_path == (
        dir_of(abi_library(default_mpich())),
        "/opt/cray/pe/lib64",
        libfabric_dir(),  # the newest installed
    )


def test_a_loaded_cray_mpich_wins_with_its_library_path_first(tmp_path):
    cray = lumi_tree(tmp_path)
    # LUMI/25.09 loaded: its cray-mpich's directories (lumi-course-102-cpe-2026).
    loaded = mpich_dir(NEWEST)
    got = found(
        cray,
        CRAY_MPICH_DIR=loaded,
        CRAY_LD_LIBRARY_PATH=f"{loaded}/lib:/somewhere/else",
    )
    ldd = facts("lumi-course-102-cpe-2026")["ldd"]["cray-ld-library-path-first"]
    assert got.libmpi == abi_library(NEWEST) and got.source.startswith("cray-mpich ")
    assert got.ld_library_path[:3] == (
        dir_of(abi_library(NEWEST)),
        dir_of(ldd),
        "/opt/cray/pe/lib64",
    )


def test_a_loaded_cray_mpich_abi_is_hpes_route(tmp_path):
    """HPE's CUG 2026 tutorial: `module load cray-mpich-abi`, its CRAY_LD_LIBRARY_PATH."""
    cray = lumi_tree(tmp_path)
    assert facts("hpe-cug26-cray-mpich-abi")["module"] == "cray-mpich-abi"
    abi_dir = dir_of(abi_library(NEWEST))
    got = found(cray, CRAY_LD_LIBRARY_PATH=abi_dir)
    assert got.libmpi == abi_library(NEWEST) and got.version == NEWEST
    assert got.source == "cray-mpich-abi module (CRAY_LD_LIBRARY_PATH)"
    assert got.ld_library_path[:2] == (abi_dir, "/opt/cray/pe/lib64")
    # It wins over another cray-mpich's CRAY_MPICH_DIR (it is the ABI library).
    got = found(
        cray, CRAY_LD_LIBRARY_PATH=abi_dir, CRAY_MPICH_DIR=mpich_dir(default_mpich())
    )
    assert got.libmpi == abi_library(NEWEST)


def test_without_the_default_link_the_newest_installed_says_it_may_not_be_default(
    tmp_path,
):
    cray = lumi_tree(tmp_path)
    (cray / DEFAULT_LINK.removeprefix("/opt/cray/")).unlink()
    got = found(cray)
    assert got.libmpi == abi_library(NEWEST) and got.version == NEWEST
    assert got.source.startswith("newest installed") and "default PE" in got.source
    # A variation no LUMI source shows: /opt/cray/pe/mpich/default.
    (cray / "pe/mpich/default").symlink_to(default_mpich())
    got = found(cray)
    assert got.libmpi == abi_library("default")
    assert got.version == default_mpich() and "mpich/default" in got.source


def test_nothing_found_is_one_message_naming_the_paths(tmp_path):
    (tmp_path / "cray").mkdir()
    got = found(tmp_path / "cray", CRAY_MPICH_DIR=str(tmp_path / "gone"))
    assert got.libmpi is None and got.ld_library_path == ()
    assert f"$CRAY_MPICH_DIR ({tmp_path}/gone)" in got.problem
    assert f"{tmp_path}/cray/pe/lib64/libmpi_gnu_*.so.12" in got.problem
    assert "export COTAINR_LUMI_MPI=container" in got.problem
    assert "\n" not in got.problem
    # A hostile $CRAY_MPICH_DIR in the message is not a line of its own.
    lines = raw(tmp_path / "cray", {"CRAY_MPICH_DIR": INJECTED})
    assert len(lines) == 1 and lines[0].startswith("problem ")


def test_a_fixed_profile_library_overrides_discovery(tmp_path):
    cray = lumi_tree(tmp_path)
    fixed = setting(cray, abi_library(NEWEST))
    got = HostBinding.from_setting(fixed).find_here(env={"PATH": os.environ["PATH"]})
    assert (
        got.libmpi == abi_library(NEWEST) and got.source == "lumi-env.mpi-host.libmpi"
    )
    # 8.1.25 (amd-server-files-tree, March 2025) is not installed any more.
    gone = HostBinding.from_setting(setting(cray, abi_library("8.1.25")))
    gone = gone.find_here(env={})
    assert gone.libmpi is None and f"{cray}/pe/mpich/8.1.25" in gone.problem


def raw(cray, env):
    """discover-mpi's lines, as the module file's parser reads them."""
    proc = subprocess.run(
        HostBinding.from_setting(setting(cray)).command(),
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.split("\n")[:-1]


#: Hostile values (issue 38): newlines, ':', spaces and quotes.
INJECTED = "/opt/cray/pe/mpich/x\nlibmpi /evil/libmpi.so.12\npath /evil"


@pytest.mark.parametrize(
    "env",
    [
        {"CRAY_MPICH_DIR": INJECTED},
        {"CRAY_LD_LIBRARY_PATH": INJECTED},
        {"CRAY_MPICH_DIR": mpich_dir(NEWEST), "CRAY_LD_LIBRARY_PATH": INJECTED},
        {"CRAY_LD_LIBRARY_PATH": f"{INJECTED}/lib-abi-mpich"},
        {"CRAY_LD_LIBRARY_PATH": '/opt/cray/a b:/opt/cray/it\'s "q"::/elsewhere'},
    ],
)
def test_hostile_environment_values_print_nothing_to_misparse(tmp_path, env):
    cray = lumi_tree(tmp_path)
    lines = raw(cray, env)
    keys = [line.split(" ", 1)[0] for line in lines]
    assert keys == ["libmpi", "path", "source", "version"], lines
    assert "/evil" not in "".join(lines)
    got = found(cray, **env)
    assert got.libmpi in (abi_library(default_mpich()), abi_library(NEWEST))
    if "a b" in env.get("CRAY_LD_LIBRARY_PATH", ""):
        assert got.ld_library_path[0] == dir_of(abi_library(default_mpich()))
    # Lmod reads the same: the library found, never the injected one.
    (tmp_path / "x.lua").write_text(render(ops(cray), language="lua"))
    lua_env, _ = lmod(tmp_path, "module load x", env)
    assert lua_env["COTAINR_LUMI_MPI_HOST_LIBMPI"] == got.libmpi
    assert lua_env["COTAINR_LUMI_MPI_HOST_PATH"] == ":".join(got.ld_library_path)


def test_spaces_and_quotes_of_a_loaded_module_reach_the_path_verbatim(tmp_path):
    cray = lumi_tree(tmp_path)
    odd = '/opt/cray/a b/it\'s "q"'
    got = found(cray, CRAY_MPICH_DIR=mpich_dir(NEWEST), CRAY_LD_LIBRARY_PATH=odd)
    assert got.ld_library_path[:2] == (dir_of(abi_library(NEWEST)), odd)


def test_a_host_directory_with_a_newline_or_colon_is_no_version(tmp_path):
    cray = lumi_tree(tmp_path)
    for name in ("9.9.9\nlibmpi x", "9.9:9"):
        (cray / "libfabric" / name / "lib64").mkdir(parents=True)
    got = found(cray)
    assert got.ld_library_path[-1] == libfabric_dir()


def ops(cray, *, mode="host"):
    binding = HostBinding.from_setting(setting(cray))
    plan = MpiPlan(mode, mode, "asked", binding, MpiScan())
    return plan.module_ops(image="/images/x.sif")


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
    cray = lumi_tree(tmp_path)
    (tmp_path / "x.lua").write_text(render(ops(cray), language="lua"))
    env, _ = lmod(tmp_path, "module load x")
    assert env["COTAINR_LUMI_MPI_HOST_LIBMPI"] == abi_library(default_mpich())
    assert env["COTAINR_LUMI_MPI_HOST_PATH"].endswith(libfabric_dir())
    for loaded in (
        {"CRAY_MPICH_DIR": mpich_dir(NEWEST)},
        {"CRAY_LD_LIBRARY_PATH": dir_of(abi_library(NEWEST))},  # cray-mpich-abi
    ):
        env, _ = lmod(tmp_path, "module load x", loaded)
        assert env["COTAINR_LUMI_MPI_HOST_LIBMPI"] == abi_library(NEWEST)
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
    cray = lumi_tree(tmp_path)
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
        lib = abi_library(default_mpich())
        assert out.startswith(f"{lib}|{dir_of(lib)}:")
    (tmp_path / "empty").mkdir()
    empty = render(ops(tmp_path / "empty"), language="sh")
    proc = subprocess.run(
        ["sh", "-c", empty], capture_output=True, text=True, check=True
    )
    assert proc.stderr.count("no Cray MPICH for the container") == 1


def _in_container(cray, entry):
    """Whether `entry` resolves with only the host's /opt/cray bound."""
    path = cray
    for part in entry.removeprefix("/opt/cray/").split("/"):
        path = path / part
        target = os.readlink(path) if path.is_symlink() else None
        if target and target.startswith("/") and not target.startswith("/opt/cray/"):
            return False  # a link out of the bind: dangling in the container
    return path.is_dir()


def test_lumi_g_ext_rocm_6_2_finds_directories_a_container_can_reach(tmp_path):
    """XPMEM's default/ links through /etc/alternatives (lust-ccpe-25.09)."""
    cray = lumi_tree(tmp_path)
    system = get_system(name="lumi-g-ext-rocm-6.2", systems=load_systems())
    host = system.stage_settings("lumi-env")["mpi-host"]
    binding = HostBinding.from_setting({**host, "binds": [f"{cray}:/opt/cray"]})
    got = binding.find_here(env={"PATH": os.environ["PATH"]})
    xpmem = facts("lust-ccpe-25.09")["xpmem-dir"] + "/lib64"
    assert xpmem in got.ld_library_path
    assert not _in_container(cray, "/opt/cray/xpmem/default/lib64")
    for entry in got.ld_library_path:
        assert _in_container(cray, entry), entry
