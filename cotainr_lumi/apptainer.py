"""
Run an installed Apptainer/Singularity on a finished image.

cotainr drives ``singularity`` during builds; inspecting a finished ``.sif``
(``cotainr-lumi verify``, a dry run's base image) needs only ``exec``, spelled
here once, and nothing of cotainr.
"""

import collections
import contextlib
import logging
import os
import shutil
import signal
import struct
import subprocess

from . import safeio
from .errors import InputError

logger = logging.getLogger(f"cotainr.{__name__}")

#: A SIF file has this magic after its 32-byte launch line.
SIF_MAGIC = b"SIF_MAGIC"
#: A SIF descriptor (github.com/apptainer/sif, pkg/sif/sif.go: rawDescriptor).
_SIF_DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
#: The SIF data types cotainr-lumi reads: a partition, a JSON object.
SIF_PARTITION = 0x4004
SIF_JSON = 0x4006
#: The partition types cotainr-lumi reads: the root file system, an overlay.
SIF_SYSTEM = 2
SIF_OVERLAY = 4
#: The file system of a partition cotainr-lumi reads.
SIF_SQUASHFS = 1
#: The most descriptors read (Apptainer's images have 48 slots).
MAX_DESCRIPTORS = 4096


#: One data object of a SIF (the partition fields 0 for other objects).
SifObject = collections.namedtuple(
    "SifObject", "id datatype offset size name fstype parttype arch", defaults=(0,) * 3
)


def sif_objects(path):
    """The data objects of a SIF (ValueError: not one; InputError: malformed)."""
    with safeio.open_regular(path) as f:
        header = f.read(128)
        if len(header) < 104 or not header[32:].startswith(SIF_MAGIC):
            raise ValueError(f"{path} is not a SIF image (or is cut short)")
        total, offset = struct.unpack_from("<qq", header, 88)
        size = os.fstat(f.fileno()).st_size
        if not 0 <= total <= MAX_DESCRIPTORS or not 0 <= offset <= size:
            raise _malformed(path, f"{total} descriptors at offset {offset}")
        f.seek(offset)
        table = f.read(total * _SIF_DESCRIPTOR.size)
    if len(table) != total * _SIF_DESCRIPTOR.size:
        raise _malformed(path, "its descriptors are cut short")
    descriptors = _SIF_DESCRIPTOR.iter_unpack(table)
    return [_sif_object(path, size, d) for d in descriptors if d[1]]  # used


def _sif_object(path, size, fields):
    datatype, _used, id_, _group, _link, offset, length, *_, name, extra = fields
    if not (0 <= offset and 0 <= length <= size - offset):
        raise _malformed(path, f"object {id_} lies outside the file")
    name = name.rstrip(b"\0").decode(errors="replace")
    if datatype != SIF_PARTITION:
        return SifObject(id_, datatype, offset, length, name)
    fstype, parttype, arch = struct.unpack_from("<ii3s", extra)
    arch = int(arch.rstrip(b"\0") or 0)
    return SifObject(id_, datatype, offset, length, name, fstype, parttype, arch)


def _malformed(path, what):
    return InputError(
        f"{path} is not a valid SIF image: {what} (a malformed header). Use the "
        "image as Apptainer built it (copy or download it again)."
    )


def sif_add(*, image, file, arch=None):
    """The command adding `file` to a SIF (with `arch`: as an overlay partition)."""
    kind = ["--datatype=6"]
    if arch is not None:
        kind = ["--datatype=4", "--partfs=1", "--parttype=4", f"--partarch={arch}"]
    return [runtime(), "sif", "add", "--groupid=1", *kind, str(image), str(file)]


def sif_delete(*, image, object_id):
    """The command deleting the object `object_id` from a SIF."""
    return [runtime(), "sif", "del", str(object_id), str(image)]


def find_runtime():
    """The Apptainer (or else Singularity) executable on PATH, or None."""
    return shutil.which("apptainer") or shutil.which("singularity")


def runtime():
    """The Apptainer/Singularity executable to use."""
    path = find_runtime()
    if path is None:
        raise InputError(
            "Neither 'apptainer' nor 'singularity' is on PATH. On LUMI they are "
            "always available; elsewhere install Apptainer (this project's tests "
            "use scripts/provision-apptainer.sh)."
        )
    return path


def is_sif(path):
    """Whether a file is a SIF image (by its magic, without Apptainer)."""
    with safeio.open_regular(path) as f:
        return f.read(32 + len(SIF_MAGIC))[32:] == SIF_MAGIC


