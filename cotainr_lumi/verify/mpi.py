"""The MPI rows of ``cotainr-lumi verify``."""

from pathlib import Path

from ..imagelayout import MPI_FILE
from ..stages.lumi_env.mpi import gpu_aware_caveat, parse_load_check
from .status import FAIL, NA, PASS, WARN, hardware_row

#: How to run the LUMI acceptance job: from its directory, which holds
#: osu_bw.py (the job reads it from $SLURM_SUBMIT_DIR), with an absolute
#: image path.
ACCEPTANCE_JOB = (
    "cd examples/slurm && sbatch --account=<project> acceptance.sbatch "
    "/abs/path/IMAGE.sif"
)

#: The LUMI-only MPI check: (id, what, the command to run there).
HARDWARE_CHECK = (
    "mpi-osu-bandwidth",
    "OSU point-to-point bandwidth (osu_bw, 4 MiB messages) >= 10 GB/s between "
    "two nodes through the host's Cray MPICH (COTAINR_LUMI_MPI=host; LUMI's user "
    "guide: 12.2 GB/s on the host's Cray MPICH, 2.4 GB/s on a container MPI "
    "without CXI), and MPI.Get_library_version() naming Cray MPICH",
    f"{ACCEPTANCE_JOB} (on LUMI-G; MPI part with the image's module file next to it)",
)


def _load_error_row(record, error):
    """The ``mpi4py-libmpi`` row when mpi4py could not load an MPI library."""
    if "No module named 'mpi4py'" in error:
        return NA, "mpi4py is not installed in the image"
    if record and not record.get("image-library"):
        return NA, (
            "the image has no MPI library of its own: mpi4py runs only with "
            f"the host binding ({error})"
        )
    return FAIL, f"mpi4py cannot load an MPI library: {error}"


def _unresolved(ldd, libraries):
    """The libraries' dependencies ``ldd`` found nowhere, in words."""
    return [
        f"{lib}: {name} => not found"
        for lib in libraries
        for name, path in (ldd.get(lib, {}).get("deps") or {}).items()
        if path is None
    ]


def _loaded_row(facts, record, loaded):
    """The ``mpi4py-libmpi`` row of the parsed load check."""
    if "error" in loaded:
        return _load_error_row(record, loaded["error"])
    libraries = loaded.get("libmpi") or []
    version = loaded.get("library_version", "")
    unresolved = _unresolved(facts["ldd"], libraries)
    if unresolved:
        return FAIL, (
            f"mpi4py loads {', '.join(libraries)} but ldd: {'; '.join(unresolved)}"
        )
    if not any(Path(lib).name.startswith("libmpi.so.12") for lib in libraries):
        return FAIL, (
            f"mpi4py loads {', '.join(libraries) or 'no libmpi'} ({version[:80]}), "
            "not an MPICH-ABI libmpi.so.12: LUMI's Cray MPICH cannot replace it"
        )
    return PASS, (
        f"mpi4py {loaded.get('mpi4py') or ''} loads {', '.join(libraries)} "
        f"({version}); its dependencies resolve (ldd)"
    )


def _swap_words(record, host):
    """What the host binding puts in place of the image's MPI, in words."""
    lib = host["libmpi"]
    if host.get("setting") == "discover":
        lib = (
            f"the Cray MPICH the module file finds on load (at build: {lib or 'none'})"
        )
    image = record.get("image-library") or "nothing (no library in the image)"
    return (
        f"{lib} replaces {image} (LD_LIBRARY_PATH first: "
        f"{':'.join(host['ld-library-path'])}; MPI4PY_LIBMPI={host['mpi4py-libmpi']}; "
        f"binds: {','.join(host['binds'])})"
    )


def _binding_row(record):
    """The ``mpi-host-binding`` row."""
    if record is None:
        return NA, f"no {MPI_FILE}: built without cotainr-lumi's MPI support"
    if record.get("mode") == "none":
        return NA, f"lumi-env mpi: none ({record.get('reason')})"
    if record.get("pins"):
        pin = record["pins"][0]
        return FAIL, (
            f"{pin['user']} pins {pin['library']} with DT_RPATH {pin['entry']!r}"
        )
    host = record.get("host")
    swap = _swap_words(record, host) if host else ""
    srun = record.get("srun") or {}
    if record.get("mode") == "host":
        return PASS, (
            f"default host: on LUMI, with the module file loaded, {swap}; "
            f"launch with {srun.get('host', 'srun')}; COTAINR_LUMI_MPI=container keeps the image's"
        )
    text = f"default container: the image's {record.get('image-library')} ({record.get('reason')})"
    if host:
        text += f"; COTAINR_LUMI_MPI=host: {swap}"
    return PASS, text + f"; launch with {srun.get('container', 'srun --mpi=pmi2')}"


def mpi_rows(facts):
    """The rows for the probe's MPI facts."""
    if not facts or "check" not in facts:
        return []
    record = facts.get("record")  # an object, or None (the probe reads no other)
    loaded = parse_load_check(facts["check"]["out"])
    has_mpi4py = "No module named 'mpi4py'" not in loaded.get("error", "")
    if not has_mpi4py and (record is None or record.get("mode") in (None, "none")):
        return []
    return [
        ("mpi4py-libmpi", *_loaded_row(facts, record, loaded)),
        ("mpi-host-binding", *_binding_row(record)),
        hardware_row(*HARDWARE_CHECK),
    ]


def check_mpi(report, facts):
    """Add the MPI rows of the probe's facts to a report.

    With a host binding on ROCm 7 also the ``mpi-gpu-aware`` WARN.
    """
    for row in mpi_rows(facts.get("mpi")):
        report.add(*row)
    record = (facts.get("mpi") or {}).get("record") or {}
    if not record.get("host") or record.get("mode") == "none":
        return
    caveat = gpu_aware_caveat((facts["rocm"] or {}).get("version_file"))
    if caveat is not None:
        report.add("mpi-gpu-aware", WARN, caveat)
