"""End-to-end: mpi4py on the image's MPICH, then on a host MPICH bound in.

One image is built with the stock ``cotainr`` command on the LUMI-like base:
a pip step installs the ``mpich`` wheel (MPICH 5, an MPICH-ABI
``libmpi.so.12``) and mpi4py. In it, ``mpiexec -n 2 python -m mpi4py.bench
helloworld`` runs two ranks on the image's MPICH. Then Debian's MPICH 4.0.2
(``libmpich12``), copied into a test root laid out like LUMI after its
January 2026 update (``<host>/cray/pe/mpich/{8.1.32,9.0.1}/ofi/gnu/12.3/
{lib,lib-abi-mpich}``, ``pe/lib64/libmpi_gnu_123.so.12`` linking to the
default PE's 8.1.32, an old 8.1.29 without ``lib-abi-mpich``, the libraries
it needs in the newest of two ``libfabric/<version>/lib64`` and one as a file
bind, like LUMI's ``/usr/lib64/libjansson.so.4``), stands in for LUMI's Cray
MPICH. The image is built with ``libmpi: discover``: the shell snippet and
the Lmod module written next to the image find the host's Cray MPICH when
loaded and bind it in, and ``MPI.Get_library_version()`` and
``/proc/self/maps`` prove the swap; the same image follows a changed default
PE and a loaded cray-mpich without a rebuild, an empty host root is one
message, ``COTAINR_LUMI_MPI=container`` at run time swaps back. Bad input (a
base without MPI, a host library missing here, a package pinning the
image's MPICH with ``DT_RPATH``) is one message each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import re
import shlex
import shutil
import subprocess

from errorlines import error_lines
from hosttools import need_libmpich12, need_lmod
import pytest
import yaml

pytestmark = pytest.mark.e2e

SYSTEM = "mpi-e2e"
GNU = "ofi/gnu/12.3"
ABI_DIR = f"/opt/cray/pe/mpich/8.1.32/{GNU}/lib-abi-mpich"
LIBMPI = f"{ABI_DIR}/libmpi.so.12"
LIBMPI_9 = LIBMPI.replace("8.1.32", "9.0.1")
#: The host binding's LD_LIBRARY_PATH after the library's own directory.
DEPS = ["/opt/cray/pe/lib64", "/opt/cray/libfabric/1.22.0/lib64", "/usr/lib64"]
#: The versions the pip step installs (mpi4py 4 picks its MPI at run time).
PACKAGES = ["mpich==5.0.2", "mpi4py==4.1.2"]
#: Prints what mpi4py loaded, without MPI_Init.
VERSION = (
    "import os, mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
    "print(MPI.Get_library_version().splitlines()[0]); "
    "print('ACTIVE', os.environ.get('COTAINR_LUMI_MPI_ACTIVE')); "
    "print('LD', os.environ.get('LD_LIBRARY_PATH')); "
    "print('M4', os.environ.get('MPI4PY_LIBMPI')); "
    "print('MAPS', ','.join(sorted({l.split()[-1] for l in open('/proc/self/maps') "
    "if '/libmpi' in l})))"
)

#: A package built against the image's MPICH with a DT_RPATH to it.
PINNED_SETUP = """\
import sys
from setuptools import Extension, setup

lib = sys.prefix + "/lib"
setup(
    name="mpipinned",
    version="1.0",
    ext_modules=[
        Extension(
            "mpipinned",
            ["mpipinned.c"],
            extra_link_args=[
                "-Wl,--no-as-needed", "-L" + lib, "-l:libmpi.so.12",
                "-Wl,-rpath," + lib + ",--disable-new-dtags",
            ],
        )
    ],
)
"""
PINNED_C = """\
#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "mpipinned", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_mpipinned(void) { return PyModule_Create(&m); }
"""


def _ldd(path):
    """(name, path) of every library `path` needs beyond glibc (host ldd)."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    skip = ("libc.so", "libm.so", "ld-linux", "libpthread", "libdl.so", "librt.so")
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m and not m.group(1).startswith(skip):
            yield m.group(1), Path(m.group(2)).resolve()


