"""
The one choice of the Python environment a build installs into.

One probe of the image per build (:mod:`.imageprobe`) gives the facts;
:func:`choose` applies the rules of README.md ("Which Python environment the
packages go into"), the first that applies wins. An env is identified by its
own interpreter's ``sys.prefix``, never by whatever ``python`` is first on
``PATH``; a system Python (under ``/usr``) is never a target.
"""

from dataclasses import asdict, dataclass, field
import logging
import os
import shlex
from typing import Optional

from .. import _cotainr
from .settings import StageSettings, setting

logger = logging.getLogger(f"cotainr.{__name__}")

#: The settings section of the target env.
SETTINGS_NAME = "target-env"
#: Prefixes of system Pythons: never a target.
SYSTEM_PREFIXES = ("/usr", "/usr/local", "/")
#: The conda env cotainr creates from ``--conda-env``.
CONDA_ENV = f"{_cotainr.CONDA_PREFIX}/envs/{_cotainr.CONDA_ENV_NAME}"

_SOURCE_WORDS = {
    "setting": "named explicitly (target-env.prefix)",
    "conda-env": "the conda env cotainr creates from --conda-env",
    "with-conda": "from the base image's $WITH_CONDA",
    "active-env": "active in the base image's environment",
    "path-env": "the first python on the base image's PATH",
    "pythonpath-env": "the env of the first site-packages on the base image's PYTHONPATH",
}
#: The rules in order of precedence (the first that applies wins).
RULES = tuple(_SOURCE_WORDS)


def _check_prefix(value):
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path in the image (got {value!r})")
    if _is_system_prefix(value):
        raise ValueError(
            f"{value!r} is the prefix of a system Python; cotainr-lumi never "
            "installs there. Name a venv or conda env of the base image"
        )


def _check_timeout(value):
    if not 1 <= value <= 24 * 3600:
        raise ValueError(f"must be between 1 and 86400 seconds (got {value!r})")


def timeout_message(seconds):
    """What to say when the probe of an image timed out."""
    return (
        f"the probe of the base image's Python environment did not finish "
        f"within {seconds:g} s (timed out: an env script or the $WITH_CONDA of "
        "the base image that never returns?); fix the base image, or raise the "
        "limit with --set target-env.probe-timeout=SECONDS"
    )


@dataclass(frozen=True)
class TargetEnvSettings(StageSettings):
    """The settings section ``target-env``."""

    prefix: Optional[str] = setting(
        None,
        doc="the env to install into (null: found in the base image)",
        check=_check_prefix,
    )
    probe_timeout: int = setting(
        120,
        doc="seconds the probe of the base image's environment may take "
        "(its env scripts and $WITH_CONDA run)",
        check=_check_timeout,
    )


class TargetEnvNotFoundError(Exception):
    """Why no environment could be chosen (the message says how to go on)."""


@dataclass(frozen=True)
class ImageFacts:
    """What the same probe saw of the image's environment (before ``$WITH_CONDA``)."""

    conda_prefix: str = ""
    conda_exe: str = ""
    rocm_path: str = ""
    libstdcxx_cache: tuple[str, ...] = ()
    rocm_version: str = ""
    ld_library_path: str = ""

    @classmethod
    def from_facts(cls, facts):
        """Read them from the probe's facts."""
        image = facts.get("image", {})
        values = {name: image.get(name) or "" for name in cls.__dataclass_fields__}
        return cls(**{**values, "libstdcxx_cache": tuple(image.get("ldcache") or ())})


@dataclass
class TargetEnv:
    """The chosen environment and why."""

    prefix: str
    python: str
    version: str = ""
    base_prefix: str = ""
    site: list[str] = field(default_factory=list)
    source: str = ""
    reason: str = ""
    with_conda: Optional[str] = None
    decoys: dict[str, str] = field(default_factory=dict)
    image: ImageFacts = field(default_factory=ImageFacts)
    torch: Optional[dict[str, str]] = None

    @property
    def bin_dir(self):
        """The environment's ``bin`` directory."""
        return self.prefix.rstrip("/") + "/bin"

    @property
    def env_prefixes(self):
        """The prefixes whose ``lib/`` belongs to this env (itself, a venv's base)."""
        base = self.base_prefix
        own = base and base != self.prefix and not _is_system_prefix(base)
        return [self.prefix, base] if own else [self.prefix]

    def activation(self):
        """Shell code that activates the env for a command (pip, builds)."""
        path = f'PATH={shlex.quote(self.bin_dir)}"${{PATH:+:$PATH}}"; export PATH'
        if self.source == "with-conda" and self.with_conda:
            with_conda = shlex.quote(self.with_conda)
            return f"eval {with_conda} >/dev/null 2>&1 || true; {path}"
        return path

    def describe(self):
        """One line: the env, its interpreter, why and the rule that chose it."""
        text = f"{self.prefix} (python {self.version} at {self.python}; {self.reason})"
        if self.source in RULES:
            text += f" [rule {RULES.index(self.source) + 1}, {self.source}]"
        return text

    def to_dict(self):
        """JSON-serialisable form."""
        return asdict(self)


