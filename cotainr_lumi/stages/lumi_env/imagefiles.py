"""What the lumi-env stage writes into the image: env file, with-conda.sh, runscripts."""

import importlib.resources
import logging
from pathlib import PurePosixPath
import shlex

from ...engine.rootfs import resolve_in_root, write_file_in_root
from ...imagelayout import LUMI_ENV_FILE, RUNSCRIPTS_DIR, WITH_CONDA_FILE
from . import network
from .envfile import (
    default_assignments,
    forced_assignment,
    path_addition,
    private_dir_defaults,
    read_host_value,
)

logger = logging.getLogger(f"cotainr.{__name__}")

#: The runscripts shipped in ``cotainr_lumi/runscripts/``.
RUNSCRIPTS = tuple(
    "conda-python-simple conda-python-distributed get-master init-conda-venv "
    "init-user-venv".split()
)
#: The value of ``WITH_CONDA`` (works as ``$WITH_CONDA`` and ``eval``).
WITH_CONDA_VALUE = f". {WITH_CONDA_FILE}"
#: The comment above the base image's own ``$WITH_CONDA`` in with-conda.sh.
BASE_WITH_CONDA_MARK = "# The base image's $WITH_CONDA, kept (run first):"

ROCM_ROOT = "/opt/rocm"

#: The MIOpen cache on node-local /tmp, per user, computed at run time ($USER
#: is hidden from Apptainer env scripts; the output of `id` is not evaluated).
MIOPEN_CACHE_PATH = "/tmp/$(id -un 2>/dev/null || id -u)-miopen-cache"
#: The JIT compilers' caches, per job (LUMI-AI-Guide#112: not in $HOME or on
#: Lustre): each variable gets its own private directory on node-local /tmp.
JIT_CACHES = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TORCH_EXTENSIONS_DIR": "torch-extensions",
}
JIT_CACHE_PATH = "/tmp/$(id -un 2>/dev/null || id -u)-job${_cl_job}-NAME-cache"
#: The job's number for those names (the host's SLURM_JOB_ID; digits only).
_READ_JOB = read_host_value(name="SLURM_JOB_ID", into="_cl_job", default="none")
_READ_JOB += "\ncase $_cl_job in '' | *[!0-9]*) _cl_job=none ;; esac"


def runscript_text(name):
    """The text of a shipped runscript."""
    return (importlib.resources.files(__package__) / "runscripts" / name).read_text()


_IF_USER_VENV = """\
if [ -n "${COTAINR_LUMI_USER_VENV-}" ] && [ -x "${COTAINR_LUMI_USER_VENV}/bin/python" ]; then
"""
#: Then VIRTUAL_ENV, and the venv's site-packages ahead of an image env on
#: PYTHONPATH (the AI Factory images' /opt/venv), which would hide them.
_USER_VENV_REST = """\
    VIRTUAL_ENV=$COTAINR_LUMI_USER_VENV; export VIRTUAL_ENV
    if [ -n "${PYTHONPATH-}" ]; then
        for _cl_site in "${COTAINR_LUMI_USER_VENV}"/lib/python*/site-packages; do
            case ":${PYTHONPATH}:" in
                *:"${_cl_site}":*) ;;
                *) if [ -d "${_cl_site}" ]; then PYTHONPATH="${_cl_site}:${PYTHONPATH}"; export PYTHONPATH; fi ;;
            esac
        done
        unset _cl_site
    fi
fi"""

#: The user venv's activation, after the image's env (POSIX sh).
_USER_VENV_BLOCK = (
    "# The user venv in /user-software (LUST's layout; the module mounts\n"
    "# $CONTAINERROOT/user-software there): active when present.\n"
    + _IF_USER_VENV
    + """\
    case ":${PATH-}:" in
        *:"${COTAINR_LUMI_USER_VENV}/bin":*) ;;
        *) PATH="${COTAINR_LUMI_USER_VENV}/bin${PATH:+:$PATH}"; export PATH ;;
    esac
"""
    + _USER_VENV_REST
)

#: Appended to with-conda.sh: the user venv first again after the image's env.
_WITH_CONDA_USER_VENV = (
    "# Then the user venv in /user-software, when present (source\n"
    "# /runscripts/init-conda-venv creates it).\n"
    + _IF_USER_VENV
    + '    PATH="$COTAINR_LUMI_USER_VENV/bin${PATH:+:$PATH}"; export PATH\n'
    + _USER_VENV_REST
    + "\n"
)


