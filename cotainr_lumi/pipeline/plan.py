"""A build request resolved against the profiles into a plan (shown by --dry-run)."""

from dataclasses import dataclass, field
import glob
import logging
import os
from pathlib import Path
import re
import subprocess
from typing import Any, Optional

from .. import _cotainr, apptainer
from .. import stages as builtin
from ..engine import imageprobe, layer, rocmwindow, targetenv, workdir
from ..engine.origins import Origin
from ..engine.settings import load_sections
from ..engine.stage import Stage
from ..engine.yamlfile import read_yaml
from ..errors import InputError, quoted, redact
from ..imagelayout import ENV_SCRIPTS_DIR
from .profiles import (
    ENGINE_SECTIONS,
    SystemProfile,
    get_system,
    merge_mappings,
    sections,
)

logger = logging.getLogger(f"cotainr.{__name__}")

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass
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


@dataclass
class BaseImage:
    """The base image as given and as resolved."""

    given: str
    resolved: str
    is_local_file: bool
    pattern: Optional[str] = None  # the profile's glob that matched `given`

    @classmethod
    def from_spec(cls, spec):
        """Resolve a base image spec."""
        spec = str(spec)
        path = Path(spec).expanduser()
        if not _URI_RE.match(spec) and path.is_file():
            return cls(given=spec, resolved=os.path.realpath(path), is_local_file=True)
        return cls(given=spec, resolved=spec, is_local_file=False)


def match_base_image(spec, *, system):
    """The one file a base image glob matches (itself off LUMI: no such directory)."""
    where = os.path.expanduser(spec)
    if _URI_RE.match(spec) or not set("*?[") & set(os.path.basename(spec)):
        return spec
    directory = os.path.dirname(where)
    if os.path.exists(where) or not os.path.isdir(directory):
        return spec  # (a name with a literal "[": itself)
    pattern = os.path.join(glob.escape(directory), os.path.basename(where))
    found = sorted(glob.glob(pattern))
    if len(found) == 1:
        return found[0]
    what = f"{len(found)} files: {', '.join(found)}" if found else "no file"
    raise InputError(
        f"The base image {spec} of system {system} matches {what}; it must match "
        f"one. Pin one with --lumi-system {system} --base-image FILE."
    )


