"""A build request resolved against the profiles into a plan (shown by --dry-run)."""

from dataclasses import dataclass, field
import glob
import logging
import os
from pathlib import Path
import re
from typing import Any, Optional

from .. import _cotainr, apptainer
from .. import stages as builtin
from ..engine import layer, rocmwindow, targetenv, workdir
from ..engine.origins import Origin
from ..engine.settings import load_sections
from ..engine.stage import BaseImage, BuildFacts, Stage
from ..engine.yamlfile import read_yaml
from ..errors import InputError, quoted
from .profiles import (
    ENGINE_SECTIONS,
    SystemProfile,
    get_system,
    merge_mappings,
    sections,
)

logger = logging.getLogger(f"cotainr.{__name__}")

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked for."""

    image_path: Any
    system: Optional[str] = None
    base_image: Optional[str] = None
    base_image_override: Optional[str] = None
    conda_env: Any = None
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    skip_stages: tuple[str, ...] = ()
    force: bool = False
    accept_licenses: bool = False


def base_image_from_spec(spec, *, pattern=None):
    """The base image `spec` names, resolved when it is a local file."""
    spec = str(spec)
    path = Path(spec).expanduser()
    if not is_uri(spec) and path.is_file():
        link = None
        if path.is_symlink():
            link = os.path.normpath(path.parent.absolute() / os.readlink(path))
        return BaseImage(
            given=spec,
            resolved=os.path.realpath(path),
            is_local_file=True,
            pattern=pattern,
            link=link,
        )
    return BaseImage(given=spec, resolved=spec, is_local_file=False, pattern=pattern)


def is_uri(spec):
    """Whether a base image spec is a URI (``docker://...``)."""
    return bool(_URI_RE.match(spec))


def match_base_image(spec, *, system):
    """The one file a base image glob matches (itself off LUMI: no such directory)."""
    where = os.path.expanduser(spec)
    if is_uri(spec) or not set("*?[") & set(os.path.basename(spec)):
        return spec
    directory = os.path.dirname(where)
    if os.path.exists(where) or not os.path.isdir(directory):
        return spec  # (a name with a literal "[": itself)
    pattern = os.path.join(glob.escape(directory), os.path.basename(where))
    found = sorted(glob.glob(pattern))
    if len(found) == 1:
        return found[0]
    what = "no file"
    if found:
        what = f"{len(found)} files: {', '.join(found)}"
    raise InputError(
        f"The base image {spec} of system {system} matches {what}; it must match "
        f"one. Pin one with --lumi-system {system} --base-image FILE."
    )


@dataclass(frozen=True)
class BuildPlan:
    """
    The resolved plan of a build: fixed once made (no I/O of its own).

    Attributes
    ----------
    mount_problem : str or None
        Why the base is unpacked, not mounted read-only (None: mounted).
    layer_problem : str or None
        Why the image is squashed whole, not a layer on the base (None: a layer).
    facts : BuildFacts
        What the stages read of the build.
    """

    request: BuildRequest
    image_path: Path
    system: Optional[SystemProfile]
    base_image: BaseImage
    conda_envs: tuple[Path, ...]
    stages: tuple[Stage, ...]
    skipped: tuple[str, ...]
    extended: bool
    image_exists: bool
    work_dir: Path
    target_settings: targetenv.TargetEnvSettings
    build_settings: workdir.BuildSettings
    rocm_settings: rocmwindow.RocmSettings
    mount_problem: Optional[str]
    layer_problem: Optional[str]
    facts: BuildFacts

    @property
    def conda_env(self):
        """The conda environment file that creates the env (None: no env)."""
        if self.conda_envs:
            return self.conda_envs[0]
        return None

    @property
    def stage_names(self):
        """The names of the stages to run, in order."""
        return self.facts.stage_names

    @property
    def layer_only(self):
        """Whether the image is only the layer, a squashfs file on the base SIF."""
        return self.facts.layer_only


def _absolute(path, *, what):
    """`path` made absolute with links resolved, or one error (loops, ~user)."""
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:
        raise InputError(
            f"The {what} {quoted(str(path))} cannot be resolved ({e}); give a "
            "path without a symlink loop or an unknown ~user."
        ) from None


def _image_path(request):
    """The absolute image path, checked."""
    image_path = _absolute(request.image_path, what="image path")
    if image_path.is_dir():
        raise InputError(
            f"The image path {image_path} is a directory; give a file name "
            "such as my-image.sif."
        )
    if not image_path.parent.is_dir():
        raise InputError(
            f"The directory of the image path does not exist: {image_path.parent}. "
            "Create it first."
        )
    return image_path


def _conda_env_file(path):
    """One conda environment file, absolute, checked readable by conda."""
    conda_env = _absolute(path, what="conda environment file")
    if not conda_env.is_file():
        raise InputError(f"The conda environment file {conda_env} does not exist.")
    data = read_yaml(
        path=conda_env,
        error=lambda message: InputError(
            f"The conda environment file {conda_env} {message}."
        ),
    )
    if not isinstance(data, dict):
        raise InputError(
            f"The conda environment file {conda_env} must be a YAML mapping with "
            "'dependencies' (and optionally 'name' and 'channels'), got "
            f"{type(data).__name__}."
        )
    return conda_env


def _conda_envs(request):
    """The absolute conda environment files, each checked (may be empty)."""
    given = request.conda_env
    if given is None:
        return ()
    if isinstance(given, (str, os.PathLike)):
        given = [given]
    files = tuple(_conda_env_file(path) for path in given)
    if len(files) > 1 and not _cotainr.takes_several_conda_envs():
        raise InputError(
            f"cotainr {_cotainr.COTAINR_VERSION} takes one conda environment "
            f"file; got {len(files)}. Put the packages that must be installed "
            "after others in pip steps (--pip-requirements or --pip-steps)."
        )
    return files


def _check_outputs_apart(image_path, stages, facts):
    """No output of the build (image, module files, ...) lands on another."""
    outputs = [("the image", Path(os.path.abspath(image_path)))]
    for stage in stages:
        for path in stage.planned_outputs(build=facts):
            outputs.append((f"{stage.name}'s output", Path(os.path.abspath(path))))
    for i, (what, path) in enumerate(outputs):
        for other_what, other in outputs[:i]:
            if path == other or other in path.parents or path in other.parents:
                raise InputError(
                    f"{what} {path} and {other_what} {other} would land on each "
                    "other. Choose another image name, or move the module files "
                    "(--set lumi-env.module-dir=DIR or lumi-env.module-name=NAME)."
                )


def _is_extended(*, system, given, overrides):
    """Whether cotainr-lumi takes part: a system of its own, or settings given."""
    stock = system is None or system.stock
    return not stock or bool(given) or bool(overrides.get(targetenv.SETTINGS_NAME))


def _stage_names(*, request, system, given, extended):
    """The stages of the build in order."""
    names = []
    if system is not None and not system.stock:
        names = list(system.stages)
    elif extended:  # a stock build with stage settings: those stages
        names = [s.name for s in builtin.PIPELINE if s.name in given or s.always]
    _check_named_stages(names, given=given, skip=request.skip_stages)
    return names


def _check_named_stages(names, *, given, skip):
    """Refuse settings for, or skipping, a stage the build does not run."""
    listed = ", ".join(names) or "none"
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InputError(
            f"Settings were given for stage(s) {', '.join(unknown)}, "
            f"which this build does not run (its stages: {listed})."
        )
    not_run = [name for name in skip if name not in names]
    if not_run:
        raise InputError(
            f"Cannot skip stage {not_run[0]!r}: this build's stages are {listed}."
        )


def _mount_problem(*, base, layered, layers, conda_envs):
    """Why the base is not mounted read-only (None: it is)."""
    if conda_envs:
        return "a conda env is installed"
    if not (base.is_local_file and apptainer.is_sif(base.resolved)):
        return "the base image is not a local SIF file"
    if not (layered or layers):  # flattening a base without layers: unpacked
        return "--flatten (build.layered=false)"
    return layer.mount_problem(base.resolved)


def _layering(*, base, build_settings, conda_envs, extended):
    """Why the base is not mounted, and why the image is not a layer (None: it is)."""
    layered = build_settings.layered
    layers = base.is_local_file and layer.overlays(base.resolved)
    mount = _mount_problem(
        base=base, layered=layered, layers=layers, conda_envs=conda_envs
    )
    if layers and mount:  # unpacking it would leave its layers out
        raise layer.refusal(base.given, mount)
    if layers and not extended:
        raise InputError(
            f"The base image {base.given} has layers (SIF overlay partitions), "
            "which unpacking it would leave out; stock cotainr unpacks it: build "
            "with --lumi-system NAME, which mounts it."
        )
    if not layered:
        return mount, "--flatten (build.layered=false)"
    return mount, mount


def _base_image(request, system):
    """The base image the request names, or its system's (a glob matched)."""
    spec = request.base_image or request.base_image_override
    if spec:
        return base_image_from_spec(spec)
    matched = match_base_image(system.base_image, system=system.name)
    pattern = None
    if matched != system.base_image:
        pattern = system.base_image
    return base_image_from_spec(matched, pattern=pattern)


def _check_request(request):
    """Refuse what the options cannot mean together."""
    if (request.system is None) == (request.base_image is None):
        raise InputError(
            "Give exactly one of a system (--system) and a base image (--base-image)."
        )
    if request.system is None and request.base_image_override:
        raise InputError(
            "--base-image-override only applies to --system builds; "
            "use --base-image alone."
        )


def _stages(names, *, request, settings):
    """The stages to run (instantiated), and those skipped with the reason."""
    classes = {stage.name: stage for stage in builtin.PIPELINE}
    stages = []
    skipped = [f"{n} (skipped on request)" for n in names if n in request.skip_stages]
    for name in names:
        if name in request.skip_stages:
            continue
        stage = classes[name](settings=settings(name))
        if stage.enabled():
            stages.append(stage)
        else:
            skipped.append(f"{name} (disabled by its settings)")
    return tuple(stages), tuple(skipped)


def make_plan(*, request, systems=None):
    """Resolve a request into a plan."""
    _check_request(request)
    image_path = _image_path(request)
    conda_envs = _conda_envs(request)
    tree = sections()
    overrides = load_sections(sections=tree, raw=request.settings, origin=Origin())
    system = None
    if request.system is not None:
        system = get_system(name=request.system, systems=systems)
    given = [name for name in overrides if name not in ENGINE_SECTIONS]
    extended = _is_extended(system=system, given=given, overrides=overrides)
    names = _stage_names(request=request, system=system, given=given, extended=extended)

    def settings(name):
        profile = system.stage_settings(name) if system is not None else {}
        return tree[name].complete(merge_mappings(profile, overrides.get(name, {})))

    base = _base_image(request, system)
    build_settings = settings(workdir.SETTINGS_NAME)
    mount, layer_problem = _layering(
        base=base,
        build_settings=build_settings,
        conda_envs=conda_envs,
        extended=extended,
    )
    stages, skipped = _stages(names, request=request, settings=settings)
    facts = BuildFacts(
        image_path=image_path,
        system=system.name if system is not None else None,
        profile_sources=tuple(system.sources) if system is not None else (),
        base_image=base,
        conda_envs=conda_envs,
        stages=tuple((s.name, s.settings.to_dict()) for s in stages),
        layer_only=layer_problem is None and build_settings.layer_only,
        rocm_version=system.rocm_version if system is not None else None,
        target_settings=settings(targetenv.SETTINGS_NAME),
    )
    _check_outputs_apart(image_path, stages, facts)
    return BuildPlan(
        request=request,
        image_path=image_path,
        system=system,
        base_image=base,
        conda_envs=conda_envs,
        stages=stages,
        skipped=skipped,
        extended=extended,
        image_exists=image_path.exists(),
        work_dir=workdir.resolve_work_dir(build_settings.work_dir),
        target_settings=facts.target_settings,
        build_settings=build_settings,
        rocm_settings=settings(rocmwindow.SETTINGS_NAME),
        mount_problem=mount,
        layer_problem=layer_problem,
        facts=facts,
    )
