"""
A full image at disk speed (issue 40): the sandbox squashed once into a SIF.

What ``apptainer build IMAGE.sif SANDBOX/`` writes (the build labels and the
definition in the sandbox, a definition object, the ``inspect`` metadata from
``apptainer inspect --all``, the squashfs system partition), without its copy
of the sandbox, with a fast compressor, the job's cores and a bounded memory.
The SIF is assembled with the runtime's own ``sif new``/``sif add``.
"""

from dataclasses import dataclass
import datetime
import json
import logging
import os
from pathlib import Path
import re
import shutil
import subprocess
import tempfile
import time
from typing import Optional

from .. import apptainer
from ..imagelayout import DEFINITION_FILE, LABEL_COMPRESSION, LABELS_FILE
from .rootfs import resolve_in_root

logger = logging.getLogger(f"cotainr.{__name__}")

#: mksquashfs's compressors: (lowest, highest, default level), None: no levels.
COMPRESSORS = {"gzip": (1, 9, 9), "zstd": (1, 22, 3), "lz4": None, "xz": None}
#: The SIF architecture numbers (``sif add --partarch``) of ``uname -m``.
SIF_ARCH = {"i686": 1, "x86_64": 2, "armv7l": 3, "aarch64": 4, "ppc64": 5}
SIF_ARCH |= {"ppc64le": 6, "s390x": 11, "riscv64": 12}
#: Apptainer's name of the inspect metadata object.
METADATA_NAME = "inspect-metadata.json"
#: The host directories a probe image borrows (bound, or the host's links).
PROBE_DIRS = ("usr", "bin", "lib", "lib64", "sbin")


@dataclass(frozen=True)
class Compression:
    """A squashfs compressor and its level (None: it takes none)."""

    name: str
    level: Optional[int] = None

    @classmethod
    def parse(cls, text):
        """``zstd``, ``zstd:19``, ``gzip:1``, ``lz4`` (ValueError: what is allowed)."""
        name, _, level = str(text).partition(":")
        if name not in COMPRESSORS:
            raise ValueError(f"{text!r}: the compressors are {', '.join(COMPRESSORS)}")
        if COMPRESSORS[name] is None:
            if level:
                raise ValueError(f"{text!r}: {name} takes no level")
            return cls(name)
        low, high, default = COMPRESSORS[name]
        if not level:
            return cls(name, default)
        if not level.isdigit() or not low <= int(level) <= high:
            raise ValueError(f"{text!r}: {name} levels are {low}-{high}")
        return cls(name, int(level))

    def __str__(self):
        return self.name if self.level is None else f"{self.name}:{self.level}"

    def args(self):
        """The mksquashfs options."""
        level = [] if self.level is None else ["-Xcompression-level", str(self.level)]
        return ["-comp", self.name, *level]


#: What every runtime mounts (Apptainer's default).
GZIP = Compression("gzip", 9)


def _slurm(name):
    """The number in a Slurm variable (0: unset, or not a number)."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def job_processors():
    """The cores this job has (Slurm's allocation, within this process's affinity)."""
    cores = len(os.sched_getaffinity(0))
    wanted = _slurm("SLURM_CPUS_PER_TASK") or _slurm("SLURM_CPUS_ON_NODE")
    return min(wanted or cores, cores)


def _cgroup_free():
    """What the memory cgroup (v2) still allows, or None."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        group = Path("/sys/fs/cgroup") / line.split(":", 2)[2].lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        used = int((group / "memory.current").read_text())
    except (OSError, IndexError, ValueError):
        return None
    return int(limit) - used if limit.isdigit() else None


def job_memory():
    """The bytes of memory this job has (Slurm's, the cgroup's, MemAvailable)."""
    per_cpu = _slurm("SLURM_MEM_PER_CPU") * job_processors()
    sizes = [_cgroup_free(), (_slurm("SLURM_MEM_PER_NODE") or per_cpu) * 1024**2]
    with open("/proc/meminfo") as f:
        sizes += [int(line.split()[1]) * 1024 for line in f if "MemAvailable" in line]
    return min(size for size in sizes if size)


