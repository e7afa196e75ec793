"""
The input of the ``pip`` stage: ordered pip steps, as settings or a file.

The stage settings are the input format, the same in a system profile, the
Python API and a steps file (``--pip-steps FILE``, paths relative to it;
elsewhere relative to the current directory); their keys are declared, with
their docs, in :class:`StepSettings` and :class:`PipSettings`. A step given as
a string is ``{requirements: FILE}``.
"""

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
import functools
import os
from pathlib import Path
import re
from typing import Any, Optional

from packaging.utils import canonicalize_name

from ...engine.origins import FileOrigin
from ...engine.settings import (
    SettingError,
    StageSettings,
    convert,
    load_settings,
    read_declared,
    setting,
)
from ...engine.yamlfile import LineDict, read_yaml
from ...errors import InputError, redact, redact_env
from .requirements import is_remote_url

_INTO_ENV = "packages must go into the image's Python environment"
_EDITABLE = "editable installs cannot work in an image; install a copy instead"
#: pip options a step may not pass in ``pip-args``, with the reason.
FORBIDDEN_PIP_ARGS = {
    "-r": "list requirement files under 'requirements' (their local references are staged)",
    "--requirement": "list requirement files under 'requirements'",
    "-c": "put '-c FILE' in a requirements file (local files there are staged)",
    "--constraint": "put '-c FILE' in a requirements file",
    **dict.fromkeys(("-e", "--editable"), _EDITABLE),
    **dict.fromkeys(("-t", "--target", "--prefix", "--root", "--user"), _INTO_ENV),
    "--cache-dir": "use the stage settings 'cache'/'cache-dir'",
    "--no-cache-dir": "use --set pip.cache=false (the stage setting 'cache: false')",
    "--no-build-isolation": "use the step key 'no-build-isolation: true'",
    **dict.fromkeys(("-i", "--index-url"), "use the step key 'index-url'"),
    "--extra-index-url": "use the step key 'extra-index-urls'",
}

