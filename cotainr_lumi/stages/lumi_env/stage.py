"""
The lumi-env stage: LUMI runtime settings, runscripts, binds and module file.

The hand-built LUMI images get their runtime setup from baked Docker ``ENV``
lines and an EasyBuild module. This stage puts into the image what can live
there and describes, next to the image, what cannot (bind mounts):

- ``/.singularity.d/env/93-cotainr-lumi-env.sh`` (sourced after cotainr's
  ``92-cotainr-env.sh``): the profile's environment variables as *defaults*
  (a host ``export`` or ``APPTAINERENV_NAME``/``SINGULARITYENV_NAME`` wins),
  the MIOpen cache on node-local ``/tmp``, ROCm and aws-ofi-rccl search path
  entries when missing, ``/runscripts`` on ``PATH`` and ``WITH_CONDA``.
- ``/runscripts/{conda-python-simple,conda-python-distributed,get-master,
  init-user-venv}``.
- ``/opt/cotainr-lumi/with-conda.sh``: what ``$WITH_CONDA`` runs (activates
  the image's Python environment; a no-op when it is active).
- Labels ``cotainr-lumi.binds``, ``cotainr-lumi.env-file``,
  ``cotainr-lumi.env``, ``cotainr-lumi.runscripts``.
- MPI (:mod:`.mpi`): which ``libmpi.so.12`` the image's MPI users run on,
  the image's MPICH or LUMI's Cray MPICH bound in at run time
  (``/.singularity.d/env/99-cotainr-lumi-mpi.sh``, the record
  ``/opt/cotainr-lumi/mpi.json``, labels ``cotainr-lumi.mpi``,
  ``cotainr-lumi.mpi.record``, the binds in the module file).
- Next to the image (``report.outputs``, written by the pipeline once the
  image is in place): an Lmod module file
  ``NAME.lua`` and a shell snippet ``NAME.sh`` setting ``SIF``,
  ``SINGULARITY_BIND``, ``RUNSCRIPTS`` and ``SINGULARITYENV_PREPEND_PATH``.
"""

import importlib.resources
import json
import logging
from pathlib import Path, PurePosixPath
import shlex

from ... import _cotainr, imagelayout
from ..._version import __version__
from ...engine.rootfs import resolve_in_root, write_file_in_root
from ...engine.stage import Stage, StageReport, register_stage
from ...errors import InputError, StageError
from ...imagelayout import LABEL_MPI, LABEL_MPI_RECORD, MPI_ENV_FILE, MPI_FILE
from . import network
from .envfile import (
    EnvError,
    default_assignments,
    forced_assignment,
    path_addition,
    private_dir_defaults,
    render_env_file,
    validate_name,
)
from .modulefile import (
    MARKER,
    check_image_path,
    render_lua,
    render_shell,
)
from .mpi import HostBinding, check_host_paths, plan_mpi
from .mpi import describe as describe_mpi
from .settings import (
    USER_SOFTWARE,
    LumiEnvSettings,
    module_dir_problem,
    module_name_problem,
    root_path_problem,
)

__all__ = ["LumiEnvStage"]

logger = logging.getLogger(f"cotainr.{__name__}")

#: The env file in the image (after cotainr's 92-cotainr-env.sh).
ENV_FILE = "/.singularity.d/env/93-cotainr-lumi-env.sh"
#: Where the runscripts go in the image.
RUNSCRIPTS_DIR = "/runscripts"
#: The runscripts shipped in ``cotainr_lumi/runscripts/``.
RUNSCRIPTS = (
    "conda-python-simple",
    "conda-python-distributed",
    "get-master",
    "init-conda-venv",
    "init-user-venv",
)
#: The host commands in ``$CONTAINERROOT/bin`` (``cotainr_lumi/.../hostscripts/``).
HOST_COMMANDS = ("make-squashfs", "unmake-squashfs", "start-shell")
#: The script ``$WITH_CONDA`` sources.
WITH_CONDA_FILE = "/opt/cotainr-lumi/with-conda.sh"
#: The value of ``WITH_CONDA`` (works as ``$WITH_CONDA`` and ``eval``).
WITH_CONDA_VALUE = f". {WITH_CONDA_FILE}"
#: The comment above the base image's own ``$WITH_CONDA`` in with-conda.sh.
BASE_WITH_CONDA_MARK = "# The base image's $WITH_CONDA, kept (run first):"

