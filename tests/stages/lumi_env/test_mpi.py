"""Tests of the lumi-env stage's MPI part: scan, mode, host binding, env file.

Real ELF files compiled here (tests/elfbuild.py) stand in for an image's
MPICH, libfabric, mpi4py and packages built against MPI; the env file is
sourced by real ``sh`` (dash on Debian: POSIX only). The whole path through
``cotainr build`` and real Apptainer is tests/e2e/test_mpi_image.py.
"""

import json
import os
from pathlib import Path
import subprocess
from types import SimpleNamespace

import elfbuild
from planfakes import stage_context
import pytest
from targetenv_fakes import is_probe, probe_stdout

from cotainr_lumi.errors import CotainrLumiError, InputError, StageError
from cotainr_lumi.imagelayout import MPI_ENV_FILE, MPI_FILE
from cotainr_lumi.stages.lumi_env.mpi import (
    HostBinding,
    MpiPlan,
    plan_mpi,
    resolve_mode,
)
from cotainr_lumi.stages.lumi_env.mpiscan import (
    ImageFiles,
    MpiLibrary,
    MpiScan,
    scan_mpi,
)
from cotainr_lumi.stages.lumi_env.ops import render
from cotainr_lumi.stages.lumi_env.stage import LumiEnvStage

ENV = "/opt/env"
SITE = f"{ENV}/lib/python3.11/site-packages"
CRAY_LIB = "/opt/cray/pe/mpich/8.1.29/ofi/gnu/12.3/lib-abi-mpich/libmpi.so.12"


def at(root, path):
    """The host path of an image path in the fake root."""
    return Path(root) / path.lstrip("/")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """Link targets outside any root: an MPICH-ABI and an Open MPI library."""
    d = tmp_path_factory.mktemp("linkto")
    return SimpleNamespace(
        mpich=elfbuild.plain_lib(d / "libmpi.so.12", soname="libmpi.so.12"),
        ompi=elfbuild.plain_lib(d / "libmpi.so.40", soname="libmpi.so.40"),
        fabric=elfbuild.plain_lib(d / "libfabric.so.1", soname="libfabric.so.1"),
        cxi=elfbuild.plain_lib(d / "libcxi.so.1", soname="libcxi.so.1"),
    )


def wheel_env(root, libs, *, pinned=False, runpathed=False):
    """An env like `pip install mpich mpi4py` makes (plus packages built on it)."""
    lib = at(root, f"{ENV}/lib")
    elfbuild.plain_lib(lib / "mpich/libfabric.so.1", soname="libfabric.so.1")
    elfbuild.plain_lib(
        lib / "libmpi.so.12",
        soname="libmpi.so.12",
        needed=[libs.fabric],
        runpath="$ORIGIN:$ORIGIN/mpich",
    )
    m4 = at(root, f"{SITE}/mpi4py")
    m4.mkdir(parents=True)
    (m4 / "__init__.py").write_text('__version__ = "4.1.2"\n')
    (m4 / "_mpiabi.py").write_text("")
    elfbuild.plain_lib(m4 / "MPI.mpich.so", soname="MPI.so", needed=[libs.mpich])
    elfbuild.plain_lib(m4 / "MPI.openmpi.so", soname="MPI.so", needed=[libs.ompi])
    if pinned:
        elfbuild.plain_lib(
            at(root, f"{SITE}/pinned/_ext.so"),
            soname="_ext.so",
            needed=[libs.mpich],
            rpath="$ORIGIN/../../..",
        )
        record = at(root, f"{SITE}/pinned-1.0.dist-info/RECORD")
        record.parent.mkdir(parents=True)
        record.write_text("pinned/_ext.so,sha256=x,1\npinned-1.0.dist-info/RECORD,,\n")
    if runpathed:
        elfbuild.plain_lib(
            at(root, f"{SITE}/runpathed/_ext.so"),
            soname="_ext.so",
            needed=[libs.mpich],
            runpath="$ORIGIN/../../..",
        )
    return root


