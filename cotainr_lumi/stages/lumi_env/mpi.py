"""
MPI in the image: which ``libmpi.so.12`` its MPI users run on (``docs/mpi.md``).

``container``: the image's own MPICH (``srun --mpi=pmi2``); ``host``: LUMI's
Cray MPICH, found on the host and bound in by the module file, replaces the
image's MPICH-ABI library at run time (HPE's hybrid model, arXiv 2407.19928).
``COTAINR_LUMI_MPI`` switches at run time (the MPI env file reads it).
"""

from dataclasses import dataclass, field, replace
import importlib.resources
import json
import logging
import os
from pathlib import PurePosixPath
import re
import shlex
import subprocess
import textwrap
from typing import Optional

from ...engine.origins import Origin
from ...engine.rocmwindow import major_minor
from ...engine.settings import SettingError, StageSettings, each, read_declared, setting
from ...errors import StageError
from .envfile import computed_default, read_host_value
from .mpiscan import MPICH_ABI, ImageFiles, MpiScan, scan_mpi
from .ops import Comment, Discover, PushEnv, printable
from .validators import validate_bind, validate_path_entry

logger = logging.getLogger(f"cotainr.{__name__}")

#: The run-time switch.
RUNTIME_VAR = "COTAINR_LUMI_MPI"
#: The host library's path in the container, and its LD_LIBRARY_PATH entries
#: (found on the host by the module file, else the build's default).
HOST_LIBMPI_VAR = "COTAINR_LUMI_MPI_HOST_LIBMPI"
HOST_PATH_VAR = "COTAINR_LUMI_MPI_HOST_PATH"
#: ``lumi-env.mpi-host.libmpi``: find the host's Cray MPICH where it runs.
DISCOVER = "discover"
#: Where the container sees the host's Cray software.
CRAY = "/opt/cray"
#: What the env file applied.
ACTIVE_VAR = "COTAINR_LUMI_MPI_ACTIVE"
#: How to launch MPI ranks on LUMI, per mode (LUMI docs, container-jobs.md;
#: cotainr's examples/LUMI/conda_mpi4py_mpich/README.md).
SRUN_HINT = {
    "host": "srun (LUMI's default --mpi=cray_shasta: Cray PMI for Cray MPICH)",
    "container": "srun --mpi=pmi2 (the image's MPICH uses PMI-2)",
}

#: Moves the entries of $_cl_new (':' separated) to the front of
#: LD_LIBRARY_PATH, in order, keeping every other entry once (IFS and
#: noglob changed in a subshell only).
_MOVE_TO_FRONT = """\
LD_LIBRARY_PATH=$(
    IFS=:
    set -f
    keep=
    for d in ${LD_LIBRARY_PATH-}; do
        case ":$_cl_new:" in
        *":$d:"*) ;;
        *) [ -n "$d" ] && keep=${keep:+$keep:}$d ;;
        esac
    done
    printf '%s' "$_cl_new${keep:+:$keep}"
); export LD_LIBRARY_PATH"""


def _say(*parts):  # shell code printing one line on stderr
    words = [f'"{p}"' if p.startswith("$") else shlex.quote(p) for p in parts]
    return f"printf '{'%s' * len(words)}\\n' {' '.join(words)} >&2"


def _host_case(*, binding, own):
    """The ``host)`` branch of the env file's ``case``."""
    if binding is None:
        say = f"{RUNTIME_VAR}=host, but this image has no host MPI binding"
        say = _say(f"cotainr-lumi: {say} (lumi-env.mpi-host); using {own}.")
        return f"host)\n    {say}\n    {ACTIVE_VAR}=container ;;"
    move = textwrap.indent(_MOVE_TO_FRONT, " " * 8)
    libmpi = computed_default(name="MPI4PY_LIBMPI", expression=f'"${HOST_LIBMPI_VAR}"')
    say = _say(
        f"cotainr-lumi: {RUNTIME_VAR}=host, but LUMI's Cray MPICH (",
        f"${{{HOST_LIBMPI_VAR}:-none found}}",
        ") is not in the container (load the image's module file, or source "
        f"its .sh, to bind LUMI's Cray MPICH); using {own}. Export "
        f"{RUNTIME_VAR}=container to choose that.",
    )
    return f"""\
host)
    if [ -f "${HOST_LIBMPI_VAR}" ]; then
{move}
        {libmpi}
        {ACTIVE_VAR}=host
    else
        {say}
        {ACTIVE_VAR}=container
    fi ;;"""


