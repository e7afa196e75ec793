"""
The lumi-env stage: LUMI runtime settings, runscripts, binds and module file.

Into the image: the env file (profile variables as defaults, MIOpen cache,
ROCm and network plugin paths, ``/runscripts`` on ``PATH``, ``WITH_CONDA``),
the runscripts, ``with-conda.sh``, the MPI env file and record (:mod:`.mpi`),
and labels. Next to the image (``report.host_files``, written by the driver):
an Lmod module file, a shell snippet and ``CONTAINERROOT``, for the binds a
SIF cannot hold.
"""

import json
import shlex

from ... import imagelayout
from ...engine.rootfs import write_file_in_root
from ...engine.stage import HostFiles, Stage, StageReport
from ...errors import InputError, StageError
from ...imagelayout import LUMI_ENV_FILE as ENV_FILE
from ...imagelayout import MPI_ENV_FILE, MPI_FILE, RUNSCRIPTS_DIR, USER_SOFTWARE_DIR
from ...processes import CommandError
from . import entrypoint, imagefiles, network
from .envfile import render_env_file
from .imagefiles import RUNSCRIPTS
from .modulefile import (
    LayerBase,
    image_has_user_software,
    module_outputs,
    wrapper_names,
)
from .mpi import LOAD_CHECK, HostBinding, check_host_paths, plan_mpi
from .mpi import describe as describe_mpi
from .settings import LumiEnvSettings
from .validators import CONTAINER_ROOT, MODULE_DIR, check_module_name, check_text