# Matched with fullmatch: "$" would also match before a trailing newline.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PACKAGE_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def default_cache_dir(installer="pip"):
    """The default host cache directory of `installer` (pip or uv)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "cotainr-lumi" / installer


def _check_installer(value):
    if value not in ("pip", "uv"):
        raise ValueError(f"must be pip or uv (got {value!r})")


def _absolute(path, base):
    return Path(os.path.abspath(os.path.join(base, os.path.expanduser(str(path)))))


def _check_package_names(names):
    for name in names:
        if not _PACKAGE_NAME_RE.fullmatch(name):
            raise SettingError(f"{name!r} is not a package name")


def _check_non_empty(value):
    if not value.strip():
        raise SettingError("must be a non-empty string")


def _check_packages(lines):
    if not lines:
        raise ValueError(
            "must be a non-empty list of requirement lines such as 'deepspeed==0.16.4'"
        )


def _check_pip_args(pip_args):
    for arg, after in zip(pip_args, [*pip_args[1:], ""]):
        option, equals, value = arg.partition("=")
        if option in FORBIDDEN_PIP_ARGS:
            raise ValueError(
                f"{arg!r} is not allowed here: {FORBIDDEN_PIP_ARGS[option]}"
            )
        if option in ("-f", "--find-links"):
            value = value if equals else after
            if not is_remote_url(value):
                raise ValueError(
                    f"{arg!r} with a local path is not allowed here: put "
                    "'--find-links DIR' in a requirements file, where local "
                    "directories are staged into the container"
                )


def _load_requirements(value, *, origin):
    """One file name or a list of them, as absolute paths."""
    if isinstance(value, str) and value.strip():
        value = [value]
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(v, str) and v.strip() for v in value)
    ):
        raise SettingError(f"must be a file name or a list of them (got {value!r})")
    return [_absolute(v, origin.base_dir) for v in value]


def _load_env(value, *, origin):
    env = convert(type_=dict[str, Any], value=value)
    for name, item in env.items():
        if not _ENV_NAME_RE.fullmatch(name):
            raise SettingError(f"{name!r} is not a variable name", path=(name,))
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise SettingError(
                f'must be a string or a number (got {item!r}); quote it, e.g. "1"',
                path=(name,),
            )
        try:
            str(item).encode("utf-8")
        except UnicodeEncodeError:
            raise SettingError(
                f"is not valid UTF-8 ({item!r}); give it as UTF-8 text", path=(name,)
            ) from None
    return {k: str(v) for k, v in env.items()}


def _load_allowed(value, *, origin):
    names = convert(type_=list[str], value=value)
    _check_package_names(names)
    return frozenset(canonicalize_name(n) for n in names)


def _load_base_dir(value, *, origin):
    value = convert(type_=Optional[str], value=value)
    if value is not None:
        _check_non_empty(value)
        return _absolute(value, origin.base_dir)


@dataclass(frozen=True)
class StepSettings(StageSettings):
    """The keys of one step as users write them."""

    name: Optional[str] = setting(None, doc="a label for logs", check=_check_non_empty)
    requirements: list[Path] = setting(
        [], doc="requirements files (one or a list)", load=_load_requirements
    )
    packages: list[str] = setting(
        [], doc="requirement lines, inline", check=_check_packages
    )
    no_build_isolation: bool = setting(
        False, doc="build against the installed packages (pip --no-build-isolation)"
    )
    env: dict[str, str] = setting(
        {}, doc="environment variables of the step", load=_load_env
    )
    pip_args: list[str] = setting(
        [], doc="more pip install arguments", check=_check_pip_args
    )
    index_url: Optional[str] = setting(
        None, doc="pip --index-url", check=_check_non_empty
    )
    extra_index_urls: list[str] = setting([], doc="pip --extra-index-url values")
    allow_changes: frozenset[str] = setting(
        frozenset(), doc="installed packages this step may change", load=_load_allowed
    )
    installer: Optional[str] = setting(
        None, doc="pip or uv (null: the stage's installer)", check=_check_installer
    )
    source: Optional[str] = setting(
        None, doc="where the step is defined (for messages)", check=_check_non_empty
    )
    base_dir: Optional[Path] = setting(
        None, doc="the directory relative paths count from", load=_load_base_dir
    )


@dataclass(frozen=True)
class PipStep(StepSettings):
    """One step, read: the keys with paths absolute, and its number."""

    number: int = 1

    @property
    def title(self):
        """A short description: number, name and source."""
        name = f" '{self.name}'" if self.name else ""
        return f"step {self.number}{name} ({self.source})"

    def allowing(self, names):
        """The step, also allowed to change `names`."""
        allowed = {canonicalize_name(n) for n in names}
        return dataclasses.replace(self, allow_changes=self.allow_changes | allowed)

    def install_args(self, *, requirement_files, constraints):
        """The install arguments pip and uv take alike: indexes, pip-args, files."""
        args = ["--no-build-isolation"] if self.no_build_isolation else []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        args += [*self.pip_args, "-c", constraints]
        for path in requirement_files:
            args += ["-r", path]
        return args

    def to_dict(self):
        """The step in the steps format (absolute paths; for records: redacted)."""
        data = {k: v for k, v in super().to_dict().items() if k != "number"}
        for key in ("packages", "pip-args", "extra-index-urls"):
            data[key] = [redact(v) for v in data[key]]
        data["index-url"] = self.index_url and redact(self.index_url)
        data["env"] = redact_env(self.env)
        return data


def _load_step(raw, *, number, origin, label):
    """One step as users write it (or a PipStep) as a PipStep."""
    if isinstance(raw, PipStep):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            raise SettingError("an empty requirements file name")
        raw = {"requirements": raw}
    if not isinstance(raw, Mapping):
        raise SettingError(
            "a step must be a requirements file name or a mapping with "
            f"'requirements' and/or 'packages' (got {raw!r})"
        )
    given = read_declared(schema=StepSettings, raw=raw, origin=origin, unknown="key")
    if "requirements" not in given and "packages" not in given:
        raise SettingError(
            "a step needs 'requirements' (files) and/or 'packages' (lines)"
        )
    given["source"] = given.get("source") or f"{label}, step {number}"
    given["base-dir"] = given.get("base-dir") or Path(origin.base_dir)
    return PipStep.complete({**given, "number": number})


def load_steps(value, *, origin):
    """Read the ``steps`` setting into :class:`PipStep` objects."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SettingError(f"must be a list of steps (got {value!r})")
    label = origin.label or "pip settings"
    steps = []
    for i, raw in enumerate(value):
        try:
            steps.append(_load_step(raw, number=i + 1, origin=origin, label=label))
        except SettingError as e:
            raise e.under(i) from None
    return steps