MODES = ("auto", "container", "host", "none")


def check_mode(value):
    """Check ``lumi-env.mpi``."""
    if value not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)} (got {value!r})")


def _check_libmpi(value):
    if value == DISCOVER:
        return
    validate_path_entry(name="mpi-host.libmpi", entry=value)
    if PurePosixPath(value).name != MPICH_ABI:
        raise ValueError(
            f"must be an MPICH-ABI library named {MPICH_ABI} (got {value!r}), "
            "e.g. Cray MPICH's /opt/cray/pe/mpich/<version>/ofi/gnu/<v>/"
            f"lib-abi-mpich/{MPICH_ABI}, or {DISCOVER}"
        )


@dataclass(frozen=True)
class HostBinding(StageSettings):
    """
    The keys of ``lumi-env.mpi-host``: the host binding of a base family.

    As :meth:`from_setting` reads them, ``ld_library_path`` starts with the
    directory of ``libmpi`` and the lists are tuples.
    """

    libmpi: Optional[str] = setting(
        None,
        doc="the host's MPICH-ABI libmpi.so.12 as the container sees it "
        "(Cray MPICH's lib-abi-mpich), first on LD_LIBRARY_PATH; discover: "
        "found on the host where the module file is loaded (docs/mpi.md)",
        check=_check_libmpi,
    )
    ld_library_path: list[str] = setting(
        [],
        doc="then these directories, in order (Cray PMI, the host libfabric, ...); "
        "a '*' component: the newest installed version",
        check=each(lambda e: validate_path_entry(name="LD_LIBRARY_PATH", entry=e)),
    )
    binds: list[str] = setting(
        [],
        doc="what the module file binds for it (SRC[:DST]): the library, its "
        "directories and the host libraries they need (libcxi)",
        check=each(validate_bind),
    )
    binds_if_absent: list[str] = setting(
        [],
        doc="host libraries bound only into an image without a library of that "
        "name (libjansson.so.4: LUST's PyTorch page)",
        check=each(validate_bind),
    )

    @classmethod
    def from_setting(cls, value):
        """The binding of a ``lumi-env.mpi-host`` value (None without ``libmpi``)."""
        read = cls.complete(read_declared(schema=cls, raw=value or {}, origin=Origin()))
        if not read.libmpi:
            return None
        own = [] if read.discover else [os.path.dirname(read.libmpi)]
        order = tuple(dict.fromkeys([*own, *read.ld_library_path]))
        return replace(
            read,
            ld_library_path=order,
            binds=tuple(read.binds),
            binds_if_absent=tuple(read.binds_if_absent),
        )

    @property
    def discover(self):
        """Whether the host library is found where the module file is loaded."""
        return self.libmpi == DISCOVER

    def command(self):
        """:func:`discovery_program` with its arguments for this binding."""
        # The library set replaces its directory; discover: none ("").
        entries = [self.libmpi, *self.ld_library_path[1:]]
        if self.discover:
            entries = ["", *self.ld_library_path]
        args = [self.host_path(CRAY) or CRAY, CRAY]
        for entry in entries:
            args += [entry, self.host_path(entry) or entry]
        return ["sh", "-c", discovery_program(), "sh", *args]

    def defaults(self, found):
        """The env file's default library and LD_LIBRARY_PATH (the build's)."""
        if found.libmpi:
            return found.libmpi, list(found.ld_library_path)
        static = [e for e in self.ld_library_path if "*" not in e]
        return ("" if self.discover else self.libmpi), static

    def _cover(self, path):
        """(bind, source, host path) of the deepest bind bringing `path` in."""
        covers = [(-1, None, None, None)]
        for bind in self.binds:
            src, _, rest = bind.partition(":")
            dst = PurePosixPath(rest.partition(":")[0] or src)
            if PurePosixPath(path).is_relative_to(dst):
                host = PurePosixPath(src, PurePosixPath(path).relative_to(dst))
                covers.append((len(dst.parts), bind, src, str(host)))
        return max(covers, key=lambda c: c[0])[1:]

    def host_path(self, path):
        """The host path behind an image path (None when no bind covers it)."""
        return self._cover(path)[2]

    def without_host_libfabric(self):
        """The binding for an image with its own libfabric (no ``/libfabric/``)."""
        path = tuple(p for p in self.ld_library_path if "/libfabric/" not in p)
        return replace(self, ld_library_path=path)

    def find_here(self, *, env=None):
        """Run the module file's discovery on this host."""
        proc = subprocess.run(
            self.command(), capture_output=True, text=True, env=env, check=False
        )
        # Lines as the module file's parser sees them: split at "\n" only.
        out = dict(ln.split(" ", 1) for ln in proc.stdout.split("\n") if " " in ln)
        if "libmpi" not in out:
            problem = out.get("problem") or f"discovery failed: {proc.stderr.strip()}"
            return HostMpi(problem=problem)
        path = tuple(out.get("path", "").split(":"))
        version = out.get("version") or None
        return HostMpi(out["libmpi"], path, out["source"], version)

    def host_problems(self):
        """What of the binding is missing here (where its bind's source exists)."""
        # A binding that discovers its library names none: no bind covers it.
        paths = [p for p in [self.libmpi, *self.ld_library_path] if "*" not in p]
        problems = []
        for path in dict.fromkeys(paths):
            bind, src, host = self._cover(path)
            if bind and os.path.exists(src) and not os.path.exists(host):
                problems.append(
                    f"{path} is {host} on this host (bind {bind}), which does not exist"
                )
        return problems


