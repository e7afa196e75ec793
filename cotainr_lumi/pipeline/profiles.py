"""
System profiles: the systems cotainr-lumi builds for, defined as data.

Profiles are YAML files read in order, later ones adding systems or merging
over keys of earlier ones: the package's ``systems.yaml``, the user's
``$XDG_CONFIG_HOME/cotainr-lumi/systems.yaml``, then each file of
``COTAINR_LUMI_SYSTEMS`` (colon-separated). cotainr's own systems stay
available as *stock* systems unless a profile defines the same name. A system
has ``extends``, ``description``, ``base-image``, ``rocm-version``, ``stages``
(of the pipeline, in order), ``settings`` (a section per stage or engine
section) and ``follows`` (not inherited): where LUST's cotainr module is
loaded, the base image of that system of its ``systems.json`` replaces
``base-image``, unless a later file sets ``base-image``. The top-level
``removed`` maps retired system names to the message a build naming them gets
(a later definition or null brings one back).
"""

import copy
from dataclasses import dataclass, field
import logging
import os
from pathlib import Path
import re
from typing import Any, Optional

from .. import _cotainr
from .. import stages as builtin
from ..engine import rocmwindow, targetenv, workdir
from ..engine.origins import ProfileOrigin, dotted
from ..engine.settings import SettingError, load_sections
from ..engine.yamlfile import line_of, read_yaml
from ..errors import ProfileError, UnknownSystemError
from ..stages.lumi_env.mpi import HostBinding

logger = logging.getLogger(f"cotainr.{__name__}")

#: The profile file shipped in the package.
PACKAGED_PROFILE = Path(__file__).parent.parent / "systems.yaml"
#: The environment variable naming site/user profile files.
PROFILES_ENV_VAR = "COTAINR_LUMI_SYSTEMS"


#: The sections of the settings tree that are not stages.
ENGINE_SECTIONS = {
    targetenv.SETTINGS_NAME: targetenv.TargetEnvSettings,
    rocmwindow.SETTINGS_NAME: rocmwindow.RocmSettings,
    workdir.SETTINGS_NAME: workdir.BuildSettings,
}


def sections():
    """The one settings tree: section name -> settings class."""
    return {
        **ENGINE_SECTIONS,
        **{stage.name: stage.settings_class for stage in builtin.PIPELINE},
    }


_SYSTEM_KEYS = {
    "extends",
    "follows",
    "description",
    "base-image",
    "rocm-version",
    "stages",
    "settings",
}


@dataclass(frozen=True)
class SiteBase:
    """A base image that follows a system of LUST's ``systems.json``."""

    name: str  # the system of systems.json
    default: str  # the profile's base-image
    site_file: Optional[str] = None  # the systems.json read (None: none found)
    site: Optional[str] = None  # its base-image of `name` (None: not there)

    def origin(self):
        """Where the base image comes from, in words."""
        if self.site:
            return f"{self.name} of {self.site_file}"
        if self.site_file:
            return f"built-in default ({self.site_file} has no {self.name})"
        return "built-in default (no $EBROOTCOTAINR/systems.json of LUST's cotainr)"


@dataclass(frozen=True)
class SystemProfile:
    """A resolved system."""

    name: str
    base_image: str
    description: str = ""
    stages: tuple[str, ...] = ()
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    rocm_version: Optional[str] = None
    sources: tuple[str, ...] = ()
    stock: bool = False
    site_base: Optional[SiteBase] = None
    mpi_host: Optional[HostBinding] = None  # lumi-env.mpi-host, typed

    def stage_settings(self, name):
        """The settings of one stage."""
        return copy.deepcopy(self.settings.get(name, {}))

    def describe_lines(self):
        """The dry run's lines on the system: its files, where its base comes from."""
        kind = "stock cotainr system" if self.stock else "profile"
        lines = [f"  system:     {self.name} ({kind}: {', '.join(self.sources)})"]
        if self.site_base:
            lines.append(f"    its base image from: {self.site_base.origin()}")
        return lines


def profile_files():
    """The profile files read, in order."""
    files = [PACKAGED_PROFILE]
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    user_file = Path(config_home) / "cotainr-lumi" / "systems.yaml"
    if user_file.is_file():
        files.append(user_file)
    for entry in filter(str.strip, os.environ.get(PROFILES_ENV_VAR, "").split(":")):
        path = Path(entry).expanduser()
        if not path.is_file():
            raise ProfileError(
                f"{PROFILES_ENV_VAR} names {entry!r}, which is not a file. "
                f"Fix or unset {PROFILES_ENV_VAR}.",
                file=entry,
            )
        files.append(path)
    return files


#: The profile file format this version reads (the optional ``version:`` key).
PROFILE_FORMAT_VERSION = 1