def default_pe(host, version):
    """Point the host's /opt/cray/pe/lib64 link at `version` (the default PE)."""
    link = host / "cray/pe/lib64/libmpi_gnu_123.so.12"
    link.unlink(missing_ok=True)
    link.symlink_to(f"{host}/cray/pe/mpich/{version}/{GNU}/lib/libmpi_gnu_123.so.12")


def fake_cray_mpich(host):
    """Debian's MPICH in a test root laid out like LUMI; returns the binding."""
    lib = need_libmpich12()
    for version in ("8.1.32", "9.0.1"):
        prefix = host / f"cray/pe/mpich/{version}/{GNU}"
        (prefix / "lib").mkdir(parents=True)
        (prefix / "lib-abi-mpich").mkdir()
        shutil.copy(lib, prefix / "lib/libmpi_gnu_123.so.12")
        # As on LUMI: lib-abi-mpich/libmpi.so.12 -> ../lib/libmpi_<compiler>.so.12.
        (prefix / "lib-abi-mpich/libmpi.so.12").symlink_to(
            "../lib/libmpi_gnu_123.so.12"
        )
    # Decoys: the 24.03 Cray MPICH the old profile named (no ABI directory
    # left), an older libfabric.
    (host / f"cray/pe/mpich/8.1.29/{GNU}/lib").mkdir(parents=True)
    (host / "cray/libfabric/1.15.2.0/lib64").mkdir(parents=True)
    (host / "cray/pe/lib64").mkdir(parents=True)
    default_pe(host, "8.1.32")
    deps = host / "cray/libfabric/1.22.0/lib64"
    deps.mkdir(parents=True)
    (host / "lib64").mkdir()
    for name, path in _ldd(lib):
        # libhwloc as a file bind, the way LUMI binds /usr/lib64/libjansson.so.4.
        shutil.copy(path, (host / "lib64" if name == "libhwloc.so.15" else deps) / name)
    return {
        "libmpi": "discover",
        "ld-library-path": [
            "/opt/cray/pe/lib64",
            "/opt/cray/libfabric/*/lib64",
            "/usr/lib64",
        ],
        "binds": [
            f"{host}/cray:/opt/cray",
            f"{host}/lib64/libhwloc.so.15:/usr/lib64/libhwloc.so.15",
        ],
    }


@pytest.fixture(scope="module")
def work(tmp_path_factory, lumi_like_base_image, write_systems):
    """A work dir with the fake host MPICH and a test system using it."""
    work = tmp_path_factory.mktemp("mpi-e2e")
    binding = fake_cray_mpich(work / "host")
    # The fake host's /opt/cray comes with the binding.
    lumi_env = {"binds": [], "host-libfabric-binds": [], "mpi-host": binding}
    write_systems(
        work / "systems.yaml",
        {
            SYSTEM: {
                "base-image": lumi_like_base_image,
                "settings": {"lumi-env": lumi_env},
            }
        },
    )
    (work / "mpi-steps.yml").write_text(
        yaml.safe_dump({"steps": [{"name": "MPI", "packages": PACKAGES}]})
    )
    return work


@pytest.fixture(scope="module")
def build(work, cotainr_build):
    """``build(image, *args, name, ok=False)``: the test system's build."""

    def run(image, *args, name, ok=False):
        return cotainr_build(
            work, image, f"--system={SYSTEM}", "--force", *args, ok=ok, name=name
        )

    return run


@pytest.fixture(scope="module")
def mpi_image(work, build):
    """The image with the mpich wheel and mpi4py (auto: host on this base)."""
    image = work / "mpi.sif"
    proc = build(image, "--pip-steps", "mpi-steps.yml", name="mpi image", ok=True)
    return image, proc.output