#: LUMI-training-materials User-Updates/Update-202601 (index.md L80-81): no
#: Cray MPICH of the PEs up to 25.09 (cray-mpich 9.0.1) does GPU-aware MPI
#: with ROCm 7.
GPU_AWARE_CAVEAT = (
    "no Cray MPICH up to PE 25.09 (cray-mpich 9.0.1) does GPU-aware MPI with "
    "ROCm 7 (LUMI's January 2026 update notes): pass host buffers to MPI and "
    "leave MPICH_GPU_SUPPORT_ENABLED unset; the host binding sets nothing GPU-aware"
)


def gpu_aware_caveat(rocm_version):
    """:data:`GPU_AWARE_CAVEAT` for an image of ROCm `rocm_version` 7 or newer."""
    version = major_minor(rocm_version)
    if version and version[0] >= 7:
        return f"ROCm {rocm_version}: {GPU_AWARE_CAVEAT}"
    return None


def absent_binds(*, binding, root):
    """{bind: the image's library of that name, or None (then it is bound)}."""
    found = {}
    image = ImageFiles(root)
    for bind in binding.binds_if_absent if binding else ():
        src, _, rest = bind.partition(":")
        name = PurePosixPath(rest.partition(":")[0] or src).name
        found[bind] = image.find(name, image.library_dirs)
    return found


def discovery_program():
    """``hostscripts/discover-mpi`` (POSIX sh), without its comment lines."""
    text = importlib.resources.files(__package__) / "hostscripts" / "discover-mpi"
    return re.sub(r"(?m)^ *#.*\n", "", text.read_text())


@dataclass(frozen=True)
class HostMpi:
    """What :meth:`HostBinding.find_here` found (container paths)."""

    libmpi: Optional[str] = None
    ld_library_path: tuple = ()
    source: Optional[str] = None
    version: Optional[str] = None
    problem: Optional[str] = None


def check_host_binding(value):
    """Check ``lumi-env.mpi-host``."""
    binding = HostBinding.from_setting(value)
    need = binding and (f"{CRAY}/pe" if binding.discover else binding.libmpi)
    if binding is not None and binding.host_path(need) is None:
        raise SettingError(
            f"{need} is not below any of the binds "
            f"({', '.join(binding.binds) or 'none'}): it would never be in the "
            "container; add the bind that brings it in (e.g. /opt/cray)",
            path=("libmpi",),
        )