@dataclass
class BuildPlan:
    """The resolved plan."""

    request: BuildRequest
    image_path: Path
    system: Optional[SystemProfile]
    base_image: BaseImage
    conda_envs: tuple[Path, ...]
    stages: list[Stage]
    skipped: list[str]
    extended: bool
    image_exists: bool
    target_settings: targetenv.TargetEnvSettings
    build_settings: workdir.BuildSettings
    rocm_settings: rocmwindow.RocmSettings
    base_target: Any = None
    base_facts: Any = None
    base_problem: Optional[str] = None
    #: Why the base is unpacked, not mounted read-only (None: mounted).
    mount_problem: Optional[str] = "not planned"
    #: Why the image is squashed whole, not a layer on the base (None: a layer).
    layer_problem: Optional[str] = "not planned"

    @property
    def stage_names(self):
        """The names of the stages to run, in order."""
        return [stage.name for stage in self.stages]

    @property
    def target_environment(self):
        """Where Python packages go in this build, in words."""
        return targetenv.describe_lines(plan=self)[0]

    def check_base_links(self):
        """Refuse a local base image whose metadata Apptainer writes is a link."""
        image = self.base_image.resolved
        if not (self.base_image.is_local_file or os.path.isdir(image)):
            return
        paths = apptainer.SANDBOX_METADATA
        if self.conda_env is not None:  # cotainr's conda step appends there
            paths += (ENV_SCRIPTS_DIR, f"{ENV_SCRIPTS_DIR}/92-cotainr-env.sh")
        try:
            links = apptainer.links_in_image(image=image, paths=paths)
        except (OSError, subprocess.SubprocessError) as e:
            links = None
            logger.debug("Listing the base image failed: %s", e)
        if links is None:
            logger.warning(
                "Could not read the base image %s without running it (no "
                "unsquashfs?); its /.singularity.d is not checked for links.",
                image,
            )
        if links:
            path, target = next(iter(links.items()))
            raise InputError(
                f"The base image's {path} is a symbolic link (to {target}); "
                "the build writes there before any cotainr-lumi stage runs, and "
                "a link can lead out of the image (to a host file). Use a base "
                f"image where {path} is not a link."
            )

    def ask_base_image(self):
        """For a dry run: probe a local base image once (facts, target, problem)."""
        if self.base_target is not None or self.base_facts is not None:
            return
        if not self.base_image.is_local_file:
            return
        explicit = self.target_settings.prefix or None
        timeout = self.target_settings.probe_timeout
        try:
            self.base_facts = imageprobe.probe_image_facts(
                image=self.base_image.resolved, explicit=explicit, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            self.base_problem = imageprobe.timeout_message(timeout)
        except (OSError, subprocess.CalledProcessError) as e:
            text = (getattr(e, "stderr", None) or "").strip()
            why = " | ".join(text.splitlines()[-3:])[-300:] or getattr(
                e, "strerror", f"exit status {getattr(e, 'returncode', '')}, no message"
            )
            self.base_problem = (
                f"the probe of the base image failed ({why})"
                + apptainer.env_deadline_hint(text, image="the base image")
            )
        if self.base_problem:
            self.base_target = targetenv.TargetEnvNotFoundError(self.base_problem)
            return
        if self.base_facts is None or explicit or self.conda_env is not None:
            return
        try:
            self.base_target = targetenv.choose(facts=self.base_facts)
        except targetenv.TargetEnvNotFoundError as e:
            self.base_target = e

    @property
    def conda_env(self):
        """The conda environment file that creates the env (None: no env)."""
        return self.conda_envs[0] if self.conda_envs else None

    @property
    def layer_only(self):
        """Whether the image is only the layer, a squashfs file on the base SIF."""
        return self.layer_problem is None and self.build_settings.layer_only

    @property
    def work_dir(self):
        """The build's work directory (:func:`engine.workdir.resolve_work_dir`)."""
        return workdir.resolve_work_dir(self.build_settings.work_dir)

    def check_space(self):
        """Refuse a build that will not fit in its work directory."""
        image, unpacked, sifs = self.base_image.resolved, None, 2
        if self.layer_problem is None:  # nothing unpacked; a copy of the base
            unpacked, sifs = 0, 0 if self.layer_only else 1
        elif self.base_image.is_local_file:
            unpacked = apptainer.unpacked_bytes(image=image)
        return workdir.check_space(
            work_dir=self.work_dir,
            base_image=image,
            conda_env=self.conda_env,
            unpacked=unpacked,
            sifs=sifs,
            refuse=self.build_settings.check_space,
        )

    def describe(self):
        """The dry-run description of the plan."""
        lines = ["cotainr-lumi build plan (dry run: nothing is built)"]
        lines += self._describe_inputs()
        needed, free = self.check_space()
        estimate = f"needs about {needed / 1024**3:.1f} GiB, " if needed else ""
        lines.append(
            f"  work dir:   {self.work_dir} ({estimate}{free / 1024**3:.1f} GiB free)"
        )
        for title, answer in (
            ("target env", targetenv.describe_lines(plan=self)),
            ("rocm", rocmwindow.describe_lines(plan=self)),
        ):
            lines.append(f"  {title + ':':<11} {answer[0]}")
            lines += [f"              {line}" for line in answer[1:]]
        mode = "extended cotainr-lumi pipeline" if self.extended else "stock cotainr"
        lines.append(f"  pipeline:   {mode}")
        no, base = self.layer_problem, self.base_image.resolved
        yes = f"yes, only the layer (on {base}, no copy)" if self.layer_only else "yes"
        lines.append(
            f"  layered:    {f'no, the whole image is squashed: {no}' if no else yes}"
        )
        compression = self.build_settings.compression
        lines.append(
            f"  squashfs:   {compression} (gzip where the runtime cannot run it)"
        )
        lines += self._describe_steps()
        lines += [f"  skipped: {reason}" for reason in self.skipped]
        return redact("\n".join(lines))

    def _describe_inputs(self):
        """The plan's lines on the image, system, base image and conda env."""
        lines = []
        exists = ""
        if self.image_exists and self.request.force:
            exists = " (exists: will be replaced when the build succeeds)"
        elif self.image_exists:
            exists = " (exists: the build will refuse; pass --force to overwrite)"
        lines.append(f"  image:      {self.image_path}{exists}")
        if self.system is not None:
            kind = "stock cotainr system" if self.system.stock else "profile"
            lines.append(
                f"  system:     {self.system.name} ({kind}: "
                f"{', '.join(self.system.sources)})"
            )
        else:
            lines.append("  system:     none (--base-image)")
        lines.append(f"  base image: {self.base_image.given}")
        if self.base_image.pattern:
            lines.append(f"    matched by: {self.base_image.pattern}")
        if self.base_image.is_local_file:
            if self.base_image.resolved != os.path.abspath(self.base_image.given):
                lines.append(f"    resolved: {self.base_image.resolved}")
        elif not _URI_RE.match(self.base_image.given):
            lines.append("    (not a file on this machine: the build will fail here)")
        lines.append(
            "  conda env:  " + (", ".join(map(str, self.conda_envs)) or "none")
        )
        return lines

    def _describe_steps(self):
        """The plan's numbered steps: cotainr's and the stages', in order."""
        unpack = "create the sandbox from the base image"
        if self.mount_problem is None:
            unpack = "mount the base image read-only under a writable dir (no unpack)"
        steps = [(f"cotainr: {unpack}", [])]
        if self.conda_env is not None:
            updates = [f"then update it with {f.name}" for f in self.conda_envs[1:]]
            steps.append(
                (f"cotainr: install the conda env {self.conda_env.name}", updates)
            )
        steps += [(stage.name, stage.describe(plan=self)) for stage in self.stages]
        image = "build the SIF"
        if self.layer_problem is None:
            image = "add the change as a squashfs layer to a copy of the base SIF"
            if self.layer_only:
                image = "write only the change, a squashfs layer for the base SIF"
            image += " (kept if an exec of it shows the layer, else the whole SIF)"
        image += " (written next to the target, moved into place on success)"
        steps.append((f"cotainr: add metadata labels and {image}", []))
        lines = []
        for number, (title, details) in enumerate(steps, 1):
            lines.append(f"  {number}. {title}")
            lines += [f"       {detail}" for detail in details]
        return lines


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
            f"cotainr {_cotainr.cotainr_version()} takes one conda environment "
            f"file; got {len(files)}. Put the packages that must be installed "
            "after others in pip steps (--pip-requirements or --pip-steps)."
        )
    return files