def _is_system_prefix(prefix):
    return os.path.normpath(prefix or "/") in SYSTEM_PREFIXES


def _python(facts, where):
    info = facts.get(where, {}).get("python")
    return info if isinstance(info, dict) and info.get("prefix") else None


def _active(facts, where):
    """The env active in one state: (``VAR=value`` naming it, python facts) or None."""
    state = facts.get(where, {})
    path = [p.rstrip("/") for p in (state.get("path") or "").split(":") if p]
    candidates = []
    for var in ("virtual_env", "conda_prefix"):
        info = _python(facts, f"{where}.{var}")
        if state.get(var) and info and not _is_system_prefix(info["prefix"]):
            bin_dir = state[var].rstrip("/") + "/bin"
            rank = path.index(bin_dir) if bin_dir in path else len(path)
            candidates.append((rank, f"{var.upper()}={state[var]}", info))
    return min(candidates, key=lambda c: c[0])[1:] if candidates else None


def _decoys(facts, chosen_prefix):
    path_py = facts.get("image", {}).get("path_python")
    info = _python(facts, "image.path_python")
    if path_py and info and info["prefix"] != chosen_prefix:
        return {"python on PATH": f"{path_py} (prefix {info['prefix']})"}
    return {}


def _kind(info):
    """What kind of Python an interpreter's facts describe."""
    prefix = info["prefix"]
    if info.get("conda_base"):
        return "conda-base"
    if _is_system_prefix(prefix) or os.path.normpath(prefix).startswith("/usr/"):
        return "system"
    if _is_venv(info):
        return "venv"
    if info.get("conda_meta"):
        return "conda-env"
    return "plain"


def _is_venv(info):
    """Whether an interpreter's facts are those of a venv."""
    return bool(
        info.get("venv")
        or (info.get("base_prefix") and info["base_prefix"] != info["prefix"])
    )


_KIND_WORDS = {
    "venv": "a venv",
    "conda-env": "a conda env",
    "conda-base": "conda's base env (the conda installation, not an env to install into)",
    "system": "a system Python",
    "plain": "a Python installation that is neither a venv nor a conda env",
}


def _describe_python(path_py, info):
    """`path_py` and what kind of Python it is, for messages."""
    if info is None:
        return f"{path_py} (no working interpreter there)"
    kind = _kind(info)
    words = _KIND_WORDS[kind]
    if kind == "system" and _is_venv(info) and not _is_system_prefix(info["prefix"]):
        words = "a venv under /usr (not a place to install into)"
    return f"{path_py} (prefix {info['prefix']}), {words}"


def _not_found_message(facts):
    image = facts.get("image", {})
    with_conda = image.get("with_conda")
    rc = facts.get("with_conda", {}).get("rc")
    did = "failed" if rc not in (None, "0") else "activates no venv/conda env"
    seen = [
        f"$WITH_CONDA={with_conda!r} {did}" if with_conda else "$WITH_CONDA is not set",
        "no VIRTUAL_ENV/CONDA_PREFIX in its environment",
    ]
    path_py = image.get("path_python")
    python = path_py and _describe_python(path_py, _python(facts, "image.path_python"))
    seen.append(f"`python` on PATH is {python}" if path_py else "no python on PATH")
    pp_prefix = image.get("pythonpath_prefix")
    if pp_prefix:
        info = _python(facts, "image.pythonpath_env")
        kind = info and _KIND_WORDS[_kind(info)]
        kind = kind or f"which has no working {pp_prefix}/bin/python"
        seen.append(f"PYTHONPATH points into {pp_prefix}, {kind}")
    return (
        "the base image has no Python environment to install into: "
        + "; ".join(seen)
        + ". cotainr-lumi never installs into a system Python (/usr) and does "
        "not pick conda's base env by itself. Give a "
        "conda env (--conda-env FILE) to create one, or name the image's env: "
        "--set target-env.prefix=/path/to/env (or `target-env: {prefix: "
        "/path/to/env}` under settings: of a system profile)."
    )


def _with_conda(facts):
    """The base image's $WITH_CONDA (None: not set)."""
    image = facts.get("image", {})
    return image.get("with_conda") if image.get("with_conda_set") else None


def _make_target(facts, info, *, source, reason=None):
    """The TargetEnv of one interpreter's facts (`reason`: the source's words)."""
    return TargetEnv(
        prefix=info["prefix"],
        python=info["executable"],
        version=info.get("version", ""),
        base_prefix=info.get("base_prefix", ""),
        site=list(info.get("site") or []),
        source=source,
        reason=reason or _SOURCE_WORDS[source],
        with_conda=_with_conda(facts),
        decoys=_decoys(facts, info["prefix"]),
        image=ImageFacts.from_facts(facts),
        torch=info.get("torch") or None,
    )