def _no_mpi_text(*, requested, scan):
    """Why lumi-env.mpi `requested` cannot be met in an image without MPI."""
    text = (
        f"lumi-env.mpi is {requested!r}, but the image has no MPI: no {MPICH_ABI} "
        "(MPICH ABI) in the Python environment's lib/ or the loader's directories, "
        f"and nothing in the environment needs one. Install one with a pip step "
        "(packages: [mpich, mpi4py]), build on a base image with MPICH (the LUMI "
        "AI Factory images), or leave lumi-env.mpi at auto (none: no MPI)"
    )
    if scan.open_mpi:
        text += (
            f". Found Open MPI ({scan.open_mpi[0]}), which LUMI's Cray MPICH "
            "cannot replace: use the `mpich` wheel instead"
        )
    return text


def _auto_mode(*, scan, binding):
    """The mode auto picks for an image with MPICH."""
    cxi = [lib for lib in scan.mpich if lib.cxi]
    if cxi:
        return "container", f"auto: the image's {cxi[0].path} speaks CXI"
    if binding is None:
        return "container", "auto: this system has no host binding"
    return "host", "auto: the image's MPICH does not speak CXI"


def resolve_mode(*, requested, scan, binding):
    """The mode of a build, and why."""
    if requested == "none":
        return "none", "lumi-env.mpi is none"
    if not scan.has_mpich:
        if requested == "auto":
            return "none", "auto: the image has no MPICH-ABI MPI"
        raise ValueError(_no_mpi_text(requested=requested, scan=scan))
    if requested == "auto":
        return _auto_mode(scan=scan, binding=binding)
    if requested == "host" and binding is None:
        raise ValueError(
            "lumi-env.mpi is 'host', but this system has no host binding "
            "(lumi-env.mpi-host.libmpi is not set): give one in the system profile "
            "(see lumi-g-ext-rocm-6.2 in cotainr_lumi/systems.yaml) or use lumi-env.mpi=container"
        )
    if requested == "container" and not scan.mpich:
        raise ValueError(
            f"lumi-env.mpi is 'container', but the image has no {MPICH_ABI} for its "
            f"MPI users ({scan.users[0].path} ...) to run on: add the `mpich` "
            "wheel to a pip step (packages: [mpich, mpi4py]) or use lumi-env.mpi=host"
        )
    return requested, f"lumi-env.mpi is {requested}"


def _pin_text(pins):
    """What pins the image's library, and why that matters."""
    first = pins[0]
    more = f" ({len(pins) - 1} more)" if len(pins) > 1 else ""
    owner = f" ({first.distribution})" if first.distribution else ""
    return (
        f"{first.user}{owner} pins the image's {first.library} through "
        f"{first.via} entry {first.entry!r}{more}: the loader searches DT_RPATH "
        "before LD_LIBRARY_PATH, so LUMI's Cray MPICH cannot replace it at run time"
    )


def check_host_paths(*, binding, error):
    """Stop when the host library is missing here; warn about other directories."""
    for problem in binding.host_problems() if binding else []:
        if not problem.startswith(f"{binding.libmpi} is "):  # the library is first
            logger.warning("lumi-env.mpi-host: %s (skipped by the loader)", problem)
            continue
        raise error(
            f"lumi-env.mpi-host: {problem}: the Cray MPICH this binding "
            "names is not installed here (ls /opt/cray/pe/mpich). Set "
            "lumi-env.mpi-host.libmpi to discover (found on load) or another path "
            "in your system profile or with --set, or keep the image's "
            "MPICH: --set lumi-env.mpi=container"
        )


