"""
The input of the ``pip`` stage: ordered pip steps, as settings or a file.

The stage settings *are* the input format. In a system profile
(``settings: {pip: {...}}``), in the Python API
(``settings={"pip": {...}}``) and in a steps file (``--pip-steps FILE``)
they read::

    steps:
      - requirements: torch.txt            # a file or a list of files
      - name: DeepSpeed with fused ops     # optional, shown in logs
        packages: ["deepspeed==0.16.4"]    # requirement lines, inline
        no-build-isolation: true           # build against the installed torch
        env: {DS_BUILD_FUSED_ADAM: 1, PYTORCH_ROCM_ARCH: gfx90a}
        pip-args: [--verbose]
        index-url: https://pypi.org/simple
        extra-index-urls: [https://download.pytorch.org/whl/rocm6.2]
        allow-changes: [numpy]             # may change these installed packages
      - more-requirements.txt              # shorthand for {requirements: FILE}
    allow-changes: [pip, setuptools, wheel]  # for every step (the default)
    cache: true                            # reuse a host pip download cache
    cache-dir: null                        # default ~/.cache/cotainr-lumi/pip

Relative paths in a steps file are relative to that file; elsewhere they are
relative to the current directory when the build starts. ``--pip-requirements
FILE`` adds the step ``{requirements: FILE}``.

Classes
-------
PipStep
    One normalized step.

Functions
---------
check_settings(*, settings)
    Problems with stage settings, as ``(key, message)`` pairs.
load_steps_file(*, path)
    Read a steps file into stage settings with absolute paths.
normalize_steps(*, settings, cwd)
    The steps of valid settings as :class:`PipStep` objects.
default_cache_dir()
    The default host pip cache directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
import logging
import os
from pathlib import Path
import re
from typing import Any

from packaging.utils import canonicalize_name

from ...engine.yamlfile import read_yaml
from ...errors import InputError

logger = logging.getLogger(f"cotainr.{__name__}")

#: The stage settings and their defaults.
SETTINGS_DEFAULTS = {
    "steps": [],
    # Packaging tools: torch itself requires a newer setuptools than most
    # environments start with. Set [] to protect them too.
    "allow-changes": ["pip", "setuptools", "wheel"],
    "cache": True,
    "cache-dir": None,
}

#: The keys of one step.
STEP_KEYS = (
    "name",
    "requirements",
    "packages",
    "no-build-isolation",
    "env",
    "pip-args",
    "index-url",
    "extra-index-urls",
    "allow-changes",
    "source",
    "base-dir",
)

#: pip options a step may not pass in ``pip-args``, with the reason.
FORBIDDEN_PIP_ARGS = {
    "-r": "list requirement files under 'requirements' (their local references are staged)",
    "--requirement": "list requirement files under 'requirements'",
    "-c": "put '-c FILE' in a requirements file (local files there are staged)",
    "--constraint": "put '-c FILE' in a requirements file",
    "-e": "editable installs cannot work in an image; install a copy instead",
    "--editable": "editable installs cannot work in an image; install a copy instead",
    "-t": "packages must go into the image's Python environment",
    "--target": "packages must go into the image's Python environment",
    "--prefix": "packages must go into the image's Python environment",
    "--root": "packages must go into the image's Python environment",
    "--user": "packages must go into the image's Python environment",
    "--cache-dir": "use the stage settings 'cache'/'cache-dir'",
    "--no-cache-dir": "use the stage setting 'cache: false' (or --no-pip-cache)",
    "--no-build-isolation": "use the step key 'no-build-isolation: true'",
    "-i": "use the step key 'index-url'",
    "--index-url": "use the step key 'index-url'",
    "--extra-index-url": "use the step key 'extra-index-urls'",
}

# Matched with fullmatch: "$" would also match before a trailing newline.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass
class PipStep:
    """
    One normalized step.

    Attributes
    ----------
    number : int
        1-based position.
    source : str
        Where the step was defined (a steps file and step number, or the
        requirements file given with ``--pip-requirements``).
    name : str or None
        A label for logs.
    requirements : list of :class:`pathlib.Path`
        Absolute host paths of the step's requirement files.
    packages : list of str
        Inline requirement lines.
    base_dir : :class:`pathlib.Path`
        The directory relative paths in `packages` are resolved against.
    no_build_isolation : bool
        Pass ``--no-build-isolation``.
    env : dict of str to str
        Environment variables for the step (e.g. ``PYTORCH_ROCM_ARCH``).
    pip_args : list of str
        Extra ``pip install`` arguments.
    index_url : str or None
        ``--index-url``.
    extra_index_urls : list of str
        ``--extra-index-url`` values.
    allow_changes : frozenset of str
        Canonical names of installed distributions this step may change.
    """

    number: int
    source: str
    name: str | None = None
    requirements: list[Path] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    base_dir: Path = field(default_factory=Path.cwd)
    no_build_isolation: bool = False
    env: dict[str, str] = field(default_factory=dict)
    pip_args: list[str] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    allow_changes: frozenset[str] = frozenset()

    @property
    def title(self):
        """A short description: number, name and source."""
        name = f" '{self.name}'" if self.name else ""
        return f"step {self.number}{name} ({self.source})"


def default_cache_dir():
    """
    The default host pip cache directory.

    Returns
    -------
    path : :class:`pathlib.Path`
        ``${XDG_CACHE_HOME:-~/.cache}/cotainr-lumi/pip``.
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "cotainr-lumi" / "pip"