def _load_cache_dir(value, *, origin):
    if value is None:
        return None
    if not (isinstance(value, str) and value.strip()):
        raise SettingError(f"must be a directory path (got {value!r})")
    return str(_absolute(value, origin.base_dir))


def _check_check(value):
    if value not in ("warn", "strict", "off"):
        raise ValueError(f"must be warn, strict or off (got {value!r})")


@dataclass(frozen=True)
class PipSettings(StageSettings):
    """The settings of the pip stage."""

    steps: list[PipStep] = setting([], doc="the pip steps, in order", load=load_steps)
    # Packaging tools: torch itself requires a newer setuptools than most
    # environments start with. Set [] to protect them too.
    allow_changes: list[str] = setting(
        ["pip", "setuptools", "wheel"],
        doc="installed packages every step may change",
        check=_check_package_names,
    )
    installer: str = setting(
        "pip",
        doc="what installs the steps: pip, or uv (cotainr-lumi[uv], run in the "
        "container); a step's own 'installer' wins",
        check=_check_installer,
    )
    cache: bool = setting(True, doc="reuse a host pip (and uv) download cache")
    cache_dir: Optional[str] = setting(
        None,
        doc="the host pip cache (null: ~/.cache/cotainr-lumi/pip)",
        load=_load_cache_dir,
    )
    uv_cache_dir: Optional[str] = setting(
        None,
        doc="the host uv cache (null: ~/.cache/cotainr-lumi/uv)",
        load=_load_cache_dir,
    )
    check: str = setting(
        "warn",
        doc="`pip check` after the steps: warn about broken requirements, "
        "strict (they stop the build) or off",
        check=_check_check,
    )


def _describe_key(path, *, data):
    """'step 2 ('name'), key 'env.CC'' for ``("steps", 1, "env", "CC")``."""
    if len(path) < 2 or path[0] != "steps" or not isinstance(path[1], int):
        return "key '" + ".".join(str(p) for p in path) + "'"
    step = data["steps"][path[1]]
    name = step.get("name") if isinstance(step, Mapping) else None
    label = f"step {path[1] + 1}" + (f" ('{name}')" if name else "")
    rest = ".".join(str(p) for p in path[2:] if not isinstance(p, int))
    return label + (f", key '{rest}'" if rest else "")


def load_steps_file(*, path):
    """Read a steps file (an absolute Path) into typed stage settings."""
    data = read_yaml(
        path=path,
        error=lambda message: InputError(f"The pip steps file {path} {message}."),
    )
    if isinstance(data, list):  # just the list of steps: the mapping it stands for
        data = LineDict(steps=data)
        data.line = getattr(data["steps"], "line", None)
        data.lines["steps"] = data.line
    # The system-packages stage reads its key itself; a file may have only it.
    if isinstance(data, dict) and data.pop("system-packages", None) is not None:
        data.setdefault("steps", [])
    elif not isinstance(data, dict) or not data.get("steps"):
        raise InputError(
            f"The pip steps file {path} must be a mapping with a non-empty "
            "'steps' list (or just that list), e.g.\n"
            "steps:\n  - requirements: torch.txt\n  - packages: [deepspeed]\n"
            "    no-build-isolation: true"
        )
    origin = FileOrigin(
        file=path,
        data=data,
        what="pip steps file",
        describe=functools.partial(_describe_key, data=data),
    )
    settings = load_settings(schema=PipSettings, raw=data, origin=origin, stage="pip")
    allowed = settings.pop("allow-changes", [])
    settings["steps"] = [step.allowing(allowed) for step in settings["steps"]]
    return settings


def steps_from_inputs(*, inputs):
    """Typed stage settings from command line inputs, in command line order."""
    settings: dict[str, Any] = {"steps": []}
    for kind, value in inputs:
        path = _absolute(value, ".")
        if kind == "requirements":
            if not path.is_file():
                raise InputError(f"--pip-requirements {value}: no such file ({path}).")
            settings["steps"].append(
                PipStep(source=str(value), requirements=[path], base_dir=path.parent)
            )
        else:
            loaded = load_steps_file(path=path)
            settings["steps"] += loaded.pop("steps")
            settings.update(loaded)
    return settings