#: The mark of :data:`LOAD_CHECK`'s line.
LOAD_CHECK_MARK = "COTAINR_LUMI_MPI_CHECK "
#: Which MPI library mpi4py loads (no MPI_Init needed), run in the container at
#: build time and by ``cotainr-lumi verify``: one line, the mark, then JSON.
LOAD_CHECK = (
    f"MARK = {LOAD_CHECK_MARK!r}\n"
    + r"""
import json
out = {}
try:
    import mpi4py
    out["mpi4py"] = getattr(mpi4py, "__version__", None)
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    first = (MPI.Get_library_version().strip().splitlines() or [""])[0]
    out["library_version"] = " ".join(first.split())[:200]
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    out["libmpi"] = sorted(p for p in paths if "/libmpi" in p)
except Exception as e:  # noqa: BLE001
    out["error"] = f"{type(e).__name__}: {e}"
print(MARK + json.dumps(out))
"""
)


def parse_load_check(text):
    """What :data:`LOAD_CHECK` reported."""
    for line in text.splitlines():
        if line.startswith(LOAD_CHECK_MARK):
            try:
                return json.loads(line.removeprefix(LOAD_CHECK_MARK))
            except ValueError:
                break
    return {"error": f"no answer from the check: {text.strip()[-300:]}"}


