"""The settings of the lumi-env stage, declared once."""

from dataclasses import dataclass
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

from ...engine.settings import SettingError, StageSettings, each, setting
from ...errors import SECRET_NAME_RE, InputError, redact
from ...imagelayout import USER_SOFTWARE_DIR
from .mpi import check_host_binding, check_mode
from .network import AWS_OFI_RCCL_DIRS, check_gdr_level, check_libfabric
from .validators import (
    CONTAINER_ROOT,
    MODULE_DIR,
    check_module_name,
    check_text,
    check_var_name,
    text_problem,
    validate_bind,
    validate_name,
    validate_path_entry,
    validate_value,
    var_name_of,
)


def _directory(rule):
    """The check of a directory setting: `rule`, then room for the module files."""

    def check(value):
        if not value:
            return
        try:
            directory = Path(value).expanduser()
        except RuntimeError as e:  # ~nosuchuser
            raise ValueError(f"{value!r}: {e}") from None
        ancestor = Path(check_text(str(directory), **rule))
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        why = f"cannot create {directory}: " if ancestor != directory else ""
        if not ancestor.is_dir():
            is_not = "is" if why else "exists and is"
            raise ValueError(f"{why}{ancestor} {is_not} not a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ValueError(f"{why}{ancestor} is not writable")

    return check


def _check_env(env):
    for name, value in env.items():
        try:
            validate_name(name)
            if value is not None:
                validate_value(name=name, value=value)
        except ValueError as e:
            raise SettingError(str(e), path=(name,)) from None


def _check_user_venv(value):
    if (
        not value.startswith(USER_SOFTWARE_DIR + "/")
        or text_problem(value, what="")
        or "/../" in value + "/"
    ):
        raise ValueError(
            f"must be a path below {USER_SOFTWARE_DIR}/ without ',', ':', '..' or "
            f"white space (got {value!r})"
        )


def _entries(name):
    return each(lambda entry: validate_path_entry(name=name, entry=entry))


class ModuleNames(NamedTuple):
    """What the module is called and sets up (paths None with module-file: false)."""

    name: str
    var: str  # the suffix of SIF<VAR>, RUNSCRIPTS<VAR>, EBROOT<VAR>
    user_venv: str
    lua: Optional[Path]
    shell: Optional[Path]
    root: Optional[Path]  # CONTAINERROOT on the host


@dataclass(frozen=True)
class LumiEnvSettings(StageSettings):
    """The settings of the lumi-env stage."""

    env: dict[str, Any] = setting(
        {},
        doc="variables set as defaults in the image (null: not set)",
        check=_check_env,
    )
    allow_secret_env: list[str] = setting(
        [], doc="names in env that may hold secrets (kept in the image in clear)"
    )
    miopen_cache: bool = setting(
        True, doc="the MIOpen user DB and cache on node-local /tmp"
    )
    jit_caches: bool = setting(
        True, doc="Triton, TorchInductor and torch extension caches per job on /tmp"
    )
    rocm_paths: bool = setting(
        True, doc="add the ROCm and aws-ofi-rccl paths the base image lacks"
    )
    path: list[str] = setting(
        [], doc="directories added to PATH", check=_entries("PATH")
    )
    ld_library_path: list[str] = setting(
        [],
        doc="directories added to LD_LIBRARY_PATH",
        check=_entries("LD_LIBRARY_PATH"),
    )
    runscripts: bool = setting(True, doc="the LUMI runscripts in /runscripts, on PATH")
    with_conda: bool = setting(
        True, doc="$WITH_CONDA activates the image's env (LUMI EasyBuild modules)"
    )
    binds: list[str] = setting(
        [],
        doc="bind mounts, set by the module file and shell snippet",
        check=each(validate_bind),
    )
    module_file: bool = setting(True, doc="write an Lmod module file and shell snippet")
    module_dir: Optional[str] = setting(
        None,
        doc="where the module file goes (null: next to the image)",
        check=_directory(MODULE_DIR),
    )
    module_name: Optional[str] = setting(
        None, doc="the module's name (null: the image's)", check=check_module_name
    )
    module_var_name: Optional[str] = setting(
        None,
        doc="NAME of SIF<NAME>, RUNSCRIPTS<NAME> (null: from the module name)",
        check=check_var_name,
    )
    container_root: Optional[str] = setting(
        None,
        doc="CONTAINERROOT on the host (null: NAME.root next to the image)",
        check=_directory(CONTAINER_ROOT),
    )
    user_venv: Optional[str] = setting(
        None,
        doc=f"the user venv (null: {USER_SOFTWARE_DIR}/venv/<name>)",
        check=_check_user_venv,
    )
    mpi: str = setting(
        "auto",
        doc="the MPI the image's MPI users run on: container (the image's MPICH), "
        "host (LUMI's Cray MPICH, bound in at run time), none, or auto (none "
        "without MPI, container when the image's MPICH speaks CXI, else host); "
        "COTAINR_LUMI_MPI overrides it at run time",
        check=check_mode,
    )
    mpi_host: dict[str, Any] = setting(
        {},
        doc="the host binding of the base family: libmpi (Cray MPICH's "
        "lib-abi-mpich/libmpi.so.12), ld-library-path, binds",
        check=check_host_binding,
    )
    libfabric: str = setting(
        "auto",
        doc="whose libfabric the network plugin uses: host (Cray's, bound at run "
        "time), image (the image's own, with CXI) or auto (image when the "
        "plugin's libfabric.so.1 resolves in the image, else host)",
        check=check_libfabric,
    )
    host_libfabric_binds: list[str] = setting(
        [],
        doc="binds the host's libfabric needs (when libfabric is host)",
        check=each(validate_bind),
    )
    net_plugin_dirs: list[str] = setting(
        list(AWS_OFI_RCCL_DIRS),
        doc="where RCCL's network plugin (librccl-net.so, librccl-net-NAME.so) "
        "may be, first match wins",
        check=_entries("net-plugin-dirs"),
    )
    nccl_net_gdr_level: Optional[Union[str, int]] = setting(
        "3",
        doc="NCCL_NET_GDR_LEVEL conda-python-distributed sets when the user "
        "sets none (null: never set it)",
        check=check_gdr_level,
    )
    rccl_tests: Optional[str] = setting(
        None,
        doc="the directory of rccl-tests (all_reduce_perf ...) in the image",
        check=lambda value: validate_path_entry(name="rccl-tests", entry=value),
    )

    def __post_init__(self):
        """One error for the env values that look like secrets and are not allowed."""
        names = [
            name
            for name, value in self.env.items()
            if value is not None
            and name not in self.allow_secret_env
            and (SECRET_NAME_RE.search(name) or redact(value) != str(value))
        ]
        if names:
            raise InputError(
                f"lumi-env: {', '.join(names)} would keep a secret in the image's env "
                "(a name with TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL or APIKEY, "
                "or ending in _KEY; a URL with a password), readable by everyone who "
                "can read the image. Pass it at run time instead: export "
                f"SINGULARITYENV_{names[0]}=... (or APPTAINERENV_{names[0]}=...) "
                "before singularity exec; for the build only, give it to the pip "
                "step's env (recorded as ***). To keep it in the image anyway: --set "
                f"lumi-env.allow-secret-env=[{','.join(names)}]."
            )

    def names(self, *, image_path):
        """The :class:`ModuleNames` of an image, as set or derived from its path."""
        image_path = Path(image_path)
        name = self.module_name or image_path.stem
        var = self.module_var_name or var_name_of(name)
        venv = self.user_venv or f"{USER_SOFTWARE_DIR}/venv/{var.lower()}"
        if not self.module_file:
            return ModuleNames(name, var, venv, None, None, None)
        folder = image_path.parent
        if self.module_dir:
            folder = Path(self.module_dir).expanduser().resolve()
        root = image_path.parent.resolve() / f"{name}.root"
        if self.container_root:
            root = Path(self.container_root).expanduser().resolve()
        return ModuleNames(
            name, var, venv, folder / f"{name}.lua", folder / f"{name}.sh", root
        )