def in_image(apptainer_path, image, script, *, env=None, binds=()):
    """Run `script` in bash in the image (`binds` with -B); return the process."""
    cmd = [str(apptainer_path / "apptainer"), "exec", "--no-home"]
    for bind in binds:
        cmd += ["-B", bind]
    return subprocess.run(
        [*cmd, str(image), "bash", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )


def on_host(apptainer_path, script, *, env=None):
    """Run `script` in bash on the host with Apptainer's `singularity` on PATH."""
    return subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PATH": f"{apptainer_path}:{os.environ['PATH']}",
            **(env or {}),
        },
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )


#: Each rank: its rank, the size, an allreduce of rank + 1, the library.
ALLREDUCE = (
    "from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "print(f'rank {c.rank} of {c.size}, sum {c.allreduce(c.rank + 1)} | '"
    " + MPI.Get_library_version().splitlines()[0])"
)


#: One rank's line of :data:`ALLREDUCE`: rank, size, sum, MPICH version.
RANK_REPORT = re.compile(
    r"rank (\d+) of (\d+), sum (\d+) \| MPICH Version:\s*([0-9.]+)"
)


def versions(proc):
    """The output of :data:`VERSION` as a dict (first line: ``library``)."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()[-5:]
    got = {"library": lines[0]}
    got.update(line.split(" ", 1) for line in lines[1:])
    return got


def test_the_build_records_the_images_mpich_and_the_binding(
    mpi_image, work, apptainer_path, e2e_facts
):
    image, output = mpi_image
    assert "MPI: host (auto: the image's MPICH does not speak CXI)" in output
    labels = json.loads(
        subprocess.run(
            [
                str(apptainer_path / "apptainer"),
                "inspect",
                "--json",
                "--labels",
                str(image),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["data"]["attributes"]["labels"]
    assert labels["cotainr-lumi.mpi"] == "host"
    assert labels["cotainr-lumi.mpi.record"] == "/opt/cotainr-lumi/mpi.json"
    proc = in_image(apptainer_path, image, "cat /opt/cotainr-lumi/mpi.json")
    record = json.loads(proc.stdout)
    env = "/opt/cotainr/conda/envs/conda_container_env"
    assert record["image-library"] == f"{env}/lib/libmpi.so.12"
    assert record["libraries"][0]["libfabric"] == f"{env}/lib/mpich/libfabric.so.1"
    assert record["mpi4py"]["version"] == "4.1.2" and record["pins"] == []
    assert record["loaded-at-build"]["library_version"].startswith(
        "MPICH Version: 5.0.2"
    )
    host = record["host"]
    assert host["setting"] == "discover" and host["ld-library-path"] == [ABI_DIR, *DEPS]
    assert host["libmpi"] == LIBMPI and host["version"] == "8.1.32"
    assert host["source"] == "default PE (/opt/cray/pe/lib64)" and host["line"] == "8.1"
    assert f"on LUMI {LIBMPI} replaces it (found here: default PE" in output
    e2e_facts["MPI image (lumi-g-ext family), host binding LD_LIBRARY_PATH"] = ":".join(
        record["host"]["ld-library-path"]
    )
    e2e_facts["MPI image (lumi-g-ext family), host binding binds"] = ",".join(
        record["host"]["binds"]
    )
    snippet = (work / "mpi.sh").read_text()
    assert f"{work}/host/cray:/opt/cray" in snippet and "$(eval " in snippet


def test_mpiexec_runs_two_ranks_on_the_images_mpich(
    mpi_image, apptainer_path, e2e_facts
):
    image, _ = mpi_image
    proc = in_image(
        apptainer_path,
        image,
        "mpiexec -n 2 python -m mpi4py.bench helloworld",
        env={"APPTAINERENV_COTAINR_LUMI_MPI": "container"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hello = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("Hello"))
    assert len(hello) == 2 and hello[0].startswith("Hello, World! I am process 0 of 2")
    assert hello[1].startswith("Hello, World! I am process 1 of 2")
    assert "is not in the container" not in proc.stderr
    plain = in_image(apptainer_path, image, f"python -c {shlex.quote(VERSION)}")
    before = versions(plain)
    e2e_facts["MPI before the swap (image's MPICH)"] = before["library"]
    assert (
        before["library"].startswith("MPICH Version:") and "5.0.2" in before["library"]
    )
    # Without the binds (no module loaded), host mode says so once.
    assert before["ACTIVE"] == "container"
    assert plain.stderr.count("is not in the container") == 1, plain.stderr


def test_the_shell_snippet_binds_the_host_mpich_in(
    mpi_image, work, apptainer_path, e2e_facts
):
    image, _ = mpi_image
    snippet = shlex.quote(str(work / "mpi.sh"))
    run = f'. {snippet} && singularity exec "$SIF" python -c {shlex.quote(VERSION)}'
    after = versions(on_host(apptainer_path, run))
    e2e_facts["MPI after the swap (shell snippet)"] = after["library"]
    e2e_facts["MPI LD_LIBRARY_PATH after the swap"] = after["LD"]
    assert after["library"].startswith("MPICH Version:") and "4.0.2" in after["library"]
    assert after["ACTIVE"] == "host" and after["M4"] == LIBMPI
    assert after["MAPS"] == f"/opt/cray/pe/mpich/8.1.32/{GNU}/lib/libmpi_gnu_123.so.12"
    assert after["LD"].split(":")[:4] == [ABI_DIR, *DEPS]
    # Two ranks really run on the swapped library (MPI_Init, an allreduce),
    # started by the image's own Hydra mpiexec (the PMI wire protocol is
    # MPICH's, whichever library answers).
    ranks = on_host(
        apptainer_path,
        f'. {snippet} && singularity exec "$SIF" mpiexec -n 2 python -c '
        + shlex.quote(ALLREDUCE),
    )
    assert ranks.returncode == 0, ranks.stdout[-2000:] + ranks.stderr[-3000:]
    # mpiexec forwards the ranks' output in chunks, which may meet without a
    # newline between them ("...4.0.2rank 1 of 2..."): match each report.
    got = sorted(RANK_REPORT.findall(ranks.stdout))
    assert [(rank, size, total) for rank, size, total, _ in got] == [
        ("0", "2", "3"),
        ("1", "2", "3"),
    ], ranks.stdout
    assert all(lib == "4.0.2" for *_, lib in got), got
    e2e_facts["MPI after the swap, mpiexec -n 2 allreduce"] = "; ".join(
        f"rank {rank} of {size}, sum {total} | MPICH Version: {lib}"
        for rank, size, total, lib in got
    )
    # Overridable at run time: the image's own MPICH again.
    back = versions(on_host(apptainer_path, run, env={"COTAINR_LUMI_MPI": "container"}))
    assert "5.0.2" in back["library"] and back["ACTIVE"] == "container"


def test_the_module_file_binds_the_host_mpich_in(
    mpi_image, work, apptainer_path, e2e_facts
):
    image, _ = mpi_image
    init = shlex.quote(str(need_lmod()))
    run = (
        f"source {init} && module use {shlex.quote(str(work))} && module load mpi && "
        f'singularity exec "$SIF" python -c {shlex.quote(VERSION)}'
    )
    after = versions(on_host(apptainer_path, run))
    e2e_facts["MPI after the swap (module file)"] = after["library"]
    assert "4.0.2" in after["library"] and after["ACTIVE"] == "host"
    assert after["LD"].split(":")[:4] == [ABI_DIR, *DEPS] and after["M4"] == LIBMPI


def test_the_same_image_follows_the_hosts_cray_mpich_without_a_rebuild(
    mpi_image, work, apptainer_path, e2e_facts
):
    image, _ = mpi_image
    host = work / "host"
    init = shlex.quote(str(need_lmod()))
    exe = f'singularity exec "$SIF" python -c {shlex.quote(VERSION)}'
    module = f"source {init} && module use {shlex.quote(str(work))} && module load mpi"
    snippet = f". {shlex.quote(str(work / 'mpi.sh'))}"
    lib9 = f"/opt/cray/pe/mpich/9.0.1/{GNU}/lib/libmpi_gnu_123.so.12"
    # A loaded cray-mpich (its CRAY_MPICH_DIR, a host path) wins over the default.
    loaded = {"CRAY_MPICH_DIR": f"{host}/cray/pe/mpich/9.0.1/{GNU}"}
    got = versions(on_host(apptainer_path, f"{module} && {exe}", env=loaded))
    assert got["M4"] == LIBMPI_9 and got["MAPS"] == lib9 and "4.0.2" in got["library"]
    e2e_facts["MPI with cray-mpich 9.0.1 loaded (module file)"] = got["MAPS"]
    try:
        default_pe(host, "9.0.1")  # the host's default PE changed
        for load in (module, snippet):
            got = versions(on_host(apptainer_path, f"{load} && {exe}"))
            assert got["M4"] == LIBMPI_9 and got["MAPS"] == lib9, (load, got)
            assert got["LD"].split(":")[:2] == [LIBMPI_9.rsplit("/", 1)[0], DEPS[0]]
            assert "4.0.2" in got["library"] and got["ACTIVE"] == "host"
        e2e_facts["MPI after the default PE moved to 9.0.1, no rebuild"] = got["MAPS"]
    finally:
        default_pe(host, "8.1.32")


def test_an_empty_host_root_is_one_message_on_load(mpi_image, work, apptainer_path):
    image, _ = mpi_image
    host = work / "host"
    init = shlex.quote(str(need_lmod()))
    module = f"source {init} && module use {shlex.quote(str(work))} && module load mpi"
    (host / "cray").rename(host / "cray.away")
    try:
        (host / "cray").mkdir()
        for load in (module, f". {shlex.quote(str(work / 'mpi.sh'))}"):
            proc = on_host(apptainer_path, f'{load} && singularity exec "$SIF" true')
            assert proc.returncode == 0, proc.stderr
            assert proc.stderr.count("no Cray MPICH for the container") == 1, (
                proc.stderr
            )
            assert f"{host}/cray/pe/lib64/libmpi_gnu_*.so.12" in proc.stderr
            assert "export COTAINR_LUMI_MPI=container" in proc.stderr
            # In the container: the env file's one line, the image's MPICH stays.
            assert proc.stderr.count("is not in the container") == 1, proc.stderr
    finally:
        (host / "cray").rmdir()
        (host / "cray.away").rename(host / "cray")


def test_verify_reports_the_mpi_rows(mpi_image, verify_image, work, e2e_facts):
    image, _ = mpi_image
    _, rows, report = verify_image(
        image, env={"COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml")}
    )
    evidence = {r["check"]: r["evidence"] for r in report["results"]}
    for check in ("mpi4py-libmpi", "mpi-host-binding", "mpi-osu-bandwidth"):
        e2e_facts[f"MPI image, verify {check}"] = f"{rows[check]}: {evidence[check]}"
    assert rows["mpi4py-libmpi"] == "PASS", evidence["mpi4py-libmpi"]
    assert (
        "libmpi.so.12" in evidence["mpi4py-libmpi"]
        and "5.0.2" in evidence["mpi4py-libmpi"]
    )
    assert rows["mpi-host-binding"] == "PASS" and LIBMPI in evidence["mpi-host-binding"]
    assert (
        rows["mpi-osu-bandwidth"] == "N/A"
        and "acceptance.sbatch" in evidence["mpi-osu-bandwidth"]
    )


# -- bad input: one message each ----------------------------------------------


def one_error(output):
    """The build's one error (no traceback, one error line): it and what follows."""
    assert "Traceback" not in output, output[-3000:]
    found = error_lines(output)
    assert len(found) == 1, output[-3000:]
    return output[output.index(found[0]) :].splitlines()


def test_a_base_without_mpi_is_one_message(work, build):
    proc = build(work / "none.sif", "--set", "lumi-env.mpi=host", name="no MPI (fails)")
    assert proc.returncode != 0
    text = "\n".join(one_error(proc.output))
    assert "lumi-env.mpi is 'host', but the image has no MPI" in text
    assert "packages: [mpich, mpi4py]" in text
    assert not (work / "none.sif").exists()


def test_a_host_library_missing_here_is_one_message(work, build):
    (work / "empty-cray").mkdir()
    setting = json.dumps({"libmpi": LIBMPI, "binds": [f"{work}/empty-cray:/opt/cray"]})
    proc = build(
        work / "missing.sif",
        "--set",
        "lumi-env.mpi=host",
        "--set",
        f"lumi-env.mpi-host={setting}",
        "--dry-run",
        name="missing host library (dry run)",
    )
    assert proc.returncode != 0
    text = "\n".join(one_error(proc.output))
    assert f"{LIBMPI} is {work}/empty-cray/pe/mpich/8.1.32" in text
    assert "which does not exist" in text and "ls /opt/cray/pe/mpich" in text


def test_a_pinned_rpath_is_one_message_with_the_fix(work, build):
    pkg = work / "mpipinned"
    pkg.mkdir()
    (pkg / "setup.py").write_text(PINNED_SETUP)
    (pkg / "mpipinned.c").write_text(PINNED_C)
    (work / "pinned-steps.yml").write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {"name": "MPI", "packages": PACKAGES[:1]},
                    {
                        "name": "built against it",
                        "packages": ["./mpipinned"],
                        "no-build-isolation": True,
                    },
                ]
            }
        )
    )
    proc = build(
        work / "pinned.sif", "--pip-steps", "pinned-steps.yml", name="pinned (fails)"
    )
    assert proc.returncode != 0
    text = "\n".join(one_error(proc.output))
    assert (
        "pins the image's /opt/cotainr/conda/envs/conda_container_env/lib/libmpi.so.12"
        in text
    )
    assert "through its DT_RPATH entry" in text and "--enable-new-dtags" in text
    assert not (work / "pinned.sif").exists()