class LumiEnvStage(Stage):
    """Inject LUMI runtime settings, runscripts and bind information."""

    name = "lumi-env"
    settings_class = LumiEnvSettings

    def __init__(self, *, settings=None):
        super().__init__(settings=settings)
        if self.settings.mpi == "host":
            # Asked for: a host library missing here stops the plan.
            check_host_paths(
                binding=HostBinding.from_setting(self.settings.mpi_host),
                error=InputError,
            )

    @property
    def env(self):
        """The variables set as defaults (``None`` values dropped)."""
        return {k: v for k, v in self.settings.env.items() if v is not None}

    def planned_outputs(self, *, build):
        """The module file, shell snippet and CONTAINERROOT; derived names checked."""
        names = self.settings.names(image_path=build.image_path)
        if names.lua is None:
            return []
        try:
            check_module_name(names.name)
            check_text(str(names.lua.parent), **MODULE_DIR)
            check_text(str(names.root), **CONTAINER_ROOT)
        except ValueError as e:
            raise InputError(
                f"lumi-env: {e}. Rename the image, or set the name or place with "
                "--set lumi-env.module-name=NAME, lumi-env.module-dir=DIR or "
                "lumi-env.container-root=DIR (or --set lumi-env.module-file=false)."
            ) from None
        return [names.lua, names.shell, names.root]

    def _run_hint(self, *, names, image_path, mpi, binds, base=None):
        """The command to run the image on LUMI (`base`: the image is its layer)."""
        entry = "conda-python-distributed" if self.settings.runscripts else "python"
        bind_opt = f"-B {shlex.quote(','.join(binds))} " if binds else ""
        lines = ["Run the image on LUMI with:"]
        if names.lua is not None:
            lines.append(
                f"  module use {shlex.quote(str(names.lua.parent))}; "
                f"module load {shlex.quote(names.name)}; "
                f'srun singularity exec "$SIF" {entry} your_script.py'
            )
            lines.append("or, without the module:")
        image = shlex.quote(str(image_path))
        if base:
            image = f"--overlay {image}:ro {shlex.quote(base.path)}"
        lines.append(
            f"  srun singularity exec {bind_opt}{image} {entry} your_script.py"
        )
        if mpi.active:
            lines.append(f"MPI ({mpi.mode}): launch ranks with {mpi.launch_hint()}")
        return "\n".join(lines)

    def describe(self, *, build):
        """Describe the env file, runscripts, binds and module file."""
        lines = imagefiles.describe_env_file(settings=self.settings)
        if self.settings.runscripts:
            lines.append(
                f"runscripts in {RUNSCRIPTS_DIR} (on PATH): {', '.join(RUNSCRIPTS)}"
            )
        binds = ",".join(self.settings.binds)
        lines.append(f"label cotainr-lumi.binds={binds or '(none)'}")
        lines += describe_mpi(
            requested=self.settings.mpi, host_setting=self.settings.mpi_host
        )
        names = self.settings.names(image_path=build.image_path)
        if names.lua is None:
            return [*lines, "no module file (module-file: false)"]
        return [
            *lines,
            f"module file {names.lua}, shell snippet {names.shell}",
            f"  SIF, SIF{names.var}, CONTAINERROOT={names.root} (bin/: start-shell, "
            "list-packages, make-squashfs, unmake-squashfs, wrappers of the env's "
            "python, pip, torchrun, ... (those it has); runscripts/; user-software/ "
            f"mounted at {USER_SOFTWARE_DIR}), RUNSCRIPTS, EBROOT{names.var}",
            f"  user venv {names.user_venv} "
            "(source /runscripts/init-conda-venv; active when present)",
        ]

    def run(self, *, context):
        """Write the env file, runscripts and with-conda.sh; report the outputs."""
        root = context.sandbox.root
        image_path = context.build.image_path
        libfabric, mpi, binds = self._network_and_mpi(context=context)
        names = self.settings.names(image_path=image_path)
        user_software = not image_has_user_software(root=root)
        record = self._write_image_files(
            context=context, mpi=mpi, binds=binds, names=names, libfabric=libfabric
        )
        record["runtime"] = network.write_runtime_record(
            settings=self.settings, root=root, binds=binds, libfabric=libfabric
        )
        self._check_in_sandbox(context=context, mpi=mpi)
        wrappers = None
        if names.lua is not None:  # (no probe for them without a module file)
            wrappers = wrapper_names(root=root, target=context.target_env)

        def host_files(base=None):  # (`base`: of the layer on that base)
            files = module_outputs(
                settings=self.settings,
                names=names,
                image_path=image_path,
                binds=binds,
                user_software=user_software,
                mpi=mpi,
                wrappers=wrappers,
                base=base,
            )
            hint = self._run_hint(
                names=names, image_path=image_path, mpi=mpi, binds=binds, base=base
            )
            return HostFiles(files=files, run_hint=hint)

        module = host_files()
        record |= {
            "mpi": mpi.record(),
            "module-files": [],
            "container-root": None,
            "host-files": sorted(str(p) for p in module.files),
        }
        summary = f"{len(self.env)} variables in {ENV_FILE}"
        if self.settings.runscripts:
            summary += f", runscripts in {RUNSCRIPTS_DIR}"
        if module.files:
            record["module-files"] = [str(names.lua), str(names.shell)]
            record["container-root"] = str(names.root)
            summary += f", module file {names.lua}"
        layer = None
        if context.build.layer_only:  # used if the layer is kept
            layer = host_files(LayerBase.of(context.build.base_image))
        return StageReport(
            name=self.name,
            summary=f"{summary}; {mpi.summary()}",
            record=record,
            labels=self._labels(binds=binds, mpi=mpi, record=record),
            host_files=module,
            layer_host_files=layer,
        )

    def _network_and_mpi(self, *, context):
        """The network family (decided from the image), the MPI plan and the binds."""
        root = context.sandbox.root
        libfabric = network.decide_libfabric(
            settings=self.settings,
            root=root,
            image_ld_path=lambda: (
                context.target_env and context.target_env.image.ld_library_path
            ),
        )
        mpi = plan_mpi(
            root=root,
            # No probe when MPI is off (lumi-env.mpi: none).
            target=context.target_env if self.settings.mpi != "none" else None,
            requested=self.settings.mpi,
            host_setting=self.settings.mpi_host,
            libfabric=libfabric,
            stage=self.name,
        )
        own = self.settings.host_libfabric_binds if libfabric == "host" else []
        binds = list(dict.fromkeys([*self.settings.binds, *own, *mpi.binds()]))
        return libfabric, mpi, binds

    def _labels(self, *, binds, mpi, record):
        """The image labels of the stage."""
        labels = {
            imagelayout.LABEL_BINDS: ",".join(binds),
            imagelayout.LABEL_ENV_FILE: ENV_FILE,
            imagelayout.LABEL_ENV: ",".join(self.env),
            imagelayout.LABEL_MPI: mpi.mode,
            imagelayout.LABEL_MPI_RECORD: MPI_FILE,
            imagelayout.LABEL_RUNTIME: imagelayout.RUNTIME_FILE,
        }
        entry = record["oci-entrypoint"]
        if entry:
            labels[imagelayout.LABEL_OCI_ENTRYPOINT] = entry
        if self.settings.runscripts:
            labels[imagelayout.LABEL_RUNSCRIPTS] = RUNSCRIPTS_DIR
        return labels

    def _write_image_files(self, *, context, mpi, binds, names, libfabric):
        """Write the env files, with-conda.sh and runscripts; the report's details."""
        root = context.sandbox.root
        target = None
        env_prefix = None
        if self.settings.with_conda:
            # The build's one probe of the image (never `python` on PATH).
            target = context.target_env
            env_prefix = imagefiles.write_with_conda(root=root, target=target)
        blocks, found = imagefiles.env_file_blocks(
            settings=self.settings,
            root=root,
            target=target,
            user_venv=names.user_venv,
            libfabric=libfabric,
        )
        header = (
            "cotainr-lumi LUMI runtime settings (lumi-env stage).\n"
            "Every value is a default: export NAME (or APPTAINERENV_NAME) to override it."
        )
        content = render_env_file(header=header, blocks=blocks)
        write_file_in_root(root=root, path=ENV_FILE, content=content)
        entry = entrypoint.write_entrypoint_env(root=root)
        runscripts = []
        if self.settings.runscripts:
            imagefiles.write_runscripts(root=root)
            runscripts = [f"{RUNSCRIPTS_DIR}/{n}" for n in RUNSCRIPTS]
        if mpi.active:
            write_file_in_root(root=root, path=MPI_ENV_FILE, content=mpi.env_file())
        return {
            "env-file": ENV_FILE,
            "oci-entrypoint": entry,
            "env": dict(self.env),
            "search-paths": found,
            "python-prefix": env_prefix,
            "runscripts": runscripts,
            "binds": binds,
            "user-venv": names.user_venv,
        }

    def _check_in_sandbox(self, *, context, mpi):
        """One start of the container: the env file works, mpi4py loads its MPI."""
        script = 'printf "ok\\n"'
        if self.settings.runscripts:
            script = "command -v get-master >/dev/null && " + script
        args = ["bash", "-c", script]
        python = getattr(context.target_env, "python", None) if mpi.active else None
        load_check = python and mpi.scan.mpi4py  # with :data:`.mpi.LOAD_CHECK`
        if load_check:
            args = ["bash", "-c", script + ' && { "$1" -c "$2" || true; }']
            args += ["check", python, LOAD_CHECK]
        try:
            proc = context.sandbox.run(args)
        except CommandError as e:
            raise StageError(
                f"the container does not start with the generated {ENV_FILE}",
                stage=self.name,
                details=e.error_lines(),
            ) from e
        stdout = proc.stdout or ""
        stderr = proc.stderr or ""
        if "ok" not in stdout:
            raise StageError(
                f"the container did not run a command with the generated {ENV_FILE}",
                stage=self.name,
                details=stderr[-2000:],
            )
        if load_check:
            mpi.check_loaded(text=f"{stdout}\n{stderr}", stage=self.name)
        record = json.dumps(mpi.record(), indent=2) + "\n"
        write_file_in_root(root=context.sandbox.root, path=MPI_FILE, content=record)