def system_mpich(root, libs, *, cxi):
    """An MPICH built into the base image (/usr/lib), as the AI Factory images."""
    etc = at(root, "/etc")
    (etc / "ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (etc / "ld.so.conf.d/x86_64-linux-gnu.conf").write_text(
        "# multiarch\n/usr/local/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"
    )
    multi = at(root, "/usr/lib/x86_64-linux-gnu")
    elfbuild.plain_lib(
        multi / "libfabric.so.1",
        soname="libfabric.so.1",
        needed=[libs.cxi] if cxi else [],
    )
    elfbuild.plain_lib(
        at(root, "/usr/lib/libmpi.so.12"), soname="libmpi.so.12", needed=[libs.fabric]
    )
    return root


# -- the scan ------------------------------------------------------------------


def test_library_dirs_follow_ld_so_conf_includes(tmp_path, libs):
    root = system_mpich(tmp_path, libs, cxi=True)
    dirs = ImageFiles(root).library_dirs
    assert dirs[:2] == ["/usr/local/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
    assert "/usr/lib64" in dirs and dirs.count("/usr/lib/x86_64-linux-gnu") == 1


def test_scan_finds_the_wheel_mpich_mpi4py_and_its_users(tmp_path, libs):
    root = wheel_env(tmp_path, libs, runpathed=True)
    scan = scan_mpi(root=root, prefixes=[ENV], site_dirs=[SITE])
    (lib,) = scan.libraries
    assert (lib.path, lib.where, lib.soname) == (
        f"{ENV}/lib/libmpi.so.12",
        "env",
        "libmpi.so.12",
    )
    assert lib.libfabric == f"{ENV}/lib/mpich/libfabric.so.1" and not lib.cxi
    assert scan.mpi4py == {
        "version": "4.1.2",
        "dir": f"{SITE}/mpi4py",
        "abi_aware": True,
    }
    users = {Path(u.path).name: u for u in scan.users}
    assert (
        users["MPI.mpich.so"].preloaded
        and users["MPI.mpich.so"].needs == "libmpi.so.12"
    )
    assert users["MPI.openmpi.so"].needs == "libmpi.so.40"
    assert users["_ext.so"].runpath == ("$ORIGIN/../../..",)
    # RUNPATH is searched after LD_LIBRARY_PATH: not a pin.
    assert scan.pins == [] and scan.has_mpich and scan.open_mpi == []


def test_scan_finds_a_dt_rpath_pin_and_its_distribution(tmp_path, libs):
    root = wheel_env(tmp_path, libs, pinned=True)
    scan = scan_mpi(root=root, prefixes=[ENV], site_dirs=[SITE])
    (pin,) = scan.pins
    assert pin.user == f"{SITE}/pinned/_ext.so"
    assert (pin.entry, pin.library, pin.via) == (
        "$ORIGIN/../../..",
        f"{ENV}/lib/libmpi.so.12",
        "its DT_RPATH",
    )
    user = next(u for u in scan.users if u.path == pin.user)
    assert user.distribution == "pinned 1.0"
    assert scan.to_dict()["pins"][0]["user"] == pin.user


def test_the_interpreters_dt_rpath_pins_users_without_runpath(tmp_path, libs):
    root = wheel_env(tmp_path, libs)
    # conda's python: DT_RPATH $ORIGIN/../lib, searched for every object
    # without DT_RUNPATH (a plain pip-built extension).
    elfbuild.plain_lib(
        at(root, f"{ENV}/bin/python3.11"), soname="python", rpath="$ORIGIN/../lib"
    )
    os.symlink("python3.11", at(root, f"{ENV}/bin/python"))
    elfbuild.plain_lib(
        at(root, f"{SITE}/plain/_ext.so"), soname="_ext.so", needed=[libs.mpich]
    )
    scan = scan_mpi(
        root=root, prefixes=[ENV], site_dirs=[SITE], python=f"{ENV}/bin/python"
    )
    (pin,) = scan.pins
    assert pin.user == f"{SITE}/plain/_ext.so"
    assert pin.via == f"the DT_RPATH of {ENV}/bin/python3.11"
    # mpi4py 4 loads the library itself (MPI4PY_LIBMPI): its extension is exempt.
    assert all("mpi4py" not in p.user for p in scan.pins)


def test_scan_sees_a_system_mpich_speaking_cxi(tmp_path, libs):
    root = system_mpich(tmp_path, libs, cxi=True)
    scan = scan_mpi(root=root, prefixes=[], site_dirs=[])
    (lib,) = scan.libraries
    assert (lib.path, lib.where, lib.cxi) == ("/usr/lib/libmpi.so.12", "system", True)
    assert lib.libfabric == "/usr/lib/x86_64-linux-gnu/libfabric.so.1"
    plain = scan_mpi(root=system_mpich(tmp_path / "b", libs, cxi=False), prefixes=[])
    assert not plain.libraries[0].cxi


# -- the mode ------------------------------------------------------------------


BINDING = HostBinding.from_setting(
    {
        "libmpi": CRAY_LIB,
        "ld-library-path": ["/opt/cray/pe/lib64", "/opt/cray/libfabric/1.15.2.0/lib64"],
        "binds": ["/opt/cray", "/usr/lib64/libjansson.so.4"],
    }
)


def test_auto_mode(tmp_path, libs):
    none = scan_mpi(root=tmp_path / "empty", prefixes=[])
    assert resolve_mode(requested="auto", scan=none, binding=BINDING)[0] == "none"
    wheel = scan_mpi(
        root=wheel_env(tmp_path / "w", libs), prefixes=[ENV], site_dirs=[SITE]
    )
    assert resolve_mode(requested="auto", scan=wheel, binding=BINDING)[0] == "host"
    assert resolve_mode(requested="auto", scan=wheel, binding=None)[0] == "container"
    aif = scan_mpi(root=system_mpich(tmp_path / "a", libs, cxi=True), prefixes=[])
    mode, reason = resolve_mode(requested="auto", scan=aif, binding=BINDING)
    assert mode == "container" and "speaks CXI" in reason
    assert resolve_mode(requested="host", scan=aif, binding=BINDING)[0] == "host"
    assert resolve_mode(requested="none", scan=wheel, binding=BINDING)[0] == "none"


def test_asking_for_mpi_without_any_is_one_clear_message(tmp_path):
    scan = scan_mpi(root=tmp_path, prefixes=[])
    for requested in ("host", "container"):
        with pytest.raises(ValueError) as e:
            resolve_mode(requested=requested, scan=scan, binding=BINDING)
        text = str(e.value)
        assert f"lumi-env.mpi is {requested!r}, but the image has no MPI" in text
        assert "packages: [mpich, mpi4py]" in text and "\n" not in text


def test_host_without_a_binding_and_container_without_a_library(tmp_path, libs):
    root = tmp_path / "r"
    m4 = at(root, f"{SITE}/mpi4py")
    m4.mkdir(parents=True)
    (m4 / "__init__.py").write_text('__version__ = "4.1.2"\n')
    elfbuild.plain_lib(m4 / "MPI.mpich.so", soname="MPI.so", needed=[libs.mpich])
    scan = scan_mpi(root=root, prefixes=[ENV], site_dirs=[SITE])
    # mpi4py's wheel alone: the host's library is all it will have.
    assert resolve_mode(requested="auto", scan=scan, binding=BINDING)[0] == "host"
    with pytest.raises(ValueError, match="has no libmpi.so.12 for its MPI users"):
        resolve_mode(requested="container", scan=scan, binding=BINDING)
    with pytest.raises(ValueError, match="no host binding"):
        resolve_mode(requested="host", scan=scan, binding=None)


# -- the host binding ----------------------------------------------------------


def test_binding_order_and_host_paths(tmp_path):
    b = HostBinding.from_setting(
        {
            "libmpi": "/opt/cray/pe/x/libmpi.so.12",
            "ld-library-path": ["/opt/cray/pe/lib64", "/opt/cray/pe/x"],
            "binds": [f"{tmp_path}/cray:/opt/cray", f"{tmp_path}/pe:/opt/cray/pe:ro"],
        }
    )
    assert b.ld_library_path == ("/opt/cray/pe/x", "/opt/cray/pe/lib64")
    # The longest destination wins, as nested binds do.
    assert b.host_path("/opt/cray/pe/lib64") == f"{tmp_path}/pe/lib64"
    assert b.host_path("/opt/cray/libfabric") == f"{tmp_path}/cray/libfabric"
    assert b.host_path("/usr/lib64") is None
    # Sources missing here (not LUMI): nothing can be told.
    assert b.host_problems() == []
    (tmp_path / "pe/lib64").mkdir(parents=True)
    problem, directory = b.host_problems()
    assert directory.startswith(f"/opt/cray/pe/x is {tmp_path}/pe/x on this host")
    assert problem == (
        f"/opt/cray/pe/x/libmpi.so.12 is {tmp_path}/pe/x/libmpi.so.12 on this host "
        f"(bind {tmp_path}/pe:/opt/cray/pe:ro), which does not exist"
    )


@pytest.mark.parametrize(
    "setting,where,words",
    [
        ({"mpi": "cray"}, "lumi-env.mpi", "must be one of auto, container, host, none"),
        ({"mpi-host": {"lib": "/x"}}, "lumi-env.mpi-host.lib", "unknown setting"),
        (
            {
                "mpi-host": {
                    "libmpi": "/opt/cray/libmpi_cray.so.12",
                    "binds": ["/opt/cray"],
                }
            },
            "lumi-env.mpi-host.libmpi",
            "MPICH-ABI library named libmpi.so.12",
        ),
        (
            {"mpi-host": {"libmpi": CRAY_LIB, "binds": ["/usr/lib64/libjansson.so.4"]}},
            "lumi-env.mpi-host.libmpi",
            "is not below any of the binds",
        ),
        (
            {"mpi-host": {"libmpi": CRAY_LIB, "binds": ["/opt/cray", "/a b"]}},
            "lumi-env.mpi-host.binds[2]",
            "white space",
        ),
        (
            {
                "mpi-host": {
                    "libmpi": CRAY_LIB,
                    "ld-library-path": ["rel"],
                    "binds": ["/opt/cray"],
                }
            },
            "lumi-env.mpi-host.ld-library-path[1]",
            "absolute",
        ),
    ],
)
def test_bad_mpi_settings_are_one_error_naming_the_key(setting, where, words):
    with pytest.raises(CotainrLumiError) as e:
        LumiEnvStage(settings=setting)
    text = str(e.value)
    assert where in text and words in text and "Traceback" not in text


# -- the env file (real sh) ------------------------------------------------------


@pytest.fixture
def host_lib(tmp_path):
    """A binding whose library exists on this machine (as if bound)."""
    lib = tmp_path / "cray/lib-abi-mpich/libmpi.so.12"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    return HostBinding.from_setting(
        {
            "libmpi": str(lib),
            "ld-library-path": ["/opt/cray/pe/lib64", "/base/b"],
            "binds": [f"{tmp_path}/cray"],
        }
    )


def mpi_plan(*, mode, binding, image_library=None):
    """The plan of a build in `mode` whose image has `image_library`."""
    libs = [MpiLibrary(image_library, image_library, "libmpi.so.12", "env")]
    scan = MpiScan(libraries=libs if image_library else [])
    return MpiPlan(mode, mode, "asked", binding, scan)


def source(text, tmp_path, env=None):
    """Source an env file with POSIX sh; return (its environment, stderr)."""
    script = tmp_path / "99-mpi.sh"
    script.write_text(text)
    proc = subprocess.run(
        ["sh", "-c", '. "$1" && env', "sh", str(script)],
        env={
            "PATH": "/usr/bin:/bin",
            "LD_LIBRARY_PATH": "/base/a:/base/b",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    return dict(line.partition("=")[::2] for line in lines if "=" in line), proc.stderr


def test_env_file_swaps_in_the_host_library(tmp_path, host_lib):
    text = mpi_plan(
        mode="host", binding=host_lib, image_library="/opt/env/lib/libmpi.so.12"
    ).env_file()
    env, err = source(text, tmp_path)
    libdir = str(Path(host_lib.libmpi).parent)
    assert env["LD_LIBRARY_PATH"] == f"{libdir}:/opt/cray/pe/lib64:/base/b:/base/a"
    assert env["MPI4PY_LIBMPI"] == host_lib.libmpi
    assert (
        env["COTAINR_LUMI_MPI"] == "host" and env["COTAINR_LUMI_MPI_ACTIVE"] == "host"
    )
    assert err == "" and not any(k.startswith("_cl_") for k in env)
    # A value the user sets in the container, or exports on the host, wins.
    env, _ = source(text, tmp_path, {"MPI4PY_LIBMPI": "/mine/libmpi.so.12"})
    assert env["MPI4PY_LIBMPI"] == "/mine/libmpi.so.12"
    for run_env in (
        {"COTAINR_LUMI_MPI": "container"},
        {"__exported_env__": "A=1\nCOTAINR_LUMI_MPI=container\nB=2"},
    ):
        env, err = source(text, tmp_path, run_env)
        assert (
            env["LD_LIBRARY_PATH"] == "/base/a:/base/b" and "MPI4PY_LIBMPI" not in env
        )
        assert env["COTAINR_LUMI_MPI_ACTIVE"] == "container" and err == ""


def test_env_file_without_the_bound_library_says_so_once(tmp_path, host_lib):
    Path(host_lib.libmpi).unlink()
    text = mpi_plan(
        mode="host", binding=host_lib, image_library="/opt/env/lib/libmpi.so.12"
    ).env_file()
    env, err = source(text, tmp_path)
    assert env["LD_LIBRARY_PATH"] == "/base/a:/base/b" and "MPI4PY_LIBMPI" not in env
    assert env["COTAINR_LUMI_MPI_ACTIVE"] == "container"
    assert (
        err.count("\n") == 1
        and f"Cray MPICH ({host_lib.libmpi}) is not in the container" in err
    )
    env, err = source(text, tmp_path, {"COTAINR_LUMI_MPI": "$(touch x) bogus"})
    assert "COTAINR_LUMI_MPI=$(touch x) bogus is not host, container or none" in err
    assert not (tmp_path / "x").exists()


def test_container_default_can_be_switched_to_host_at_run_time(tmp_path, host_lib):
    text = mpi_plan(
        mode="container", binding=host_lib, image_library="/usr/lib/libmpi.so.12"
    ).env_file()
    env, _ = source(text, tmp_path)
    assert env["COTAINR_LUMI_MPI_ACTIVE"] == "container" and "MPI4PY_LIBMPI" not in env
    env, _ = source(text, tmp_path, {"__exported_env__": "COTAINR_LUMI_MPI=host"})
    assert env["COTAINR_LUMI_MPI_ACTIVE"] == "host"
    assert env["LD_LIBRARY_PATH"].startswith(str(Path(host_lib.libmpi).parent) + ":")


# -- the stage -----------------------------------------------------------------


class MpiSandbox:
    """A sandbox directory answering the probe, the env check and mpi4py's check."""

    def __init__(self, root, *, loaded, rocm_version=""):
        self.root = root
        self.loaded = loaded
        self.rocm_version = rocm_version
        self.calls = []

    def run(self, args, *, env=None, timeout=None):
        self.calls.append(list(args))
        if is_probe(args):
            out = probe_stdout(ENV, var="VIRTUAL_ENV", rocm_version=self.rocm_version)
        elif "COTAINR_LUMI_MPI_CHECK" in args[-1]:
            # The start check runs mpi4py's check after its own "ok".
            out = "ok\nCOTAINR_LUMI_MPI_CHECK " + json.dumps(self.loaded) + "\n"
        else:
            out = "ok\n"
        return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")


def run_stage(tmp_path, root, settings, loaded=None, rocm_version=""):
    loaded = loaded or {
        "library_version": "MPICH Version: 5.0.2",
        "libmpi": [f"{ENV}/lib/libmpi.so.12"],
    }
    sandbox = MpiSandbox(root, loaded=loaded, rocm_version=rocm_version)
    stage = LumiEnvStage(settings={"module-dir": str(tmp_path / "mod"), **settings})
    context = stage_context(sandbox, image_path=tmp_path / "out" / "mpi.sif")
    return stage.run(context=context), sandbox


HOST_SETTING = {
    "libmpi": CRAY_LIB,
    "ld-library-path": ["/opt/cray/pe/lib64"],
    "binds": ["/opt/cray"],
    # LUST's condition (tests/artefacts/lust-pytorch-user-md.yaml).
    "binds-if-absent": ["/usr/lib64/libjansson.so.4"],
}


def test_stage_records_and_binds_the_host_mpich(tmp_path, libs):
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    report, sandbox = run_stage(
        tmp_path, root, {"binds": ["/opt/cray", "/pfs"], "mpi-host": HOST_SETTING}
    )
    assert report.labels["cotainr-lumi.mpi"] == "host"
    assert report.labels["cotainr-lumi.mpi.record"] == MPI_FILE
    assert (
        report.labels["cotainr-lumi.binds"]
        == "/opt/cray,/pfs,/usr/lib64/libjansson.so.4"
    )
    record = json.loads(at(root, MPI_FILE).read_text())
    assert (
        record["mode"] == "host"
        and record["image-library"] == f"{ENV}/lib/libmpi.so.12"
    )
    assert record["host"]["ld-library-path"][0] == str(Path(CRAY_LIB).parent)
    assert record["loaded-at-build"]["library_version"] == "MPICH Version: 5.0.2"
    assert record["host"]["binds-if-absent"] == {"/usr/lib64/libjansson.so.4": None}
    assert record["host"]["gpu-aware-caveat"] is None
    # One start of the container after the probe: the env file and mpi4py.
    assert len(sandbox.calls) == 2 and sandbox.calls[1][:2] == ["bash", "-c"]
    env_file = at(root, MPI_ENV_FILE).read_text()
    assert "*) _cl_lib=" + CRAY_LIB in env_file
    lua = report.host_files.files[tmp_path / "mod/mpi.lua"]
    assert 'append_path("SINGULARITY_BIND", "/usr/lib64/libjansson.so.4", ",")' in lua
    # The profile's library, checked on load by the discovery program.
    assert "capture(" in lua and CRAY_LIB in lua and "LmodMessage" in lua
    shell = report.host_files.files[tmp_path / "mod/mpi.sh"]
    assert "$(eval " in shell and CRAY_LIB in shell
    # The comment names the library whole (a wrapped path cannot be found).
    assert any(CRAY_LIB in line for line in shell.splitlines() if line[:1] == "#")
    assert (
        "MPI (host): launch ranks with srun (LUMI's default --mpi=cray_shasta"
        in report.host_files.run_hint
    )
    assert "MPI: host" in report.summary


def test_a_discover_build_without_cray_mpich_here_is_no_error(tmp_path, libs):
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    (tmp_path / "cray").mkdir()  # the build host has no Cray MPICH
    setting = {"libmpi": "discover", "binds": [f"{tmp_path}/cray:/opt/cray"]}
    setting["ld-library-path"] = ["/opt/cray/pe/lib64", "/opt/cray/libfabric/*/lib64"]
    report, _ = run_stage(tmp_path, root, {"mpi-host": setting})
    host = json.loads(at(root, MPI_FILE).read_text())["host"]
    assert host["setting"] == "discover" and host["libmpi"] is None
    assert host["ld-library-path"] == ["/opt/cray/pe/lib64"]  # '*' waits for load
    assert "no Cray MPICH for the container" in host["build-host-problem"]
    assert "on LUMI the Cray MPICH found on load replaces it" in report.summary
    # The env file's defaults are empty: the module file's exports decide.
    env_file = at(root, MPI_ENV_FILE).read_text()
    assert (
        "*) _cl_lib='' ;;" in env_file
        and "*) _cl_new=/opt/cray/pe/lib64 ;;" in env_file
    )


def test_stage_without_mpi_changes_nothing(tmp_path):
    root = tmp_path / "root"
    (root / ".singularity.d/env").mkdir(parents=True)
    report, _ = run_stage(
        tmp_path, root, {"binds": ["/opt/cray"], "mpi-host": HOST_SETTING}
    )
    assert report.labels["cotainr-lumi.mpi"] == "none"
    assert report.labels["cotainr-lumi.binds"] == "/opt/cray"
    assert not at(root, MPI_ENV_FILE).exists()
    assert "cray_shasta" not in report.host_files.files[tmp_path / "mod/mpi.lua"]


def test_stage_stops_on_a_pin_with_the_fix(tmp_path, libs):
    root = wheel_env(tmp_path / "root", libs, pinned=True)
    (root / ".singularity.d/env").mkdir(parents=True)
    with pytest.raises(StageError) as e:
        run_stage(tmp_path, root, {"mpi-host": HOST_SETTING})
    text = str(e.value)
    assert (
        f"{SITE}/pinned/_ext.so (pinned 1.0) pins the image's {ENV}/lib/libmpi.so.12"
        in text
    )
    assert "MPI users run on the host's MPICH here (lumi-env.mpi: auto -> host)" in text
    assert "DT_RPATH entry '$ORIGIN/../../..'" in text
    assert "-Wl,--enable-new-dtags" in text and "lumi-env.mpi=container" in text


def test_a_pin_is_a_warning_when_the_image_keeps_its_mpich(tmp_path, libs, caplog):
    root = wheel_env(tmp_path / "root", libs, pinned=True)
    (root / ".singularity.d/env").mkdir(parents=True)
    report, _ = run_stage(
        tmp_path, root, {"mpi-host": HOST_SETTING, "mpi": "container"}
    )
    assert report.labels["cotainr-lumi.mpi"] == "container"
    assert "COTAINR_LUMI_MPI=host would not reach it" in caplog.text
    # srun's --mpi default for the image's MPICH, as the AI Factory's module.
    lua = report.host_files.files[tmp_path / "mod/mpi.lua"]
    assert 'pushenv("SLURM_MPI_TYPE", "pmi2")' in lua
    shell = report.host_files.files[tmp_path / "mod/mpi.sh"]
    assert "|| SLURM_MPI_TYPE=pmi2; export SLURM_MPI_TYPE" in shell


def test_host_mode_leaves_srun_at_lumis_default(tmp_path, libs):
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    report, _ = run_stage(tmp_path, root, {"mpi-host": HOST_SETTING})
    assert report.labels["cotainr-lumi.mpi"] == "host"
    for name in ("mpi.lua", "mpi.sh"):
        assert "SLURM_MPI_TYPE" not in report.host_files.files[tmp_path / "mod" / name]


def test_stage_stops_when_the_host_library_is_missing_here(tmp_path, libs):
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    cray = tmp_path / "cray"
    (cray / "pe/lib64").mkdir(parents=True)
    setting = dict(HOST_SETTING, binds=[f"{cray}:/opt/cray"])
    with pytest.raises(StageError) as e:
        run_stage(tmp_path, root, {"mpi-host": setting})  # auto: host
    text = str(e.value)
    assert (
        f"{CRAY_LIB} is {cray}/pe/mpich/8.1.29/ofi/gnu/12.3/lib-abi-mpich/libmpi.so.12"
        in text
    )
    assert "which does not exist" in text and "ls /opt/cray/pe/mpich" in text


def test_asking_for_host_with_the_library_missing_here_stops_the_plan(tmp_path):
    cray = tmp_path / "cray"
    (cray / "pe/lib64").mkdir(parents=True)
    setting = dict(HOST_SETTING, binds=[f"{cray}:/opt/cray"])
    with pytest.raises(InputError, match="which does not exist: the Cray MPICH"):
        LumiEnvStage(settings={"mpi-host": setting, "mpi": "host"})
    # The same binding is fine while the build does not ask for it.
    assert LumiEnvStage(settings={"mpi-host": setting}).settings.mpi == "auto"


def test_missing_other_directories_are_a_warning(tmp_path, caplog):
    cray = tmp_path / "cray"
    lib = cray / "pe/mpich/8.1.29/ofi/gnu/12.3/lib-abi-mpich/libmpi.so.12"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    setting = dict(HOST_SETTING, binds=[f"{cray}:/opt/cray"])
    LumiEnvStage(settings={"mpi-host": setting, "mpi": "host"})
    assert f"/opt/cray/pe/lib64 is {cray}/pe/lib64 on this host" in caplog.text


def test_stage_stops_when_mpi4py_cannot_load_the_images_mpich(tmp_path, libs):
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    with pytest.raises(StageError, match="mpi4py 4.1.2 cannot load the image's MPI"):
        run_stage(
            tmp_path,
            root,
            {"mpi-host": HOST_SETTING},
            loaded={"error": "RuntimeError: cannot load MPI library"},
        )


def test_plan_mpi_none_needs_no_image(tmp_path):
    plan = plan_mpi(
        root=tmp_path, target=None, requested="none", host_setting={}, stage="x"
    )
    assert plan.mode == "none" and plan.env_file() is None and plan.binds() == []


@pytest.mark.parametrize("libfabric", ["host", "image"])
def test_an_image_with_its_own_libfabric_gets_no_host_libfabric_in_its_binding(
    tmp_path, libfabric
):
    fabric = "/opt/cray/libfabric/*/lib64"
    setting = {**HOST_SETTING, "ld-library-path": ["/opt/cray/pe/lib64", fabric]}
    plan = plan_mpi(
        root=tmp_path,
        target=None,
        requested="none",
        host_setting=setting,
        stage="x",
        libfabric=libfabric,
    )
    path = plan.binding.ld_library_path
    assert "/opt/cray/pe/lib64" in path
    assert (fabric in path) == (libfabric == "host")
    assert setting["ld-library-path"][1] == fabric  # the setting is left alone


def test_the_images_own_mpich_without_a_host_binding_still_sets_srun_pmi2():
    # The AI Factory profiles carry no host binding; srun still needs PMI-2.
    ops = mpi_plan(mode="container", binding=None).module_ops(image="/x.sif")
    assert (
        render(ops, language="lua").splitlines()[-1]
        == 'pushenv("SLURM_MPI_TYPE", "pmi2")'
    )
    shell = render(ops, language="sh").splitlines()[-1]
    assert (
        shell
        == '[ -n "${SLURM_MPI_TYPE-}" ] || SLURM_MPI_TYPE=pmi2; export SLURM_MPI_TYPE'
    )
    assert mpi_plan(mode="host", binding=None).module_ops(image="/x.sif") == []


def test_libjansson_is_bound_only_into_an_image_without_its_own(tmp_path, libs):
    """LUST's PyTorch page: newer images carry their own, the host's can break them."""
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    own = elfbuild.plain_lib(
        at(root, "/usr/lib/x86_64-linux-gnu/libjansson.so.4"), soname="libjansson.so.4"
    )
    report, _ = run_stage(tmp_path, root, {"binds": ["/pfs"], "mpi-host": HOST_SETTING})
    assert report.labels["cotainr-lumi.binds"] == "/pfs,/opt/cray"
    record = json.loads(at(root, MPI_FILE).read_text())
    found = record["host"]["binds-if-absent"]["/usr/lib64/libjansson.so.4"]
    assert found == "/usr/lib/x86_64-linux-gnu/libjansson.so.4" and own.is_file()
    lua = report.host_files.files[tmp_path / "mod/mpi.lua"]
    assert '"/usr/lib64/libjansson.so.4"' not in lua


def test_a_rocm_7_image_gets_the_caveat_and_no_gpu_aware_setting(
    tmp_path, libs, caplog
):
    """Update-202601: no Cray MPICH up to PE 25.09 does GPU-aware MPI with ROCm 7."""
    root = wheel_env(tmp_path / "root", libs)
    (root / ".singularity.d/env").mkdir(parents=True)
    report, _ = run_stage(
        tmp_path, root, {"mpi-host": HOST_SETTING}, rocm_version="7.0.2-56"
    )
    record = json.loads(at(root, MPI_FILE).read_text())
    caveat = record["host"]["gpu-aware-caveat"]
    assert caveat.startswith("ROCm 7.0.2-56: no Cray MPICH up to PE 25.09")
    assert caveat in caplog.text
    texts = [at(root, MPI_ENV_FILE).read_text(), *report.host_files.files.values()]
    for text in texts:
        for word in ("MPICH_GPU_SUPPORT_ENABLED", "gtl", "LD_PRELOAD"):
            assert word not in text.replace(caveat, "")