def test_the_network_gets_the_hosts_newest_libfabric_when_the_images_is_gone(
    mpi_image, tmp_path, apptainer_path
):
    """The base names libfabric 1.15.2.0 (CPE 24.03), gone from LUMI since 2026."""
    image, _ = mpi_image
    for version in ("1.9.0", "1.22.0"):  # 1.9.0 sorts last as text
        lib = tmp_path / f"cray/libfabric/{version}/lib64"
        lib.mkdir(parents=True)
        (lib / "libfabric.so.1").write_text("")
    show = 'printf "%s" "$LD_LIBRARY_PATH"'
    runs = []
    for _ in range(2):
        runs.append(
            in_image(
                apptainer_path,
                image,
                show,
                binds=[f"{tmp_path}/cray:/opt/cray"],
                env={"COTAINR_LUMI_MPI": "container"},
            )
        )
        # Then the image's own entry is there: it stays the one used.
        own = tmp_path / "cray/libfabric/1.15.2.0/lib64"
        own.mkdir(parents=True, exist_ok=True)
        (own / "libfabric.so.1").write_text("")
    gone, there = (proc.stdout.split(":") for proc in runs)
    assert "/opt/cray/libfabric/1.15.2.0/lib64" in gone, runs[0].stderr
    assert "/opt/cray/libfabric/1.22.0/lib64" in gone, gone
    assert "/opt/cray/libfabric/1.9.0/lib64" not in gone
    assert "/opt/cray/libfabric/1.22.0/lib64" not in there