def squash_command(*, source, dest, compression, extra=()):
    """The mksquashfs command: the job's cores, a quarter of its memory."""
    memory = max(64, job_memory() // 4 // 1024**2)
    cmd = ["mksquashfs", str(source), str(dest), "-noappend", "-no-progress"]
    cmd += [] if os.geteuid() == 0 else ["-all-root"]  # as Apptainer does
    cmd += ["-processors", str(job_processors()), "-mem", f"{memory}M"]
    return [*cmd, *compression.args(), *extra]


@dataclass(frozen=True)
class WrittenImage:
    """A SIF this module wrote."""

    path: Path
    compression: Compression
    seconds: float  # to squash it
    size: int
    why_gzip: Optional[str] = None  # why the compressor asked for was not used


def last_line(text, *, default="no message"):
    """The last line of a tool's output (its error, as a rule)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else default


class _StepError(Exception):
    """A step of writing the image failed."""


class _NoSifError(Exception):
    """The runtime's ``sif`` tool failed (Apptainer builds the image)."""


def _run(cmd):
    cmd = [str(c) for c in cmd]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise _StepError(f"{Path(cmd[0]).name}: {e}") from None
    if done.returncode:
        why = last_line(done.stderr or done.stdout)
        raise _StepError(f"{Path(cmd[0]).name} {cmd[1]}: {why}")
    return done.stdout


#: What Go's encoding/json escapes in its raw UTF-8.
GO_ESCAPES = {ord(char): f"\\u{ord(char):04x}" for char in "<>&\u2028\u2029"}


def _go_json(value, **indent):
    """JSON as Go's encoding/json writes it (raw UTF-8, <, > and & escaped)."""
    return json.dumps(value, ensure_ascii=False, **indent).translate(GO_ESCAPES)


def _build_date(now):
    """Apptainer's ``org.label-schema.build-date`` (``Monday_2_January_2006_15:04:05_MST``)."""
    clock = f"{now.hour}:{now.minute}:{now.second}"
    return f"{now:%A}_{now.day}_{now:%B}_{now.year}_{clock}_{now:%Z}"


def _insert_definition(root):
    """The definition in :data:`DEFINITION_FILE`; the last one to history."""
    path = resolve_in_root(root=root, path=DEFINITION_FILE)
    history = path.with_name("bootstrap_history")
    if path.is_file():
        history.mkdir(exist_ok=True)
        names = sorted(os.listdir(history))
        prefix = re.sub(r"\d+$", "", names[-1]) if names else "Apptainer"
        os.replace(path, history / f"{prefix}{len(names)}")
    path.write_text(f"bootstrap: localimage\nfrom: {root}\n\n")


def _insert_labels(root, compression):
    """The build labels and :data:`LABEL_COMPRESSION`; the text written."""
    path = resolve_in_root(root=root, path=LABELS_FILE)
    text = path.read_text() if path.is_file() else "{}"
    labels = json.JSONDecoder().raw_decode(text)[0]
    now = datetime.datetime.now().astimezone()
    labels["org.label-schema.build-date"] = _build_date(now)
    if "org.opencontainers.image.created" in labels:
        labels["org.opencontainers.image.created"] = now.isoformat("T", "seconds")
    deffile = "org.label-schema.usage.singularity.deffile."
    labels[deffile + "bootstrap"] = "localimage"
    labels[deffile + "from"] = str(root)
    labels[LABEL_COMPRESSION] = str(compression)
    text = _go_json(dict(sorted(labels.items())), indent="\t")
    path.write_text(text)
    return text


def _metadata(root, work):
    """The SIF object of what ``apptainer inspect`` shows, as Apptainer stores it."""
    try:
        shown = _run([apptainer.runtime(), "inspect", "--all", root])
        text = _go_json(json.loads(shown), separators=(",", ":"))
    except (_StepError, ValueError) as e:
        logger.info("No inspect metadata in the image: %s", e)
        return []
    (work / METADATA_NAME).write_text(text)
    return [["--datatype=6", f"--filename={METADATA_NAME}", work / METADATA_NAME]]


def _system_partition(arch):
    return ["--datatype=4", "--partfs=1", "--parttype=2", f"--partarch={arch}"]


def _new_sif(path, objects):
    """A new SIF at `path` holding `objects` (each: ``sif add`` options, the file)."""
    runtime = apptainer.runtime()
    Path(path).unlink(missing_ok=True)
    _run([runtime, "sif", "new", path])
    for *options, file in objects:
        _run([runtime, "sif", "add", "--groupid=1", *options, path, file])


def _write(root, path, compression, *, arch, work):
    """Squash `root` into a SIF at `path` as Apptainer does; mksquashfs's seconds."""
    squashfs = work / "image.sqfs"
    metadata = _metadata(root, work)
    start = time.monotonic()
    _run(squash_command(source=root, dest=squashfs, compression=compression))
    seconds = time.monotonic() - start
    definition = resolve_in_root(root=root, path=DEFINITION_FILE)
    objects = [["--datatype=1", "--filename=", definition], *metadata]
    objects.append([*_system_partition(arch), "--filename=", squashfs])
    try:
        _new_sif(path, objects)
    except _StepError as e:
        raise _NoSifError(str(e)) from None
    finally:
        squashfs.unlink()
    return seconds


def _compressor_problem(path, labels, compression):
    """Why the runtime cannot run `path`, when that is its `compression` (else None)."""
    try:
        seen = apptainer.exec_in_image(image=path, args=["cat", LABELS_FILE])
    except subprocess.TimeoutExpired as e:
        seen = subprocess.CompletedProcess(e.cmd, -9, "", f"killed after {e.timeout} s")
    if seen.returncode == 0 and seen.stdout == labels:
        return None
    problem = last_line(seen.stderr, default="it shows other labels")
    if compression == GZIP or mount_problem(compression) is None:
        logger.warning("The runtime cannot run the image here (kept): %s", problem)
        return None  # not for its compression: a tiny image of it runs
    return problem


def write_sif(*, sandbox_dir, path, compression, architecture):
    """
    Write the SIF of a finished sandbox to `path`, run it once, and return it.

    Parameters
    ----------
    sandbox_dir : path
        The finished sandbox (its labels and definition are updated).
    path : path
        The image to write (replaced).
    compression : Compression
        The compressor asked for; gzip when the runtime cannot run the image.
    architecture : str
        The sandbox's ``uname -m``.

    Returns
    -------
    image : WrittenImage or None
        None when it cannot be written here (said why): Apptainer builds it.
    """
    root = Path(sandbox_dir)
    path = Path(path)
    try:
        if architecture not in SIF_ARCH:
            problem = f"the architecture {architecture!r} has no SIF number here"
            raise _NoSifError(problem)
        if shutil.which("mksquashfs") is None:
            raise _NoSifError("mksquashfs is not on PATH")
        _insert_definition(root)
        with tempfile.TemporaryDirectory(prefix="sif-") as work:
            arch = SIF_ARCH[architecture]
            image = _write_and_run(root, path, compression, arch, Path(work))
    except _NoSifError as e:
        path.unlink(missing_ok=True)
        logger.warning("Apptainer builds the image (slower): %s.", e)
        return None
    logger.info(
        f"Image {path}: {image.compression}, {image.size / 1e6:.1f} MB, "
        f"squashed in {image.seconds:.1f} s on {job_processors()} cores"
    )
    return image


def _write_and_run(root, path, compression, arch, work):
    """Write the image and run it once; squash it with gzip again if it cannot mount."""
    why = None
    for attempt in dict.fromkeys([compression, GZIP]):
        labels = _insert_labels(root, attempt)
        try:
            seconds = _write(root, path, attempt, arch=arch, work=work)
            problem = _compressor_problem(path, labels, attempt)
        except _StepError as e:
            path.unlink(missing_ok=True)
            if attempt == GZIP:
                raise OSError(f"the image could not be written: {e}") from None
            problem = f"mksquashfs cannot write it ({e})"
        if problem is None:
            return WrittenImage(path, attempt, seconds, path.stat().st_size, why)
        why = f"{Path(apptainer.runtime()).name} cannot run the {attempt} image: {problem}"
        logger.warning("Squashing the image again with gzip: %s", why)
    raise AssertionError("unreachable")  # gzip is the last attempt


def mount_problem(compression, *, timeout=60):
    """Why the runtime here cannot mount a tiny `compression` image (None: it can)."""
    with tempfile.TemporaryDirectory(prefix="cotainr-lumi-probe-") as work:
        tree = Path(work, "tree")
        tree.mkdir()
        binds = []
        for name in PROBE_DIRS:  # the host's programs, bound or linked as here
            host = Path("/", name)
            if host.is_symlink():
                (tree / name).symlink_to(os.readlink(host))
            elif host.is_dir():
                (tree / name).mkdir()
                binds.append(str(host))
        squashfs = Path(work, "probe.sqfs")
        sif = squashfs.with_suffix(".sif")
        arch = SIF_ARCH.get(os.uname().machine, 0)
        try:
            _run(squash_command(source=tree, dest=squashfs, compression=compression))
            _new_sif(sif, [[*_system_partition(arch), squashfs]])
            seen = apptainer.exec_in_image(
                image=sif, args=["true"], binds=binds, timeout=timeout
            )
        except (_StepError, subprocess.TimeoutExpired) as e:
            return str(e)
    if seen.returncode == 0:
        return None
    return last_line(seen.stderr)