#: ROCm directories added to the search paths when present in the image.
ROCM_ROOT = "/opt/rocm"

#: The MIOpen cache directory, computed at run time (the one value of the env
#: file that is not a literal). Node-local /tmp, per user, made private (see
#: envfile.private_dir_defaults). Host variables such as $USER or $SLURM_NODEID
#: are hidden from Apptainer env scripts, so the user name comes from `id`;
#: its output is not evaluated (double quotes).
MIOPEN_CACHE_PATH = "/tmp/$(id -un 2>/dev/null || id -u)-miopen-cache"


def _lines(lines):
    """`lines` as text, each ended by a newline ("" for none)."""
    return "".join(f"{line}\n" for line in lines)


def _runscript_text(name):
    """The text of a shipped runscript."""
    return (importlib.resources.files(__package__) / "runscripts" / name).read_text()


def _host_copy(text, *, what):
    """`text` (a script) with the output marker after its first line."""
    first, _, rest = text.partition("\n")
    return f"{first}\n# {what}, {MARKER} {__version__}.\n{rest}"


def _host_command_text(name, *, image, root):
    """A host command of ``$CONTAINERROOT/bin`` for this image."""
    body = (importlib.resources.files(__package__) / "hostscripts" / name).read_text()
    return (
        f"#!/bin/bash\n# {name}: {MARKER} {__version__} for {image}.\n"
        f"default_sif={shlex.quote(str(image))}\n"
        f"default_root={shlex.quote(str(root))}\n{body}"
    )


#: The user venv's site-packages ahead of PYTHONPATH (POSIX sh, inside the
#: activation's ``if``). An image env exposed through PYTHONPATH (the LUMI AI
#: Factory images' /opt/venv) comes before every venv's own site-packages in
#: sys.path, so a package the user installs again (a newer transformers) would
#: stay hidden behind the image's copy. Only when PYTHONPATH is set: without
#: it the venv's site-packages already come first.
_USER_VENV_SITE_FIRST = """\
    if [ -n "${PYTHONPATH-}" ]; then
        for _cl_site in "${COTAINR_LUMI_USER_VENV}"/lib/python*/site-packages; do
            case ":${PYTHONPATH}:" in
                *:"${_cl_site}":*) ;;
                *) if [ -d "${_cl_site}" ]; then PYTHONPATH="${_cl_site}:${PYTHONPATH}"; export PYTHONPATH; fi ;;
            esac
        done
        unset _cl_site
    fi
"""

#: The user venv's activation, after the image's env (POSIX sh).
_USER_VENV_BLOCK = (
    """\
# The user venv in /user-software (LUST's layout; the module mounts
# $CONTAINERROOT/user-software there): active when present.
if [ -n "${COTAINR_LUMI_USER_VENV-}" ] && [ -x "${COTAINR_LUMI_USER_VENV}/bin/python" ]; then
    case ":${PATH-}:" in
        *:"${COTAINR_LUMI_USER_VENV}/bin":*) ;;
        *) PATH="${COTAINR_LUMI_USER_VENV}/bin${PATH:+:$PATH}"; export PATH ;;
    esac
    VIRTUAL_ENV=$COTAINR_LUMI_USER_VENV; export VIRTUAL_ENV
"""
    + _USER_VENV_SITE_FIRST
    + "fi"
)

#: Appended to with-conda.sh: the user venv comes first again after the
#: image's env was (re)activated.
_WITH_CONDA_USER_VENV = (
    """\
# Then the user venv in /user-software, when present (source
# /runscripts/init-conda-venv creates it).
if [ -n "${COTAINR_LUMI_USER_VENV-}" ] && [ -x "${COTAINR_LUMI_USER_VENV}/bin/python" ]; then
    VIRTUAL_ENV=$COTAINR_LUMI_USER_VENV
    PATH="$VIRTUAL_ENV/bin${PATH:+:$PATH}"
    export VIRTUAL_ENV PATH
"""
    + _USER_VENV_SITE_FIRST
    + "fi\n"
)