@dataclass
class MpiPlan:
    """What the stage does about MPI in one build."""

    requested: str
    mode: str
    reason: str
    binding: Optional[HostBinding]
    scan: MpiScan
    loaded: Optional[dict] = None
    #: What the build found on its host (:meth:`HostBinding.find_here`).
    found: HostMpi = HostMpi()
    #: binds-if-absent: {bind: the image's own library, or None (bound)}.
    absent: dict = field(default_factory=dict)
    #: :func:`gpu_aware_caveat` of the image (None: none applies).
    gpu_caveat: Optional[str] = None

    @property
    def active(self):
        """Whether the image gets MPI settings (not ``none``)."""
        return self.mode != "none"

    @property
    def image_library(self):
        """The MPICH-ABI library mpi4py finds first in the image (or None)."""
        mpich = self.scan.mpich
        return mpich[0].path if mpich else None

    def env_file(self):
        """The MPI env file, after Apptainer's ``99-base.sh`` (None: ``none`` mode)."""
        if not self.active:
            return None
        own = (
            f"the image's own MPI ({self.image_library})"
            if self.image_library
            else "no MPI library (the image has none of its own)"
        )
        default = computed_default(name=RUNTIME_VAR, expression="$_cl_default")
        # The mode the container asks for (its own value, else the host's export).
        wanted = read_host_value(
            name=RUNTIME_VAR, into="_cl_mpi", default="$_cl_default"
        )
        reads = ""
        if self.binding is not None:
            lib, path = self.binding.defaults(self.found)
            path = shlex.quote(":".join(path))
            reads = [
                read_host_value(name=HOST_PATH_VAR, into="_cl_new", default=path),
                read_host_value(
                    name=HOST_LIBMPI_VAR, into="_cl_lib", default=shlex.quote(lib)
                ),
                f"{HOST_LIBMPI_VAR}=$_cl_lib; export {HOST_LIBMPI_VAR}\n",
            ]
            reads = "\n".join(reads)
        host = _host_case(binding=self.binding, own=own)
        other = f" is not host, container or none; using {own}."
        other = _say(f"cotainr-lumi: {RUNTIME_VAR}=", "$_cl_mpi", other)
        shown = printable(own)
        return f"""\
# cotainr-lumi MPI settings (lumi-env stage, mpi={self.mode}): which
# libmpi.so.12 the image's MPI users (mpi4py, ...) load.
# {RUNTIME_VAR}=host: LUMI's Cray MPICH, bound in by the module file;
# {RUNTIME_VAR}=container (or none): {shown}.
_cl_default={self.mode}
{default}
{wanted}
{reads}case "$_cl_mpi" in
{host}
container | none) {ACTIVE_VAR}=$_cl_mpi ;;
*)
    {other}
    {ACTIVE_VAR}=container ;;
esac
export {ACTIVE_VAR}
unset _cl_mpi _cl_env _cl_default _cl_new _cl_lib
"""

    def binds(self):
        """The binds the module file adds (none in ``none`` mode)."""
        if not (self.active and self.binding):
            return []
        lacking = [b for b, own in self.absent.items() if own is None]
        return [*self.binding.binds, *lacking]

    def module_ops(self, *, image):
        """The module file's MPI operations (its binds come with the others)."""
        ops = []
        if self.active and self.binding:
            which = f"uses {self.binding.libmpi} (lumi-env.mpi-host)"
            if self.binding.discover:
                which = (
                    "finds LUMI's Cray MPICH on load: a loaded cray-mpich-abi or "
                    "cray-mpich, else the default PE's (docs/mpi.md). Cray MPICH 8.1 "
                    "(MPICH 3.4) and 9.0 (MPICH 4.1) share sonames, not libraries: "
                    "the one found is used"
                )
            default = ""
            if self.mode == "host":
                default = " (the image's default)"
            text = (
                f"MPI (lumi-env mpi={self.mode}) for {image}: this module {which}. "
                f"Its libmpi.so.12 replaces the image's when {RUNTIME_VAR}=host"
                f"{default} ({HOST_LIBMPI_VAR}, {HOST_PATH_VAR}: LD_LIBRARY_PATH "
                f"first; MPI4PY_LIBMPI). export {RUNTIME_VAR}=container keeps the "
                f"image's MPICH. Launch: {SRUN_HINT['host']}; image's MPICH: "
                f"{SRUN_HINT['container']}."
            )
            # Never break a path: paths in the comment are searched for and copied.
            lines = textwrap.wrap(
                text, 76, break_on_hyphens=False, break_long_words=False
            )
            ops += [Comment(line) for line in lines]
            say = "problem" if self.mode == "host" else "quiet"  # the line to show
            command = shlex.join(self.binding.command())
            ops.append(Discover(command, say, HOST_LIBMPI_VAR, HOST_PATH_VAR))
        if self.mode == "container":  # as lumi-aif-singularity-bindings does
            ops += [
                Comment(f"{SRUN_HINT['container']}: srun's default here."),
                PushEnv("SLURM_MPI_TYPE", "pmi2"),
            ]
        return ops

    def check_loaded(self, *, text, stage):
        """Read :data:`LOAD_CHECK`'s answer from the start check's output."""
        self.loaded = parse_load_check(text)
        if "error" in self.loaded and self.scan.mpich:
            raise StageError(
                f"mpi4py {self.scan.mpi4py.get('version') or ''} cannot load the "
                f"image's MPI library {self.image_library}: {self.loaded['error']}. "
                "Check that mpi4py and the MPI library come from the same pip step "
                "or base image (packages: [mpich, mpi4py])",
                stage=stage,
            )

    def record(self):
        """The JSON record kept in the image."""
        return {
            "mode": self.mode,
            "requested": self.requested,
            "reason": self.reason,
            "runtime-switch": RUNTIME_VAR,
            "image-library": self.image_library,
            "host": None if self.binding is None else self._host_record(),
            "srun": SRUN_HINT,
            "loaded-at-build": self.loaded,
            **self.scan.to_dict(),
        }

    def _host_record(self):
        lib, path = self.binding.defaults(self.found)
        version = self.found.version
        return {
            "setting": self.binding.libmpi,
            "libmpi": lib or None,
            "ld-library-path": path,
            "mpi4py-libmpi": lib or f"${HOST_LIBMPI_VAR}",
            "binds": self.binds(),
            "binds-if-absent": self.absent,
            "gpu-aware-caveat": self.gpu_caveat,
            "source": self.found.source,
            "version": version,
            "line": version and ".".join(version.split(".")[:2]),
            "build-host-problem": self.found.problem,
        }

    def launch_hint(self):
        """How to launch MPI ranks on LUMI in this mode."""
        hint = SRUN_HINT.get(self.mode, "srun")
        if self.mode == "host":
            hint += f"; with {RUNTIME_VAR}=container: {SRUN_HINT['container']}"
        return hint

    def summary(self):
        """One line for the build log."""
        if not self.active:
            return f"MPI: none ({self.reason})"
        text = f"MPI: {self.mode} ({self.reason})"
        if self.loaded and "libmpi" in self.loaded:
            text += f"; mpi4py loads {', '.join(self.loaded['libmpi'])} here"
        if self.binding is not None:
            which = "" if self.mode == "host" else f" with {RUNTIME_VAR}=host"
            lib = self.binding.defaults(self.found)[0] or "the Cray MPICH found on load"
            text += f"; on LUMI {lib} replaces it{which}"
            if self.binding.discover and self.found.libmpi:
                text += f" (found here: {self.found.source}, {self.found.version})"
        return text