def base_with_conda(*, root, target):
    """The base image's own ``$WITH_CONDA`` command (None when it had none)."""
    # Ours (a base built by cotainr-lumi): the command it chained to.
    value = target.with_conda if target is not None else None
    if not value or not value.strip():
        return None
    if value.strip() != WITH_CONDA_VALUE:
        return value
    existing = resolve_in_root(root=root, path=WITH_CONDA_FILE)
    try:
        lines = existing.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines[:-1]):
        if line == BASE_WITH_CONDA_MARK:
            # ``eval '<command>'``; a multi-line command spans lines.
            words = shlex.shlex("\n".join(lines[i + 1 :]), posix=True)
            words.whitespace_split = True
            try:
                if words.get_token() == "eval":
                    return words.get_token()
            except ValueError:
                return None
    return None


def _activation(*, root, target):
    """Shell code activating the target env (conda, a venv, or PATH)."""
    bin_dir = target.bin_dir
    conda_exe = target.image.conda_exe
    if target.image.conda_prefix == target.prefix and conda_exe.startswith("/"):
        conda_sh = PurePosixPath(conda_exe).parent.parent / "etc/profile.d/conda.sh"
        if resolve_in_root(root=root, path=conda_sh).is_file():
            return (
                f". {shlex.quote(str(conda_sh))} && "
                f"conda activate {shlex.quote(target.prefix)}"
            )
    if resolve_in_root(root=root, path=f"{bin_dir}/activate").is_file():
        return f". {shlex.quote(bin_dir + '/activate')}"
    return f'PATH={shlex.quote(bin_dir)}"${{PATH:+:$PATH}}"; export PATH'


def with_conda_script(*, root, target, base_with_conda=None):
    """The content of with-conda.sh for the target env, and its prefix (or None)."""
    lines = [
        "# with-conda.sh (cotainr-lumi): `$WITH_CONDA; python ...` activates the",
        "# image's Python environment, as with the LUMI EasyBuild modules (a no-op",
        "# when it is active, as the image's env files make it at start).",
    ]
    if base_with_conda:
        # Chain to the base image's command: it keeps activating the same
        # env (which now holds the new packages) with all its side effects.
        lines += [BASE_WITH_CONDA_MARK, f"eval {shlex.quote(base_with_conda)}"]
    if target is None or not target.prefix.startswith("/"):
        lines.append(": # the image has no Python environment to activate")
        return "\n".join(lines) + "\n", None
    lines += [
        'case ":${PATH-}:" in',
        f"    *:{shlex.quote(target.bin_dir)}:*) ;;",
        f"    *) {_activation(root=root, target=target)} ;;",
        "esac",
    ]
    return "\n".join(lines) + "\n", target.prefix


def write_with_conda(*, root, target):
    """Write with-conda.sh; return the env it activates (None: none)."""
    script, env_prefix = with_conda_script(
        root=root,
        target=target,
        base_with_conda=base_with_conda(root=root, target=target),
    )
    write_file_in_root(
        root=root, path=WITH_CONDA_FILE, content=script + _WITH_CONDA_USER_VENV
    )
    return env_prefix


def _rocm_blocks(*, root, found):
    """ROCM_PATH and the ROCm search path entries the image has."""
    rocm = resolve_in_root(root=root, path=ROCM_ROOT)
    if not rocm.is_dir():
        return []
    found["rocm"] = ROCM_ROOT
    blocks = [default_assignments({"ROCM_PATH": ROCM_ROOT})]
    for name, sub in (("PATH", "bin"), ("LD_LIBRARY_PATH", "lib")):
        if (rocm / sub).is_dir():
            blocks.append(path_addition(name=name, entries=[f"{ROCM_ROOT}/{sub}"]))
    return blocks


def _cache_blocks(*, settings):
    """MIOpen's and the JIT caches on node-local /tmp, private to the user."""
    caches = []
    if settings.miopen_cache:
        names = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")
        caches.append((names, MIOPEN_CACHE_PATH))
    if settings.jit_caches:
        caches += [
            ((n,), JIT_CACHE_PATH.replace("NAME", d)) for n, d in JIT_CACHES.items()
        ]
    if not caches:
        return []
    return [
        "# Caches on node-local /tmp, private to the user (JIT caches per job).",
        _READ_JOB if settings.jit_caches else "",
        private_dir_defaults(groups=caches),
        "unset _cl_job _cl_env",
    ]