def _read_profile_file(path):
    """One profile file's ``removed`` and ``{name: mapping}`` (settings typed)."""
    data = read_yaml(
        path=path, error=lambda message: ProfileError(f"the file {message}", file=path)
    )
    if data is None:
        return {}, {}
    _check_top_level(data, path=path)
    systems = data.get("systems") or {}
    if not isinstance(systems, dict):
        raise ProfileError(
            "'systems' must be a mapping",
            file=path,
            line=line_of(data=data, path=("systems",)),
            key="systems",
        )
    removed = data.get("removed") or {}
    if not isinstance(removed, dict) or not all(
        v is None or isinstance(v, str) for v in removed.values()
    ):
        raise ProfileError("must map names to a message", file=path, key="removed")
    return removed, {
        name: _read_system(path=path, name=name, raw=raw, systems=systems)
        for name, raw in systems.items()
    }


def _check_top_level(data, *, path):
    """Refuse a profile file of unknown keys or another format version."""
    if not isinstance(data, dict) or set(data) - {"systems", "version", "removed"}:
        raise ProfileError(
            "the top level must be a mapping with a 'systems' key "
            "(and optionally 'version' and 'removed')",
            file=path,
        )
    version = data.get("version", PROFILE_FORMAT_VERSION)
    if version != PROFILE_FORMAT_VERSION or isinstance(version, bool):
        raise ProfileError(
            f"unknown format version {version!r}: this cotainr-lumi reads version "
            f"{PROFILE_FORMAT_VERSION}; write 'version: {PROFILE_FORMAT_VERSION}' "
            "(or leave it out), or upgrade cotainr-lumi",
            file=path,
            line=line_of(data=data, path=("version",)),
            key="version",
        )


def _read_system(*, path, name, raw, systems):
    """Check one system of a profile file; its settings are read typed."""
    line = line_of(data=systems, path=(name,))
    if not isinstance(name, str) or not name.strip():
        raise ProfileError(f"invalid system name {name!r}", file=path, line=line)
    if not isinstance(raw, dict):
        raise ProfileError(
            "a system must be a mapping of keys", file=path, line=line, system=name
        )

    def error(message, key):
        line = line_of(data=raw, path=(key,))
        return ProfileError(message, file=path, line=line, system=name, key=key)

    unknown = sorted(set(raw) - _SYSTEM_KEYS)
    if unknown:
        known = ", ".join(sorted(_SYSTEM_KEYS))
        raise error(f"unknown key (known keys: {known})", unknown[0])
    follows = raw.get("follows")
    if follows is not None and (not isinstance(follows, str) or not follows.strip()):
        raise error("must name a system of LUST's systems.json, e.g. lumi-g", "follows")
    system = dict(raw)
    if "settings" in raw:
        system["settings"] = load_sections(
            sections=sections(),
            raw=raw["settings"],
            origin=ProfileOrigin(file=path, system=name, data=raw),
        )
    return system


