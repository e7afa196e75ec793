"""The cotainr-lumi options of ``cotainr build`` and the request they make."""

import argparse

from . import stages as builtin
from .engine.origins import Origin
from .engine.settings import load_sections
from .engine.yamlfile import read_yaml_text
from .errors import InputError, quoted
from .pipeline.plan import BuildRequest
from .pipeline.profiles import merge_mappings, sections


def add_options(*, parser):
    """Add the cotainr-lumi options to a ``build`` parser."""
    parser.add_argument(
        "--lumi-system",
        metavar="NAME",
        help="with --base-image: build as the cotainr-lumi system NAME does, on "
        "this base image (e.g. an image you built with NAME, to add packages to it)",
    )
    parser.add_argument(
        "--set",
        dest="set_settings",
        action="append",
        metavar="STAGE.KEY=VALUE",
        help="override a stage setting of the system profile, as STAGE.KEY=VALUE "
        "with VALUE in YAML, or a whole stage's settings as STAGE=MAPPING "
        "(repeatable)",
    )
    parser.add_argument(
        "--work-dir",
        metavar="DIR",
        help="put the sandbox and Apptainer's temporary files in DIR (a file "
        "system with room for the unpacked image; on LUMI not /tmp, which is in "
        "memory on compute nodes)",
    )
    parser.add_argument(
        "--flatten",
        action="store_true",
        help="squash the whole image again, also where the change could be a "
        "layer on a SIF base (build.layered=false)",
    )
    parser.add_argument(
        "--layer-only",
        action="store_true",
        help="write only the layer at the image path, no copy of the SIF base; "
        "the module file and shell snippet mount it on the base (build.layer-only)",
    )
    parser.add_argument(
        "--skip-stage",
        dest="skip_stages",
        action="append",
        metavar="STAGE",
        help="do not run this stage of the system (repeatable)",
    )
    for stage in builtin.PIPELINE:
        stage.add_arguments(parser=parser)


def _parse_set(text):
    """``STAGE.KEY=VALUE`` or ``STAGE=MAPPING`` (YAML): (stage, key or "", value)."""
    name, sep, raw_value = text.partition("=")
    stage, dot, key = name.partition(".")
    if not sep or not stage or (dot and not key):
        raise InputError(
            f"--set {quoted(text)}: expected STAGE.KEY=VALUE, e.g. "
            "--set provenance.hash-base-image=false"
        )

    if "." in key:
        outer, _, inner = key.partition(".")
        raise InputError(
            f"--set {quoted(text)}: {stage}.{outer} is set as a whole; give "
            f"--set '{stage}.{outer}={{{inner}: VALUE, ...}}' with its other keys"
        )

    def error(message):
        return InputError(
            f"--set {quoted(text)}: the value {message}; quote strings with "
            "special characters, e.g. --set 'lumi-env.path=[\"/x\"]'"
        )

    value = read_yaml_text(text=raw_value, error=error) if raw_value.strip() else ""
    if not dot and not isinstance(value, dict):
        raise InputError(
            f"--set {quoted(text)}: expected STAGE={{KEY: VALUE, ...}} "
            "or STAGE.KEY=VALUE"
        )
    return stage, key, value


def stage_settings(*, set_settings, stage_args):
    """The settings the stage options and ``--set`` give, in that order."""

    def load(stage, values, *, option):
        origin, raw = Origin(option=option), {stage: values}
        return load_sections(sections=sections(), raw=raw, origin=origin)[stage]

    settings = {}
    for stage in builtin.PIPELINE:
        if overrides := stage.settings_from_args(args=stage_args):
            option = f"the {stage.name} options"
            settings[stage.name] = load(stage.name, overrides, option=option)
    for text in set_settings:
        stage, key, value = _parse_set(text)
        if key:  # checked now, to name the option; STAGE={...} when planned
            value = load(stage, {key: value}, option=f"--set {text!r}")
        settings[stage] = merge_mappings(settings.get(stage, {}), value)
    return settings


def request_from_options(*, context, conda_env):
    """The build request of a build hook's context."""
    options = dict(context.options)
    set_settings = options.pop("set_settings", None) or []
    skip_stages = options.pop("skip_stages", None) or ()
    work_dir = options.pop("work_dir", None)
    lumi_system = options.pop("lumi_system", None)
    if lumi_system and context.system is not None:
        raise InputError(
            "--lumi-system goes with --base-image (build as that system on "
            "another base image); with --system, leave it out."
        )
    settings = stage_settings(
        set_settings=set_settings, stage_args=argparse.Namespace(**options)
    )
    if work_dir is not None:
        settings.setdefault("build", {})["work-dir"] = str(work_dir)
    if options.pop("flatten", False):
        settings.setdefault("build", {})["layered"] = False
    if options.pop("layer_only", False):
        settings.setdefault("build", {})["layer-only"] = True
    return BuildRequest(
        image_path=context.image_path,
        system=lumi_system or context.system,
        base_image=None if lumi_system or context.system else context.base_image,
        base_image_override=context.base_image if lumi_system else None,
        conda_env=conda_env,
        settings=settings,
        skip_stages=tuple(skip_stages),
    )
