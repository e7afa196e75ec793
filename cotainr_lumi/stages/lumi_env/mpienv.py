"""
The MPI env file and module file operations.

The env file decides at container start which ``libmpi.so.12`` the image's
MPI users load: the mode is ``COTAINR_LUMI_MPI`` (set in the container, else
a host export found in ``$__exported_env__``, else the build's default). In
``host`` mode, when the host library is in the container, the binding's
directories go first on ``LD_LIBRARY_PATH`` and ``MPI4PY_LIBMPI`` names it
(mpi4py 4 looks in its env's ``lib/`` first); otherwise one line on stderr
says so and the image's MPI stays. ``COTAINR_LUMI_MPI_ACTIVE`` says what was
applied.
"""

import logging
import shlex
import textwrap

from .envfile import computed_default, printable

logger = logging.getLogger(f"cotainr.{__name__}")

#: The run-time switch.
RUNTIME_VAR = "COTAINR_LUMI_MPI"
#: The host library's path in the container (set by the env file).
HOST_LIBMPI_VAR = "COTAINR_LUMI_MPI_HOST_LIBMPI"
#: What the env file applied.
ACTIVE_VAR = "COTAINR_LUMI_MPI_ACTIVE"
#: How to launch MPI ranks on LUMI, per mode (LUMI docs, container-jobs.md;
#: cotainr's examples/LUMI/conda_mpi4py_mpich/README.md).
SRUN_HINT = {
    "host": "srun (LUMI's default --mpi=cray_shasta: Cray PMI for Cray MPICH)",
    "container": "srun --mpi=pmi2 (the image's MPICH uses PMI-2)",
}

#: srun's default for --mpi (set to pmi2 by the module file and snippet of an
#: image that uses its own MPICH, as lumi-aif-singularity-bindings does).
SLURM_MPI_VAR = "SLURM_MPI_TYPE"

#: The mode the container asks for (its own value, else the host's export).
_READ_MODE = f"""\
if [ -n "${{{RUNTIME_VAR}+x}}" ]; then
    _cl_mpi=${RUNTIME_VAR}
else
    _cl_env="
${{__exported_env__-}}"
    case "$_cl_env" in
    *"
{RUNTIME_VAR}="*)
        _cl_mpi=${{_cl_env##*"
{RUNTIME_VAR}="}}
        _cl_mpi=${{_cl_mpi%%"
"*}} ;;
    *) _cl_mpi=$_cl_default ;;
    esac
fi"""

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


def _say(*parts):
    """Shell code printing one line on stderr."""
    words = [f'"{p}"' if p.startswith("$") else shlex.quote(p) for p in parts]
    return f"printf '{'%s' * len(words)}\\n' {' '.join(words)} >&2"


def _host_case(*, binding, own):
    """The ``host)`` branch of the mode's ``case``."""
    if binding is None:
        return [
            "host)",
            "    "
            + _say(
                f"cotainr-lumi: {RUNTIME_VAR}=host, but this image has no host MPI "
                f"binding (lumi-env.mpi-host); using {own}."
            ),
            f"    {ACTIVE_VAR}=container ;;",
        ]
    return [
        "host)",
        f'    if [ -f "${HOST_LIBMPI_VAR}" ]; then',
        f"        _cl_new={shlex.quote(':'.join(binding.ld_library_path))}",
        *("        " + line for line in _MOVE_TO_FRONT.splitlines()),
        "        "
        + computed_default(name="MPI4PY_LIBMPI", expression=f'"${HOST_LIBMPI_VAR}"'),
        f"        {ACTIVE_VAR}=host",
        "    else",
        "        "
        + _say(
            f"cotainr-lumi: {RUNTIME_VAR}=host, but ",
            f"${HOST_LIBMPI_VAR}",
            " is not in the container (load the image's module file, or source "
            f"its .sh, to bind LUMI's Cray MPICH); using {own}. Export "
            f"{RUNTIME_VAR}=container to choose that.",
        ),
        f"        {ACTIVE_VAR}=container",
        "    fi ;;",
    ]


def env_file(*, mode, binding, image_library):
    """The MPI env file (after Apptainer's ``99-base.sh``, so it sees ``--env``)."""
    own = (
        f"the image's own MPI ({image_library})"
        if image_library
        else "no MPI library (the image has none of its own)"
    )
    lines = [
        f"# cotainr-lumi MPI settings (lumi-env stage, mpi={mode}): which",
        "# libmpi.so.12 the image's MPI users (mpi4py, ...) load.",
        f"# {RUNTIME_VAR}=host: LUMI's Cray MPICH, bound in by the module file;",
        f"# {RUNTIME_VAR}=container (or none): {printable(own)}.",
        f"_cl_default={shlex.quote(mode)}",
        computed_default(name=RUNTIME_VAR, expression="$_cl_default"),
        _READ_MODE,
    ]
    if binding is not None:
        lines.append(
            f"{HOST_LIBMPI_VAR}={shlex.quote(binding.libmpi)}; export {HOST_LIBMPI_VAR}"
        )
    lines += [
        'case "$_cl_mpi" in',
        *_host_case(binding=binding, own=own),
        f"container | none) {ACTIVE_VAR}=$_cl_mpi ;;",
        "*)",
        "    "
        + _say(
            f"cotainr-lumi: {RUNTIME_VAR}=",
            "$_cl_mpi",
            f" is not host, container or none; using {own}.",
        ),
        f"    {ACTIVE_VAR}=container ;;",
        "esac",
        f"export {ACTIVE_VAR}",
        "unset _cl_mpi _cl_env _cl_default _cl_new",
    ]
    return "\n".join(lines) + "\n"


def module_ops(*, mode, binding, image):
    """The module file's MPI operations (its binds come with the others)."""
    ops = []
    if binding is not None:
        text = (
            f"MPI (lumi-env mpi={mode}): these binds bring LUMI's Cray MPICH into "
            f"the container; there {binding.libmpi} replaces the image's "
            f"libmpi.so.12 when {RUNTIME_VAR}=host"
            + (" (the image's default)" if mode == "host" else "")
            + f" (LD_LIBRARY_PATH first: {':'.join(binding.ld_library_path)}; "
            f"MPI4PY_LIBMPI). export {RUNTIME_VAR}=container keeps the image's "
            f"MPICH. Launch: {SRUN_HINT['host']}; image's MPICH: "
            f"{SRUN_HINT['container']}."
        )
        ops += [("comment", line) for line in textwrap.wrap(text, 76)]
    if mode == "container":
        ops += [
            ("comment", f"{SRUN_HINT['container']}: srun's default here."),
            ("pushenv", SLURM_MPI_VAR, "pmi2"),
        ]
    host_path = (
        binding.host_path(binding.libmpi) if binding and mode == "host" else None
    )
    if host_path:
        text = (
            f"cotainr-lumi: {host_path} (LUMI's Cray MPICH for {image}) is not on "
            "this system, so MPI in the container falls back to the image's own "
            f"MPICH. Rebuild with an updated lumi-env.mpi-host, or export "
            f"{RUNTIME_VAR}=container."
        )
        ops.append(("warn_missing", host_path, text))
    return ops