def merge_mappings(base, over):
    """A copy of `base` with `over` merged in (nested mappings key by key)."""
    result = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_mappings(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


class Systems(dict):
    """The systems by name; ``removed``: retired names and their messages."""

    removed: dict = {}


def site_systems():
    """(the file, {name: base-image}) of LUST's ``systems.json``; (None, {}) if none."""
    path = _cotainr.site_systems_file()
    if path is None:
        return None, {}
    data = read_yaml(
        path=path,
        error=lambda message: ProfileError(f"LUST's systems.json {message}", file=path),
    )
    problem = (
        'LUST\'s systems.json must map system names to {"base-image": IMAGE}; '
        "fix the file or unset EBROOTCOTAINR"
    )
    if not isinstance(data, dict):
        raise ProfileError(problem, file=path)
    bases = {}
    for name, system in data.items():
        image = system.get("base-image") if isinstance(system, dict) else None
        if not isinstance(name, str) or not isinstance(image, str) or not image:
            raise ProfileError(problem, file=path, system=name)
        bases[name] = image
    return str(path), bases


def _last_with(definitions, key):
    return next((d for _, d in reversed(definitions) if key in d), None)


def _follow_site(raw, *, history):
    """Give the systems that follow LUST's systems.json its base images.

    Not those whose base-image a file after the one setting `follows` sets.
    """
    followers = {
        name: raw[name]["follows"]
        for name, defined in history.items()
        if name in raw
        and raw[name].get("follows")
        and _last_with(defined, "base-image") is _last_with(defined, "follows")
    }
    if not followers:
        return {}
    site_file, bases = site_systems()
    found = {}
    for name, site_name in followers.items():
        found[name] = SiteBase(
            name=site_name,
            default=raw[name]["base-image"],
            site_file=site_file,
            site=bases.get(site_name),
        )
        raw[name]["base-image"] = bases.get(site_name) or raw[name]["base-image"]
    return found


def load_systems(*, files=None, include_stock=True):
    """Read, merge, resolve and validate all systems."""
    files = profile_files() if files is None else [Path(f) for f in files]
    raw, history, removed = _read_profiles(files)
    systems = Systems()
    systems.removed = removed
    if include_stock:
        systems.update(_stock_profiles(exclude=raw))
    sources = {name: [file for file, _ in read] for name, read in history.items()}
    site_bases = _follow_site(raw, history=history)
    for name in raw:
        systems[name] = _validate(
            name=name,
            merged=_resolve(name=name, raw=raw, sources=sources),
            sources=sources[name],
            site_base=site_bases.get(name),
        )
    return systems


def _read_profiles(files):
    """The systems of `files` merged, each one's (file, definition)s, the retired."""
    raw = {}
    history = {}
    removed = {}
    for path in files:
        gone, defined = _read_profile_file(path)
        removed.update(gone)
        for name, definition in defined.items():
            removed.pop(name, None)  # defined again after its removal
            raw[name] = merge_mappings(raw.get(name, {}), definition)
            history.setdefault(name, []).append((str(path), definition))
    removed = {name: text for name, text in removed.items() if text}
    for name in removed:
        raw.pop(name, None)
    return raw, history, removed


def _stock_profiles(*, exclude):
    """The systems of cotainr itself that no profile defines."""
    file = str(_cotainr.stock_systems_file())
    return {
        name: SystemProfile(
            name=name,
            base_image=str(definition["base-image"]),
            description="stock cotainr system",
            sources=(file,),
            stock=True,
        )
        for name, definition in _cotainr.stock_systems().items()
        if name not in exclude
    }


def _resolve(*, name, raw, sources, chain=()):
    """One system's keys over those of the system it `extends` (that one validated)."""
    where = {"file": sources[name][-1], "system": name}
    if name in chain:
        cycle = " -> ".join((*chain, name))
        raise ProfileError(f"'extends' forms a cycle: {cycle}", key="extends", **where)
    merged = raw[name]
    parent = merged.get("extends")
    if parent is None:
        return merged
    if parent not in raw:
        raise ProfileError(
            f"extends unknown system {parent!r} (profile systems: "
            f"{', '.join(sorted(raw))})",
            key="extends",
            **where,
        )
    base = _resolve(name=parent, raw=raw, sources=sources, chain=(*chain, name))
    _validate(name=parent, merged=base, sources=sources[parent])
    return merge_mappings(base, merged)


def _validate(*, name, merged, sources, site_base=None):
    """Check the keys of a resolved system and build its SystemProfile."""
    where = {"file": sources[-1], "system": name}
    base_image = merged.get("base-image")
    if not isinstance(base_image, str) or not base_image.strip():
        raise ProfileError(
            "'base-image' is required and must be a non-empty string "
            "(a .sif path or an Apptainer build spec such as docker://...)",
            key="base-image",
            **where,
        )
    description = merged.get("description") or ""
    if not isinstance(description, str):
        raise ProfileError("must be a string", key="description", **where)
    settings = merged.get("settings") or {}
    return SystemProfile(
        name=name,
        base_image=base_image,
        description=description,
        stages=_stage_list(merged.get("stages") or [], where=where),
        settings=copy.deepcopy(settings),
        rocm_version=_rocm_version(merged.get("rocm-version"), where=where),
        sources=tuple(sources),
        site_base=site_base,
        mpi_host=_host_binding(settings, where=where),
    )


def _host_binding(settings, *, where):
    """The system's ``lumi-env.mpi-host`` as read once (None: no host binding)."""
    key = ("settings", "lumi-env", "mpi-host")
    try:
        return HostBinding.from_setting(settings.get(key[1], {}).get(key[2]))
    except SettingError as e:
        raise ProfileError(e.message, key=dotted((*key, *e.path)), **where) from None


def _rocm_version(value, *, where):
    """A system's ``rocm-version`` as text (None: not set)."""
    if value is None:
        return None
    if not re.fullmatch(r"[0-9]+\.[0-9]+", str(value)):
        raise ProfileError(
            f'must be a ROCm major.minor such as "6.2" (got {str(value)!r})',
            key="rocm-version",
            **where,
        )
    return str(value)


def _stage_list(stages, *, where):
    """A system's ``stages``, checked: known, each once."""
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise ProfileError("must be a list of stage names", key="stages", **where)
    known = sorted(stage.name for stage in builtin.PIPELINE)
    unknown = [s for s in stages if s not in known]
    if unknown:
        what = f"unknown stage {unknown[0]!r} (available stages: {', '.join(known)})"
        raise ProfileError(what, key="stages", **where)
    if len(set(stages)) != len(stages):
        raise ProfileError("a stage is listed twice", key="stages", **where)
    return tuple(stages)


def get_system(*, name, systems=None):
    """Look up one system, with a helpful error."""
    systems = load_systems() if systems is None else systems
    if name not in systems:
        removed = getattr(systems, "removed", {}).get(name)
        raise UnknownSystemError(name, available=list(systems), removed=removed)
    return systems[name]