#: What Apptainer writes into an image's copy when it makes a sandbox of it.
SANDBOX_METADATA = (
    "/.singularity.d",
    "/.singularity.d/labels.json",
    "/.singularity.d/Singularity",
    "/.singularity.d/bootstrap_history",
)


def _listing(*, image, names=()):
    """``unsquashfs -lls`` of a SIF's root file system (None: cannot read it here)."""
    unsquashfs = shutil.which("unsquashfs")
    system = unsquashfs and [o for o in sif_objects(image) if o.parttype == SIF_SYSTEM]
    if not system:
        return None
    cmd = [unsquashfs, "-o", str(system[0].offset), "-lls", "-d", "", image, *names]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return run.stdout.splitlines()


def unpacked_bytes(*, image):
    """The size of a local SIF's files unpacked, read without running it (or None)."""
    try:
        listing = is_sif(image) and _listing(image=image)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if not listing:
        return None
    sizes = [line.split(None, 3)[2] for line in listing if line[:1] == "-"]
    return sum(int(size) for size in sizes if size.isdigit())


def links_in_image(*, image, paths):
    """
    The `paths` that are symbolic links in a local image, read without running it.

    ``{path: link target}`` for a directory or a SIF; None when the SIF cannot
    be read here (that needs ``unsquashfs``).
    """
    if os.path.isdir(image):
        found = {p: os.path.join(image, p.lstrip("/")) for p in paths}
        return {p: os.readlink(h) for p, h in found.items() if os.path.islink(h)}
    if not is_sif(image):
        return {}
    listing = _listing(image=image, names=[p.lstrip("/") for p in paths])
    if listing is None:
        return None
    links = _listed_links(listing)
    return {path: target for path, target in links.items() if path in paths}


def _listed_links(listing):
    """The links of an ``unsquashfs -lls`` listing: ``{/path: target}``."""
    links = {}
    for line in listing:
        fields = line.split(None, 5)
        if line.startswith("l") and len(fields) == 6:
            path, _, target = fields[5].partition(" -> ")
            links["/" + path.lstrip("/")] = target
    return links


def exec_in_image(
    *,
    image,
    args,
    env=None,
    timeout=600,
    writable=False,
    overlay=None,
    binds=(),
):
    """Run a command in an image (`overlay`: a layer on it; `binds`: host paths)."""
    cmd = [runtime(), "exec", "--no-home", "--cleanenv"]
    cmd += ["--bind", ",".join(binds)] if binds else []
    cmd += ["--writable"] if writable else []
    cmd += ["--overlay", os.fspath(overlay)] if overlay else []
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    cmd += [os.fspath(image), *args]
    logger.debug("Running %s", cmd)
    # Its own session, so that a timeout, Ctrl-C or SIGTERM (raised here by
    # the caller's handler) ends the container's processes too, not only the
    # runtime's (a looping env script keeps a shell busy).
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    text = [output.decode("utf-8", errors="replace") for output in (out, err)]
    return subprocess.CompletedProcess(cmd, proc.returncode, *text)


def env_deadline_hint(text, *, image):
    """What to do when `text` has Apptainer's "context deadline exceeded"."""
    if "context deadline exceeded" not in text:
        return ""
    return (
        f" The /.singularity.d/env scripts of {image} did not finish within "
        "Apptainer's limit (60 s): one of them loops or waits. Fix or remove it "
        "in the image (`apptainer build --sandbox DIR IMAGE` unpacks it to look)."
    )


#: The bind variable a build sets for its own mounts (a user's are unset then).
BIND_VARIABLE = "SINGULARITY_BIND"


def can_bind(path):
    """Whether `path` can be written in a bind list (it has no comma or colon)."""
    return "," not in str(path) and ":" not in str(path)


@contextlib.contextmanager
def bind_mounts(binds):
    """Add `binds` (``source:destination[:ro]``) to the bind variable meanwhile."""
    before = os.environ.get(BIND_VARIABLE)
    os.environ[BIND_VARIABLE] = ",".join([*([before] if before else []), *binds])
    try:
        yield
    finally:
        if before is None:
            del os.environ[BIND_VARIABLE]
        else:
            os.environ[BIND_VARIABLE] = before


#: Runs ``$0`` (Python source) with the image's own python, passing ``$1...``.
IMAGE_PYTHON = 'exec "$(command -v python || command -v python3)" -c "$0" "$@"'