def _check_outputs_apart(plan):
    """No output of the build (image, module files, ...) lands on another."""
    outputs = [("the image", Path(os.path.abspath(plan.image_path)))]
    for stage in plan.stages:
        for path in stage.planned_outputs(plan=plan):
            outputs.append((f"{stage.name}'s output", Path(os.path.abspath(path))))
    for i, (what, path) in enumerate(outputs):
        for other_what, other in outputs[:i]:
            if path == other or other in path.parents or path in other.parents:
                raise InputError(
                    f"{what} {path} and {other_what} {other} would land on each "
                    "other. Choose another image name, or move the module files "
                    "(--set lumi-env.module-dir=DIR or lumi-env.module-name=NAME)."
                )


def _stage_names(*, request, system, overrides):
    """The stages of the build in order, and whether it is extended."""
    if system is None and request.base_image_override:
        raise InputError(
            "--base-image-override only applies to --system builds; "
            "use --base-image alone."
        )
    given = [name for name in overrides if name not in ENGINE_SECTIONS]
    stock = system is None or system.stock
    extended = not stock or bool(given or overrides.get(targetenv.SETTINGS_NAME))
    if stock and (given or (system is None and extended)):
        names = [
            stage.name
            for stage in builtin.PIPELINE
            if stage.name in given or stage.name == "provenance"
        ]
    else:
        names = list(system.stages) if system is not None else []
    unknown = sorted(name for name in given if name not in names)
    if unknown:
        raise InputError(
            f"Settings were given for stage(s) {', '.join(unknown)}, "
            f"which this build does not run (its stages: "
            f"{', '.join(names) or 'none'})."
        )
    for name in request.skip_stages:
        if name not in names:
            raise InputError(
                f"Cannot skip stage {name!r}: this build's stages are "
                f"{', '.join(names) or 'none'}."
            )
    return names, extended