@register_stage
class LumiEnvStage(Stage):
    """Inject LUMI runtime settings, runscripts and bind information."""

    name = "lumi-env"
    settings_class = LumiEnvSettings

    def __init__(self, *, settings=None):
        super().__init__(settings=settings)
        if self.settings.mpi == "host":
            # Asked for explicitly: a host library missing on this (LUMI)
            # host stops the plan, before anything is built.
            check_host_paths(
                binding=HostBinding.from_setting(self.settings.mpi_host),
                error=InputError,
            )

    @classmethod
    def add_arguments(cls, *, parser):
        """Add ``--env`` (the rest of lumi-env is ``--set lumi-env.KEY=VALUE``)."""
        parser.add_argument(
            "--env",
            dest="lumi_env_set",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="lumi-env: set a default environment variable in the image "
            "(overridable at run time; repeatable)",
        )

    @classmethod
    def settings_from_args(cls, *, args):
        """Turn ``--env`` into settings."""
        env = {}
        for text in getattr(args, "lumi_env_set", None) or []:
            name, sep, value = text.partition("=")
            if not sep:
                raise InputError(
                    f"--env {text!r}: expected NAME=VALUE (to drop a profile "
                    "default: --set 'lumi-env.env={NAME: null}')"
                )
            try:
                validate_name(name)
            except EnvError as e:
                raise InputError(f"--env {text!r}: {e}") from None
            env[name] = value
        return {"env": env} if env else {}

    # ------------------------------------------------------------------ helpers
    @property
    def env(self):
        """The variables set as defaults (``None`` values dropped)."""
        return {k: v for k, v in self.settings.env.items() if v is not None}

    def planned_outputs(self, *, plan):
        """
        The module file, shell snippet and CONTAINERROOT this build writes.

        The names derived from the image path are checked here, as the given
        ones are when the settings are read.
        """
        names = self.settings.names(image_path=plan.image_path)
        if names.lua is None:
            return []
        name, root = names.name, names.root
        fix = (
            "Rename the image, or set the name or place with --set "
            "lumi-env.module-name=NAME, lumi-env.module-dir=DIR or "
            "lumi-env.container-root=DIR (or --set lumi-env.module-file=false)."
        )
        problem = module_name_problem(name)
        if problem:
            raise InputError(f"lumi-env: the module name {name!r} {problem}. {fix}")
        for what, problem in (
            ("module directory", module_dir_problem(str(names.lua.parent))),
            ("CONTAINERROOT", root_path_problem(str(root))),
        ):
            if problem:
                raise InputError(f"lumi-env: the {what} {problem}. {fix}")
        return [names.lua, names.shell, root]

    def run_hint(self, *, image_path, mpi=None):
        """The command to run the image on LUMI."""
        entry = "conda-python-distributed" if self.settings.runscripts else "python"
        binds = ",".join(self._binds(mpi=mpi))
        bind_opt = f"-B {shlex.quote(binds)} " if binds else ""
        lines = ["Run the image on LUMI with:"]
        names = self.settings.names(image_path=image_path)
        if names.lua is not None:
            lines.append(
                f"  module use {shlex.quote(str(names.lua.parent))}; "
                f"module load {shlex.quote(names.name)}; "
                f'srun singularity exec "$SIF" {entry} your_script.py'
            )
            lines.append("or, without the module:")
        lines.append(
            f"  srun singularity exec {bind_opt}{shlex.quote(str(image_path))} "
            f"{entry} your_script.py"
        )
        if mpi is not None and mpi.active:
            lines.append(f"MPI ({mpi.mode}): launch ranks with {mpi.launch_hint()}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ plan
    def describe(self, *, plan):
        """Describe the env file, runscripts, binds and module file."""
        lines = [f"env file {ENV_FILE} (defaults, overridable at run time):"]
        for name, value in self.env.items():
            lines.append(f"  {name}={shlex.quote(str(value))}")
        dropped = [k for k, v in self.settings.env.items() if v is None]
        if dropped:
            lines.append(f"  not set: {', '.join(dropped)}")
        if self.settings.miopen_cache:
            lines.append(
                "  MIOPEN_USER_DB_PATH, MIOPEN_CUSTOM_CACHE_DIR="
                "/tmp/$(id -un)-miopen-cache (at run time, if private to the user)"
            )
        if self.settings.rocm_paths:
            lines.append(
                f"  ROCM_PATH, PATH += {ROCM_ROOT}/bin, LD_LIBRARY_PATH += "
                f"{ROCM_ROOT}/lib (when in the image and missing)"
            )
        lines += [
            f"  {line}" for line in network.describe_lines(settings=self.settings)
        ]
        for var, entries in (
            ("PATH", self.settings.path),
            ("LD_LIBRARY_PATH", self.settings.ld_library_path),
        ):
            if entries:
                lines.append(f"  {var} += {':'.join(entries)}")
        if self.settings.with_conda:
            lines.append(f"  WITH_CONDA={shlex.quote(WITH_CONDA_VALUE)}")
        if self.settings.runscripts:
            lines.append(
                f"runscripts in {RUNSCRIPTS_DIR} (on PATH): {', '.join(RUNSCRIPTS)}"
            )
        binds = ",".join(self.settings.binds)
        lines.append(f"label cotainr-lumi.binds={binds or '(none)'}")
        lines += describe_mpi(
            requested=self.settings.mpi, host_setting=self.settings.mpi_host
        )
        names = self.settings.names(image_path=plan.image_path)
        if names.lua is not None:
            lines.append(f"module file {names.lua}, shell snippet {names.shell}")
            var = names.var
            lines.append(
                f"  SIF, SIF{var}, CONTAINERROOT={names.root} (bin/: start-shell, "
                "make-squashfs, unmake-squashfs; runscripts/; user-software/ "
                f"mounted at {USER_SOFTWARE}), RUNSCRIPTS, EBROOT{var}"
            )
            lines.append(
                f"  user venv {names.user_venv} "
                "(source /runscripts/init-conda-venv; active when present)"
            )
        else:
            lines.append("no module file (module-file: false)")
        return lines

    # ------------------------------------------------------------------ run
    @staticmethod
    def _base_with_conda(*, root, target):
        """
        The base image's own ``$WITH_CONDA`` command (None when it had none).

        A base built by cotainr-lumi has ours (``. with-conda.sh``): then the
        command that file chained to is kept, so rebuilding never makes the
        script source itself.
        """
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

    @staticmethod
    def _activation(*, root, target):
        """Shell code activating the target env (conda, a venv, or PATH)."""
        prefix = target.prefix
        bin_dir = target.bin_dir
        conda_exe = target.image.conda_exe
        if target.image.conda_prefix == prefix and conda_exe.startswith("/"):
            conda_sh = PurePosixPath(conda_exe).parent.parent / "etc/profile.d/conda.sh"
            if resolve_in_root(root=root, path=conda_sh).is_file():
                return (
                    f". {shlex.quote(str(conda_sh))} && "
                    f"conda activate {shlex.quote(prefix)}"
                )
        if resolve_in_root(root=root, path=f"{bin_dir}/activate").is_file():
            return f". {shlex.quote(bin_dir + '/activate')}"
        return f'PATH={shlex.quote(bin_dir)}"${{PATH:+:$PATH}}"; export PATH'

    def _with_conda_script(self, *, root, target, base_with_conda=None):
        """The content of with-conda.sh for the target environment (or None)."""
        lines = [
            "# with-conda.sh: activate the image's Python environment. Installed by",
            "# cotainr-lumi; WITH_CONDA is '. /opt/cotainr-lumi/with-conda.sh', so",
            "# `$WITH_CONDA; python ...` (as in the LUMI EasyBuild modules) works. A",
            "# no-op when the environment is already active (the image's env files",
            "# activate it at container start).",
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
            f"    *) {self._activation(root=root, target=target)} ;;",
            "esac",
        ]
        return "\n".join(lines) + "\n", target.prefix

    @staticmethod
    def _note_replaced_runscript(*, root, name):
        """Say so when a base image's own runscript (not ours) is replaced."""
        existing = resolve_in_root(root=root, path=f"{RUNSCRIPTS_DIR}/{name}")
        if not existing.is_file():
            return
        try:
            text = existing.read_text(errors="replace")
        except OSError:
            text = ""
        if text != _runscript_text(name):
            logger.info(
                "Replacing the base image's %s/%s with cotainr-lumi's",
                RUNSCRIPTS_DIR,
                name,
            )

    def _search_path_blocks(self, *, root):
        """PATH/LD_LIBRARY_PATH additions and what was found."""
        blocks, found = [], {}
        if self.settings.rocm_paths:
            rocm = resolve_in_root(root=root, path=ROCM_ROOT)
            if rocm.is_dir():
                found["rocm"] = ROCM_ROOT
                blocks.append(default_assignments({"ROCM_PATH": ROCM_ROOT}))
                if (rocm / "bin").is_dir():
                    blocks.append(
                        path_addition(name="PATH", entries=[f"{ROCM_ROOT}/bin"])
                    )
                if (rocm / "lib").is_dir():
                    blocks.append(
                        path_addition(
                            name="LD_LIBRARY_PATH", entries=[f"{ROCM_ROOT}/lib"]
                        )
                    )
            # RCCL's network plugin, where the image family keeps it.
            plugin = self._find_plugin(root=root)
            if plugin is None:
                hint = network.family_hint(
                    root=lambda path: resolve_in_root(root=root, path=path),
                    settings=self.settings,
                )
                if hint:
                    logger.warning("The system may not fit this base image: %s.", hint)
            if plugin is not None:
                found[plugin["generation"]] = plugin["dir"]
                if not network.is_default_loader_dir(plugin["dir"]):
                    blocks.append(
                        path_addition(name="LD_LIBRARY_PATH", entries=[plugin["dir"]])
                    )
                blocks += network.plugin_name_blocks(plugin=plugin)
        if self.settings.path:
            blocks.append(path_addition(name="PATH", entries=self.settings.path))
        if self.settings.ld_library_path:
            blocks.append(
                path_addition(
                    name="LD_LIBRARY_PATH", entries=self.settings.ld_library_path
                )
            )
        return blocks, found

    # -- the image family's network layer (network.py) -------------------------
    def _find_plugin(self, *, root):
        """RCCL's network plugin in the profile's directories (None: none)."""
        return network.find_plugin(
            root=lambda path: resolve_in_root(root=root, path=path),
            dirs=self.settings.net_plugin_dirs,
            named=self.settings.env.get("NCCL_NET_PLUGIN"),
        )

    def _network_blocks(self):
        """Env file blocks: the GDR default of the runscript, rccl-tests."""
        return ["# The network layer of this image family."] + network.env_blocks(
            settings=self.settings
        )

    def _write_runtime_record(self, *, root, binds):
        """Record the network layer for verify; return the record."""
        tests = self.settings.rccl_tests
        record = network.runtime_record(
            settings=self.settings,
            plugin=self._find_plugin(root=root),
            binds=binds,
            rccl_tests_found=bool(
                tests and resolve_in_root(root=root, path=tests).is_dir()
            ),
        )
        if tests and not record["rccl-tests-found"]:
            logger.warning(
                "The profile says rccl-tests are in %s, but the image has no such "
                "directory.",
                tests,
            )
        write_file_in_root(
            root=root,
            path=imagelayout.RUNTIME_FILE,
            content=json.dumps(record, indent=2, sort_keys=True) + "\n",
        )
        return record

    def _write_with_conda(self, *, root, target):
        """Write with-conda.sh; return the env it activates (None: none)."""
        script, env_prefix = self._with_conda_script(
            root=root,
            target=target,
            base_with_conda=self._base_with_conda(root=root, target=target),
        )
        write_file_in_root(
            root=root,
            path=WITH_CONDA_FILE,
            content=script + _WITH_CONDA_USER_VENV,
            mode=0o644,
        )
        return env_prefix

    def _env_file_blocks(self, *, root, target, user_venv):
        """The blocks of the env file, and the search paths found in the image."""
        blocks = [
            "# Profile and build settings (defaults: a variable already set wins).",
            default_assignments(self.env),
        ]
        if self.settings.miopen_cache:
            blocks += [
                "# MIOpen caches on node-local /tmp, private to the user.",
                private_dir_defaults(
                    names=("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR"),
                    path=MIOPEN_CACHE_PATH,
                ),
            ]
        path_blocks, found = self._search_path_blocks(root=root)
        if path_blocks:
            blocks += ["# Search paths (entries added only when missing)."]
            blocks += path_blocks
        blocks += self._network_blocks()
        if self.settings.runscripts:
            blocks.append(path_addition(name="PATH", entries=[RUNSCRIPTS_DIR]))
        if self.settings.with_conda:
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
                path_addition(
                    name="PATH", entries=[target.bin_dir], position="prepend"
                ),
            ]
        blocks += [
            "# LUST's user-software workflow: the user venv (init-conda-venv).",
            default_assignments({"COTAINR_LUMI_USER_VENV": user_venv}),
            _USER_VENV_BLOCK,
        ]
        return blocks, found

    def _write_runscripts(self, *, root):
        """The runscripts, in place of the base image's own of the same name."""
        for name in RUNSCRIPTS:
            self._note_replaced_runscript(root=root, name=name)
            write_file_in_root(
                root=root,
                path=f"{RUNSCRIPTS_DIR}/{name}",
                content=_runscript_text(name),
                mode=0o755,
            )

    def _binds(self, *, mpi=None):
        """The binds the module file sets: the profile's, then MPI's."""
        extra = mpi.binds() if mpi is not None else []
        return list(dict.fromkeys([*self.settings.binds, *extra]))

    def _module_outputs(self, *, image_path, user_venv, user_software, mpi=None):
        """The module file, shell snippet and CONTAINERROOT files (host outputs)."""
        names = self.settings.names(image_path=image_path)
        paths = (names.lua, names.shell) if names.lua is not None else None
        if paths is not None:
            try:
                check_image_path(image_path)
            except ValueError as e:
                logger.warning("Not writing a module file: %s", e)
                paths = None
        if paths is None:
            return None, None, {}
        container_root = names.root
        common = dict(
            image=image_path,
            binds=self._binds(mpi=mpi),
            runscripts=RUNSCRIPTS_DIR if self.settings.runscripts else None,
            name=names.name,
            var=names.var,
            container_root=container_root,
            user_software=user_software,
        )
        image = str(image_path)
        outputs = {
            str(paths[0]): render_lua(**common) + _lines(mpi.lua_lines(image=image)),
            str(paths[1]): render_shell(**common)
            + _lines(mpi.shell_lines(image=image)),
        }
        outputs.update(
            self._container_root_files(
                root=container_root, image_path=image_path, user_venv=user_venv
            )
        )
        return paths, container_root, outputs

    def run(self, *, context):
        """Write the env file, runscripts and with-conda.sh; report the outputs."""
        sandbox = context.sandbox
        root = sandbox.root
        image_path = Path(context.plan.image_path)
        # The build's one probe of the image (never `python` on PATH).
        target = context.target_env if self.settings.with_conda else None
        mpi = self._plan_mpi(context=context)
        env_prefix = None
        if self.settings.with_conda:
            env_prefix = self._write_with_conda(root=root, target=target)
        user_venv = self.settings.names(image_path=image_path).user_venv
        user_software = not self._image_has_user_software(root=root)
        blocks, found = self._env_file_blocks(
            root=root, target=target, user_venv=user_venv
        )
        header = (
            "cotainr-lumi LUMI runtime settings (lumi-env stage).\n"
            "Every value is a default: export NAME (or APPTAINERENV_NAME) to override it."
        )
        write_file_in_root(
            root=root,
            path=ENV_FILE,
            content=render_env_file(header=header, blocks=blocks),
        )
        if self.settings.runscripts:
            self._write_runscripts(root=root)
        mpi.write_env_file(root=root, path=MPI_ENV_FILE)
        runtime = self._write_runtime_record(root=root, binds=self._binds(mpi=mpi))
        self._check_in_sandbox(sandbox=sandbox)
        self._check_mpi(context=context, mpi=mpi)
        paths, container_root, outputs = self._module_outputs(
            image_path=image_path,
            user_venv=user_venv,
            user_software=user_software,
            mpi=mpi,
        )
        details = {
            "env-file": ENV_FILE,
            "env": dict(self.env),
            "search-paths": found,
            "python-prefix": env_prefix,
            "runscripts": [f"{RUNSCRIPTS_DIR}/{n}" for n in RUNSCRIPTS]
            if self.settings.runscripts
            else [],
            "binds": self._binds(mpi=mpi),
            "mpi": mpi.record(),
            "module-files": sorted(str(p) for p in (paths or ())),
            "container-root": str(container_root) if container_root else None,
            "user-venv": user_venv,
            "host-files": sorted(outputs),
            "run-hint": self.run_hint(image_path=image_path, mpi=mpi),
            "runtime": runtime,
        }
        return self._report(details=details, outputs=outputs, paths=paths, mpi=mpi)

    def _plan_mpi(self, *, context):
        """The build's MPI decision (:mod:`.mpi`): the image's MPI, the mode."""
        return plan_mpi(
            root=context.sandbox.root,
            # No probe when MPI is off (lumi-env.mpi: none).
            target=context.target_env if self.settings.mpi != "none" else None,
            requested=self.settings.mpi,
            host_setting=self.settings.mpi_host,
            stage=self.name,
        )

    def _check_mpi(self, *, context, mpi):
        """Run mpi4py once in the container; record the image's MPI."""
        target = context.target_env if mpi.active else None
        mpi.check_in_sandbox(
            sandbox=context.sandbox,
            python=target.python if target is not None else None,
            stage=self.name,
        )
        write_file_in_root(
            root=context.sandbox.root,
            path=MPI_FILE,
            content=json.dumps(mpi.record(), indent=2) + "\n",
        )

    def _report(self, *, details, outputs, paths, mpi):
        """The stage report: summary and labels."""
        labels = {
            "cotainr-lumi.binds": ",".join(self._binds(mpi=mpi)),
            "cotainr-lumi.env-file": ENV_FILE,
            "cotainr-lumi.env": ",".join(self.env),
            LABEL_MPI: mpi.mode,
            LABEL_MPI_RECORD: MPI_FILE,
            imagelayout.LABEL_RUNTIME: imagelayout.RUNTIME_FILE,
        }
        summary = f"{len(self.env)} variables in {ENV_FILE}"
        if self.settings.runscripts:
            labels["cotainr-lumi.runscripts"] = RUNSCRIPTS_DIR
            summary += f", runscripts in {RUNSCRIPTS_DIR}"
        if outputs:
            summary += f", module file {paths[0]}"
        summary += f"; {mpi.summary()}"
        return StageReport(
            name=self.name,
            summary=summary,
            details=details,
            labels=labels,
            outputs=outputs,
        )

    @staticmethod
    def _image_has_user_software(*, root):
        """Whether the image itself has content in /user-software."""
        path = resolve_in_root(root=root, path=USER_SOFTWARE)
        if path.is_dir() and any(path.iterdir()):
            logger.warning(
                "The image has its own %s (e.g. the base image's venv); the "
                "module will not mount $CONTAINERROOT/user-software over it, so "
                "the user-software workflow (init-conda-venv, make-squashfs) is "
                "off for this image. Install more packages with a pip step instead.",
                USER_SOFTWARE,
            )
            return True
        return False

    def _container_root_files(self, *, root, image_path, user_venv):
        """CONTAINERROOT's files: host commands, runscripts, user-software."""
        files = {
            str(root / "bin" / name): _host_command_text(
                name, image=image_path, root=root
            )
            for name in HOST_COMMANDS
        }
        if self.settings.runscripts:
            for name in RUNSCRIPTS:
                files[str(root / "runscripts" / name)] = _host_copy(
                    _runscript_text(name),
                    what=f"Host copy of {RUNSCRIPTS_DIR}/{name} (edit a copy)",
                )
        files[str(root / "user-software" / "README.cotainr-lumi")] = (
            f"{MARKER} {__version__} for {image_path}.\n"
            f"This directory is mounted at {USER_SOFTWARE} by the module.\n"
            f"In the container, `source /runscripts/init-conda-venv` creates and\n"
            f"activates the venv {user_venv} on top of the image's Python\n"
            "environment; `pip install` then installs here. `make-squashfs` packs\n"
            "this directory into ../user-software.squashfs (reload the module).\n"
        )
        return files

    def _check_in_sandbox(self, *, sandbox):
        """Start the container once so a broken env file fails the build."""
        script = 'printf "ok\\n"'
        if self.settings.runscripts:
            script = "command -v get-master >/dev/null && " + script
        try:
            proc = sandbox.run(["bash", "-c", script])
        except _cotainr.CommandError as e:
            raise StageError(
                f"the container does not start with the generated {ENV_FILE}",
                stage=self.name,
                details=e.error_lines(),
            ) from e
        if "ok" not in (proc.stdout or ""):
            raise StageError(
                f"the container did not run a command with the generated {ENV_FILE}",
                stage=self.name,
                details=(proc.stderr or "")[-2000:],
            )