def _is_utf8(text):
    """Whether `text` can be written out as UTF-8 (no undecodable bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_str_list(value):
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_names(value, key):
    problems = []
    if not _is_str_list(value):
        return [(key, f"must be a list of package names (got {value!r})")]
    for name in value:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
            problems.append((key, f"{name!r} is not a package name"))
    return problems


def _check_step(step, index):
    """Problems with one step (``index`` is 0-based)."""
    key = f"steps[{index + 1}]"
    if isinstance(step, str):
        if not step.strip():
            return [(key, "an empty requirements file name")]
        return []
    if not isinstance(step, Mapping):
        return [
            (
                key,
                "a step must be a requirements file name or a mapping with "
                f"'requirements' and/or 'packages' (got {step!r})",
            )
        ]
    problems = []
    for k in step:
        if k not in STEP_KEYS:
            problems.append(
                (f"{key}.{k}", f"unknown key (known: {', '.join(STEP_KEYS)})")
            )
    reqs = step.get("requirements")
    if reqs is not None and not (
        (isinstance(reqs, str) and reqs.strip()) or (_is_str_list(reqs) and reqs)
    ):
        problems.append(
            (
                f"{key}.requirements",
                f"must be a file name or a list of them (got {reqs!r})",
            )
        )
    packages = step.get("packages")
    if packages is not None and not (_is_str_list(packages) and packages):
        problems.append(
            (
                f"{key}.packages",
                "must be a non-empty list of requirement lines such as "
                f"'deepspeed==0.16.4' (got {packages!r})",
            )
        )
    if reqs is None and packages is None:
        problems.append(
            (key, "a step needs 'requirements' (files) and/or 'packages' (lines)")
        )
    for k in ("name", "source", "base-dir", "index-url"):
        if k in step and not (isinstance(step[k], str) and step[k].strip()):
            problems.append(
                (f"{key}.{k}", f"must be a non-empty string (got {step[k]!r})")
            )
    if "no-build-isolation" in step and not isinstance(
        step["no-build-isolation"], bool
    ):
        problems.append(
            (
                f"{key}.no-build-isolation",
                f"must be true or false (got {step['no-build-isolation']!r})",
            )
        )
    if "extra-index-urls" in step and not _is_str_list(step["extra-index-urls"]):
        problems.append((f"{key}.extra-index-urls", "must be a list of index URLs"))
    if "allow-changes" in step:
        problems += _check_names(step["allow-changes"], f"{key}.allow-changes")
    env = step.get("env")
    if env is not None:
        if not isinstance(env, Mapping):
            problems.append(
                (f"{key}.env", f"must be a mapping NAME: value (got {env!r})")
            )
        else:
            for name, value in env.items():
                if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
                    problems.append((f"{key}.env", f"{name!r} is not a variable name"))
                elif isinstance(value, bool) or not isinstance(
                    value, (str, int, float)
                ):
                    problems.append(
                        (
                            f"{key}.env.{name}",
                            f"must be a string or a number (got {value!r}); "
                            'quote it, e.g. "1"',
                        )
                    )
                elif not _is_utf8(str(value)):
                    problems.append(
                        (
                            f"{key}.env.{name}",
                            f"is not valid UTF-8 ({value!r}); give it as UTF-8 text",
                        )
                    )
    pip_args = step.get("pip-args")
    if pip_args is not None:
        if not _is_str_list(pip_args):
            problems.append((f"{key}.pip-args", "must be a list of strings"))
        else:
            problems += _check_pip_args(pip_args, f"{key}.pip-args")
    return problems


def _check_pip_args(pip_args, key):
    problems = []
    for i, arg in enumerate(pip_args):
        option = arg.split("=", 1)[0]
        if option in FORBIDDEN_PIP_ARGS:
            problems.append(
                (key, f"{arg!r} is not allowed here: {FORBIDDEN_PIP_ARGS[option]}")
            )
        elif option in ("-f", "--find-links"):
            value = (
                arg.split("=", 1)[1]
                if "=" in arg
                else (pip_args[i + 1] if i + 1 < len(pip_args) else "")
            )
            if not _URL_RE.match(value) or value.startswith("file:"):
                problems.append(
                    (
                        key,
                        f"{arg!r} with a local path is not allowed here: put "
                        "'--find-links DIR' in a requirements file, where local "
                        "directories are staged into the container",
                    )
                )
    return problems


def check_settings(*, settings):
    """
    Problems with stage settings, as ``(key, message)`` pairs.

    Parameters
    ----------
    settings : mapping
        The ``pip`` stage settings.

    Returns
    -------
    problems : list of (str, str)
        Empty when the settings are valid. Keys are dotted, steps numbered
        from 1 (``steps[2].env.CC``).
    """
    problems = []
    for key in settings:
        if key not in SETTINGS_DEFAULTS:
            problems.append(
                (
                    key,
                    f"unknown setting (known: {', '.join(sorted(SETTINGS_DEFAULTS))})",
                )
            )
    steps = settings.get("steps", [])
    if steps is None:
        steps = []
    if not isinstance(steps, list):
        problems.append(("steps", f"must be a list of steps (got {steps!r})"))
    else:
        for i, step in enumerate(steps):
            problems += _check_step(step, i)
    if "allow-changes" in settings:
        problems += _check_names(settings["allow-changes"], "allow-changes")
    if "cache" in settings and not isinstance(settings["cache"], bool):
        problems.append(("cache", f"must be true or false (got {settings['cache']!r})"))
    cache_dir = settings.get("cache-dir")
    if cache_dir is not None and not (isinstance(cache_dir, str) and cache_dir.strip()):
        problems.append(("cache-dir", f"must be a directory path (got {cache_dir!r})"))
    return problems


def _absolute(path, base):
    return Path(os.path.abspath(os.path.join(base, os.path.expanduser(str(path)))))


def _absolutize_step(step, *, base, source):
    """A copy of one raw step with absolute paths and a source."""
    if isinstance(step, str):
        step = {"requirements": step}
    step = dict(step)
    reqs = step.get("requirements")
    if reqs is not None:
        reqs = [reqs] if isinstance(reqs, str) else list(reqs)
        step["requirements"] = [str(_absolute(r, base)) for r in reqs]
    step.setdefault("base-dir", str(base))
    step["base-dir"] = str(_absolute(step["base-dir"], base))
    step.setdefault("source", source)
    return step


def load_steps_file(*, path):
    """
    Read a steps file into stage settings with absolute paths.

    Parameters
    ----------
    path : os.PathLike
        The YAML steps file (the stage settings format).

    Returns
    -------
    settings : dict
        Stage settings; every step has absolute paths and a ``source``, and
        the file's top-level ``allow-changes`` is folded into its steps.

    Raises
    ------
    :class:`cotainr_lumi.errors.InputError`
        If the file cannot be read or is invalid (the message names the
        file, the step and the key).
    """
    path = Path(os.path.abspath(os.path.expanduser(path)))
    data = read_yaml(
        path=path,
        error=lambda message: InputError(f"The pip steps file {path} {message}."),
    )
    if isinstance(data, list):
        data = {"steps": data}
    if not isinstance(data, dict) or not data.get("steps"):
        raise InputError(
            f"The pip steps file {path} must be a mapping with a non-empty "
            "'steps' list (or just that list), e.g.\n"
            "steps:\n  - requirements: torch.txt\n  - packages: [deepspeed]\n"
            "    no-build-isolation: true"
        )
    problems = check_settings(settings=data)
    if problems:
        key, message = problems[0]
        raise InputError(
            f"Invalid pip steps file {path}, {_describe_key(key, data)}: {message}."
        )
    base = path.parent
    file_allowed = list(data.get("allow-changes") or [])
    steps = []
    for i, step in enumerate(data["steps"]):
        step = _absolutize_step(step, base=base, source=f"{path}, step {i + 1}")
        if file_allowed:
            step["allow-changes"] = list(step.get("allow-changes") or []) + file_allowed
        steps.append(step)
    settings = {"steps": steps}
    if "cache" in data:
        settings["cache"] = data["cache"]
    if data.get("cache-dir"):
        settings["cache-dir"] = str(_absolute(data["cache-dir"], base))
    return settings


def _describe_key(key, data):
    """'step 2 ('name'), key 'env.CC'' from 'steps[2].env.CC'."""
    m = re.match(r"^steps\[(\d+)\](?:\.(.*))?$", key)
    if not m:
        return f"key '{key}'"
    number = int(m.group(1))
    step = data["steps"][number - 1]
    name = step.get("name") if isinstance(step, Mapping) else None
    label = f"step {number}" + (f" ('{name}')" if name else "")
    return label + (f", key '{m.group(2)}'" if m.group(2) else "")


def normalize_steps(*, settings, cwd):
    """
    The steps of valid settings as :class:`PipStep` objects.

    Parameters
    ----------
    settings : mapping
        Valid stage settings (see :func:`check_settings`).
    cwd : os.PathLike
        The directory relative paths are resolved against.

    Returns
    -------
    steps : list of PipStep
        In order, numbered from 1.
    """
    global_allowed = {canonicalize_name(n) for n in settings.get("allow-changes") or []}
    steps = []
    for i, raw in enumerate(settings.get("steps") or []):
        raw = _absolutize_step(
            raw, base=Path(cwd), source=f"pip settings, step {i + 1}"
        )
        steps.append(
            PipStep(
                number=i + 1,
                source=raw["source"],
                name=raw.get("name"),
                requirements=[Path(r) for r in raw.get("requirements") or []],
                packages=list(raw.get("packages") or []),
                base_dir=Path(raw["base-dir"]),
                no_build_isolation=bool(raw.get("no-build-isolation", False)),
                env={k: str(v) for k, v in (raw.get("env") or {}).items()},
                pip_args=list(raw.get("pip-args") or []),
                index_url=raw.get("index-url"),
                extra_index_urls=list(raw.get("extra-index-urls") or []),
                allow_changes=frozenset(
                    global_allowed
                    | {canonicalize_name(n) for n in raw.get("allow-changes") or []}
                ),
            )
        )
    return steps


def steps_from_inputs(*, inputs):
    """
    Stage settings from command line inputs, in command line order.

    Parameters
    ----------
    inputs : list of (str, str)
        ``("requirements", FILE)`` for ``--pip-requirements`` and
        ``("steps", FILE)`` for ``--pip-steps``; relative paths count from
        the current directory.

    Returns
    -------
    settings : dict
        ``{"steps": [...]}`` plus ``cache``/``cache-dir`` from steps files.
    """
    settings: dict[str, Any] = {"steps": []}
    for kind, value in inputs:
        path = Path(os.path.abspath(os.path.expanduser(value)))
        if kind == "requirements":
            if not path.is_file():
                raise InputError(f"--pip-requirements {value}: no such file ({path}).")
            settings["steps"].append(
                {
                    "requirements": [str(path)],
                    "source": str(value),
                    "base-dir": str(path.parent),
                }
            )
        else:
            loaded = load_steps_file(path=path)
            settings["steps"] += loaded.pop("steps")
            settings.update(loaded)
    return settings


def problems_as_text(problems: list[tuple[str, str]]):
    """One line per problem: ``key: message``."""
    return "\n".join(f"{k}: {m}" for k, m in problems)