def _layering(plan):
    """Why the base is not mounted, and why the image is not a layer (None: it is)."""
    base, layered = plan.base_image, plan.build_settings.layered
    flatten = "--flatten (build.layered=false)"
    layers = base.is_local_file and layer.overlays(base.resolved)
    if plan.conda_env is not None:
        mount = "a conda env is installed"
    elif not (base.is_local_file and apptainer.is_sif(base.resolved)):
        mount = "the base image is not a local SIF file"
    else:  # as before when flattening a base without layers, which need the mount
        mount = layer.mount_problem(base.resolved) if layered or layers else flatten
    if layers and (mount or not plan.extended):
        fix = "stock cotainr unpacks it: build with --lumi-system NAME, which mounts it"
        if mount:
            fix = (
                f"it is not mounted here ({mount}): squash it whole first where "
                "it mounts (--flatten, without --conda-env) and build on that"
            )
        raise InputError(
            f"The base image {base.given} has layers (SIF overlay partitions), "
            f"which unpacking it would leave out; {fix}."
        )
    return mount, (mount if layered else flatten)


def make_plan(*, request, systems=None):
    """Resolve a request into a plan."""
    if (request.system is None) == (request.base_image is None):
        raise InputError(
            "Give exactly one of a system (--system) and a base image (--base-image)."
        )
    image_path = _image_path(request)
    conda_envs = _conda_envs(request)
    tree = sections()
    overrides = load_sections(sections=tree, raw=request.settings, origin=Origin())
    system = None
    if request.system is not None:
        system = get_system(name=request.system, systems=systems)
    names, extended = _stage_names(request=request, system=system, overrides=overrides)

    def settings(name):
        profile = system.stage_settings(name) if system is not None else {}
        return tree[name].complete(merge_mappings(profile, overrides.get(name, {})))

    classes = {stage.name: stage for stage in builtin.PIPELINE}
    spec = request.base_image or request.base_image_override
    base = BaseImage.from_spec(
        spec or match_base_image(system.base_image, system=system.name)
    )
    if not spec and base.given != system.base_image:
        base.pattern = system.base_image
    plan = BuildPlan(
        request=request,
        image_path=image_path,
        system=system,
        base_image=base,
        conda_envs=conda_envs,
        stages=[],
        skipped=[
            f"{n} (skipped on request)" for n in names if n in request.skip_stages
        ],
        extended=extended,
        image_exists=image_path.exists(),
        target_settings=settings(targetenv.SETTINGS_NAME),
        rocm_settings=settings(rocmwindow.SETTINGS_NAME),
        build_settings=settings(workdir.SETTINGS_NAME),
    )
    plan.mount_problem, plan.layer_problem = _layering(plan)
    for name in names:
        if name in request.skip_stages:
            continue
        stage = classes[name](settings=settings(name))
        if stage.enabled(plan=plan):
            plan.stages.append(stage)
        else:
            plan.skipped.append(f"{name} (disabled by its settings)")
    _check_outputs_apart(plan)
    return plan