def _scan(*, root, target):
    """:func:`.mpiscan.scan_mpi` of the image (its target env's, when known)."""
    if target is None:
        return scan_mpi(root=root, prefixes=[])
    return scan_mpi(
        root=root,
        prefixes=target.env_prefixes,
        site_dirs=target.site,
        python=target.python,
    )


def _check_pins(*, scan, requested, mode, stage):
    """Stop a host-mode build whose MPI users pin the image's library; warn else."""
    if not scan.pins:
        return
    if mode == "host":
        setting = mode if requested == mode else f"{requested} -> {mode}"
        raise StageError(
            f"MPI users run on the host's MPICH here (lumi-env.mpi: {setting}), but "
            f"{_pin_text(scan.pins)}. Install it from pip without an RPATH (mpi4py's "
            "wheel, not conda's mpi4py, which pins conda's MPICH); for a package you "
            "build, link with a RUNPATH instead (env: {LDFLAGS: -Wl,--enable-new-dtags} "
            "in its pip step) or without -Wl,-rpath; or keep the image's MPICH: "
            "--set lumi-env.mpi=container",
            stage=stage,
        )
    if mode == "container":
        logger.warning(
            "MPI: %s; fine with the image's MPICH (the default here), but "
            "COTAINR_LUMI_MPI=host would not reach it",
            _pin_text(scan.pins),
        )


def plan_mpi(*, root, target, requested, host_setting, stage, libfabric="host"):
    """
    Find the image's MPI and decide what the build does about it.

    With ``libfabric="image"`` (the image has its own libfabric), Cray MPICH
    runs on the image's libfabric: the host's ``/libfabric/`` directories are
    left out of the binding.
    """
    binding = HostBinding.from_setting(host_setting)
    if binding and libfabric == "image":
        binding = binding.without_host_libfabric()
    if requested == "none":  # the image is not read
        return MpiPlan(requested, "none", "lumi-env.mpi is none", binding, MpiScan())
    found = binding.find_here() if binding else HostMpi()
    scan = _scan(root=root, target=target)
    try:
        mode, reason = resolve_mode(requested=requested, scan=scan, binding=binding)
    except ValueError as e:
        raise StageError(str(e), stage=stage) from None
    if mode == "host":
        check_host_paths(binding=binding, error=lambda m: StageError(m, stage=stage))
    _check_pins(scan=scan, requested=requested, mode=mode, stage=stage)
    return MpiPlan(
        requested,
        mode,
        reason,
        binding,
        scan,
        found=found,
        absent=absent_binds(binding=binding, root=root),
        gpu_caveat=_gpu_caveat(binding=binding, target=target),
    )


def _gpu_caveat(*, binding, target):
    """:func:`gpu_aware_caveat` of an image with a host binding (logged)."""
    if binding is None or target is None:
        return None
    caveat = gpu_aware_caveat(target.image.rocm_version)
    if caveat:
        logger.warning("MPI: %s", caveat)
    return caveat


def describe(*, requested, host_setting):
    """Dry-run lines about MPI."""
    binding = HostBinding.from_setting(host_setting)
    lines = [
        f"MPI (lumi-env.mpi={requested}): auto is none without an MPICH-ABI "
        f"{MPICH_ABI} in the image, container when its MPICH speaks CXI, host "
        f"otherwise; {RUNTIME_VAR}=container|host|none at run time"
    ]
    if binding is not None:
        lines.append(
            f"  host: {binding.libmpi}; LD_LIBRARY_PATH first "
            f"{':'.join(binding.ld_library_path)}; MPI4PY_LIBMPI; binds "
            f"{','.join(binding.binds) or '(none)'}"
        )
        found = binding.find_here()
        here = f"{found.libmpi} ({found.source}, {found.version})"
        lines.append(f"  here: {found.problem or here}")
        lines += [f"  problem: {problem}" for problem in binding.host_problems()]
    return lines