def env_file_blocks(*, settings, root, target, user_venv, libfabric):
    """The blocks of the env file, and the search paths found in the image."""
    blocks = [
        "# Profile and build settings (defaults: a variable already set wins).",
        default_assignments(settings.env),
    ]
    blocks += _cache_blocks(settings=settings)
    found = {}
    path_blocks = []
    if settings.rocm_paths:
        path_blocks += _rocm_blocks(root=root, found=found)
        path_blocks += network.plugin_blocks(settings=settings, root=root, found=found)
    for name, entries in (
        ("PATH", settings.path),
        ("LD_LIBRARY_PATH", settings.ld_library_path),
    ):
        if entries:
            path_blocks.append(path_addition(name=name, entries=entries))
    if path_blocks:
        blocks += ["# Search paths (entries added only when missing).", *path_blocks]
    blocks += ["# The network layer of this image family."]
    blocks += network.env_blocks(settings=settings, libfabric=libfabric)
    if settings.runscripts:
        blocks.append(path_addition(name="PATH", entries=[RUNSCRIPTS_DIR]))
    if settings.with_conda:
        # Set unconditionally: a WITH_CONDA left on the host by a LUMI
        # EasyBuild module names another image's conda and would break
        # this one. APPTAINERENV_WITH_CONDA still overrides it.
        blocks += [
            "# LUMI EasyBuild compatibility: `$WITH_CONDA; python ...`.",
            forced_assignment(name="WITH_CONDA", value=WITH_CONDA_VALUE),
        ]
    if target is not None and target.prefix.startswith("/"):
        # Active from the container's start, as LUST's modules make it
        # through SINGULARITYENV_* (a base that activates it only through
        # $WITH_CONDA would otherwise start with conda base or /usr/bin).
        blocks += [
            "# The image's Python environment, active from the start.",
            path_addition(name="PATH", entries=[target.bin_dir], position="prepend"),
        ]
    blocks += [
        "# LUST's user-software workflow: the user venv (init-conda-venv).",
        default_assignments({"COTAINR_LUMI_USER_VENV": user_venv}),
        _USER_VENV_BLOCK,
    ]
    return blocks, found


def _variable_lines(env):
    """The profile's variables: those set, then those dropped (null)."""
    lines = [f"  {k}={shlex.quote(str(v))}" for k, v in env.items() if v is not None]
    dropped = [k for k, v in env.items() if v is None]
    if dropped:
        lines.append(f"  not set: {', '.join(dropped)}")
    return lines


def describe_env_file(*, settings):
    """The dry run's lines about the env file (:func:`env_file_blocks`)."""
    lines = [f"env file {LUMI_ENV_FILE} (defaults, overridable at run time):"]
    lines += _variable_lines(settings.env)
    private = "(at run time, if private to the user)"
    optional = [
        (
            settings.miopen_cache,
            "  MIOPEN_USER_DB_PATH, MIOPEN_CUSTOM_CACHE_DIR="
            f"/tmp/$(id -un)-miopen-cache {private}",
        ),
        (
            settings.jit_caches,
            f"  {', '.join(JIT_CACHES)}=/tmp/$(id -un)-job$SLURM_JOB_ID-NAME-cache "
            + private,
        ),
        (
            settings.rocm_paths,
            f"  ROCM_PATH, PATH += {ROCM_ROOT}/bin, LD_LIBRARY_PATH += "
            f"{ROCM_ROOT}/lib (when in the image and missing)",
        ),
    ]
    lines += [text for wanted, text in optional if wanted]
    lines += [f"  {line}" for line in network.describe_lines(settings=settings)]
    paths = [("PATH", settings.path), ("LD_LIBRARY_PATH", settings.ld_library_path)]
    lines += [f"  {var} += {':'.join(e)}" for var, e in paths if e]
    if settings.with_conda:
        lines.append(f"  WITH_CONDA={shlex.quote(WITH_CONDA_VALUE)}")
    return lines


def write_runscripts(*, root):
    """The runscripts, in place of the base image's own of the same name."""
    for name in RUNSCRIPTS:
        path = f"{RUNSCRIPTS_DIR}/{name}"
        existing = resolve_in_root(root=root, path=path)
        text = runscript_text(name)
        if existing.is_file() and existing.read_text(errors="replace") != text:
            logger.info("Replacing the base image's %s with cotainr-lumi's", path)
        write_file_in_root(root=root, path=path, content=text, mode=0o755)