def _from_with_conda(facts, *, before):
    """Rule 3: the env the base image's $WITH_CONDA activates (None: none)."""
    with_conda = _with_conda(facts)
    if not with_conda:
        return None
    rc = facts.get("with_conda", {}).get("rc")
    if rc not in (None, "0"):
        logger.warning(
            "The base image's $WITH_CONDA (%r) failed in the container "
            "(exit status %s); looking for an active environment instead.",
            with_conda,
            rc,
        )
        return None
    after = _active(facts, "with_conda")
    if after is None:
        return None
    named_by, info = after
    reason = f"from the base image's $WITH_CONDA ({with_conda!r} sets {named_by})"
    if before is not None and before[1]["prefix"] == info["prefix"]:
        reason += "; already active in its environment"
    return _make_target(facts, info, source="with-conda", reason=reason)


#: Rules 5 and 6: (source, the fact naming the place, its interpreter, reason).
_PLACE_RULES = (
    (
        "path-env",
        "path_python",
        "image.path_python",
        "the first python on the base image's PATH, {place}, is {kind} with its "
        "own sys.prefix {prefix} (no VIRTUAL_ENV/CONDA_PREFIX or $WITH_CONDA "
        "names it)",
    ),
    (
        "pythonpath-env",
        "pythonpath_prefix",
        "image.pythonpath_env",
        "the base image's PYTHONPATH starts with the site-packages of {place}, "
        "{kind} with its own interpreter {executable}",
    ),
)


def _explicit_target(facts, *, explicit):
    """Rule 1, the env the setting names, or rule 2, the conda env cotainr created."""
    info = _python(facts, "explicit")
    if not explicit and info is None:
        raise TargetEnvNotFoundError(
            f"the conda env cotainr created ({CONDA_ENV}) has no working python; "
            "check the conda environment file"
        )
    if info is None:
        raise TargetEnvNotFoundError(
            f"target-env.prefix={explicit}: there is no working "
            f"{explicit}/bin/python (or python3) in the image. Give the prefix "
            "of a venv or conda env of the base image (the directory holding "
            "bin/python), or drop the setting to let cotainr-lumi find it."
        )
    if explicit and _is_system_prefix(info["prefix"]):
        raise TargetEnvNotFoundError(
            f"target-env.prefix={explicit} is a system Python (sys.prefix "
            f"{info['prefix']}); cotainr-lumi never installs there. Name a venv "
            "or conda env, or give --conda-env."
        )
    source = "setting" if explicit else "conda-env"
    return _make_target(facts, info, source=source)


def _place_target(facts):
    """Rules 5 and 6: the venv/conda env of a place the image names (or None)."""
    image = facts.get("image", {})
    for source, place, where, reason in _PLACE_RULES:
        info = _python(facts, where)
        kind = info and _kind(info)
        if image.get(place) and kind in ("venv", "conda-env"):
            reason = reason.format(place=image[place], kind=_KIND_WORDS[kind], **info)
            return _make_target(facts, info, source=source, reason=reason)
    return None


def choose(*, facts, explicit=None, conda_env=False):
    """Choose the target environment from the probe's facts."""
    if explicit or conda_env:
        return _explicit_target(facts, explicit=explicit)
    before = _active(facts, "image")
    target = _from_with_conda(facts, before=before)
    if target is not None:
        return target
    if before is not None:
        named_by, info = before
        reason = f"active in the base image's environment ({named_by})"
        return _make_target(facts, info, source="active-env", reason=reason)
    target = _place_target(facts)
    if target is None:
        raise TargetEnvNotFoundError(_not_found_message(facts))
    return target


#: What a build looks for when it cannot ask the base image now.
LOOKS_FOR = (
    "found in the base image when the build starts, first match wins: "
    "the env its $WITH_CONDA activates (evaluated in the container after its "
    "env scripts); else a venv/conda env active in its environment "
    "(VIRTUAL_ENV/CONDA_PREFIX); else the venv/conda env of the first python "
    "on its PATH; else the env of the first site-packages on its PYTHONPATH; "
    "else the build stops with an error before installing (never into a "
    "system Python or conda's base env); override with "
    "--set target-env.prefix=PATH"
)


def describe_lines(*, settings, conda_env, answer):
    """
    The dry run's lines on the target env.

    Parameters
    ----------
    settings : TargetEnvSettings
        The target-env settings.
    conda_env : pathlib.Path or None
        cotainr's conda environment file.
    answer : TargetEnv, TargetEnvNotFoundError or None
        What the base image said (None: not asked).
    """
    if settings.prefix:
        return [
            f"{settings.prefix} ({_SOURCE_WORDS['setting']}; checked at build start)"
        ]
    if conda_env is not None:
        return [f"{CONDA_ENV} ({_SOURCE_WORDS['conda-env']} {conda_env.name})"]
    if isinstance(answer, TargetEnv):
        decoys = [f"not the target: {d}" for d in answer.decoys.values()]
        return [answer.describe(), *decoys]
    if isinstance(answer, TargetEnvNotFoundError):
        return [f"none: {answer} (the build would stop before installing)"]
    return [LOOKS_FOR]
