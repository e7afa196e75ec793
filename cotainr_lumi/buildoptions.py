"""
The cotainr-lumi options of ``cotainr build`` and the request they make.

The options form the argument group of the "cotainr-lumi" build stage
(:class:`cotainr_lumi.plugin.LumiStage`), on cotainr's build stage seam or
its backport.

Functions
---------
add_options(*, parser, generic)
    Add the cotainr-lumi options to a ``build`` parser.
request_from_options(*, image_path, system, base_image, conda_env, accept_licenses, force, dry_run, options)
    The build request the parsed options describe.
help_text(arg)
    The help text of an option, from :data:`OPTION_HELP`.
"""

import argparse
import logging

from .engine.origins import OptionOrigin
from .engine.plan import CANONICAL_STAGE_ORDER, BuildRequest
from .engine.stage import available_stages, get_stage_class, load_stage_settings
from .engine.yamlfile import read_yaml_text
from .errors import InputError, quoted

logger = logging.getLogger(f"cotainr.{__name__}")

#: The help of the options, formatted as cotainr formats its own.
OPTION_HELP = {
    "force": "overwrite an existing image without asking (for batch jobs). The "
    "old image is replaced only when the new build succeeds",
    "dry_run": "print the resolved build plan (base image, stages in order, "
    "what each will do) and build nothing",
    "base_image_override": "use this base image instead of the system's (e.g. "
    "your own copy of a LUMI base image)",
    "set_settings": "override a stage setting of the system profile, as "
    "STAGE.KEY=VALUE with VALUE in YAML, or a whole stage's settings as "
    "STAGE=MAPPING (repeatable)",
    "skip_stages": "do not run this stage of the system (repeatable)",
    "work_dir": "put the sandbox and Apptainer's temporary files in DIR (a "
    "file system with room for the unpacked image; on LUMI not /tmp, which "
    "is in memory on compute nodes)",
    "strict": "stop the build (instead of warning) when the base image's ROCm or "
    "torch's is outside the versions LUMI's GPU driver supports (the system's "
    "rocm.supported) or they disagree; the same as --set rocm.strict=true",
}

#: Options added here that are not stage options.
GENERIC_OPTIONS = ("force", "dry_run")
BUILD_OPTIONS = (
    "base_image_override",
    "set_settings",
    "skip_stages",
    "work_dir",
    "strict",
)


def help_text(arg):
    """
    The help text of an option, from :data:`OPTION_HELP`.

    Parameters
    ----------
    arg : str
        The option's destination name.

    Returns
    -------
    text : str
        One line, as cotainr formats its own option help.
    """
    return OPTION_HELP[arg]


def stages_in_pipeline_order():
    """
    Registered stage names, the built-in ones in pipeline order first.

    Returns
    -------
    names : list of str
        The stage names.
    """
    names = available_stages()
    order = {name: i for i, name in enumerate(CANONICAL_STAGE_ORDER)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def add_options(*, parser, generic):
    """
    Add the cotainr-lumi options to a ``build`` parser.

    Parameters
    ----------
    parser : :class:`argparse.ArgumentParser` or argument group
        Where to add them.
    generic : bool
        Also add ``--force`` and ``--dry-run`` (for a cotainr that lacks them).
    """
    if generic:
        parser.add_argument("--force", action="store_true", help=help_text("force"))
        parser.add_argument("--dry-run", action="store_true", help=help_text("dry_run"))
    parser.add_argument(
        "--base-image-override",
        metavar="IMAGE",
        help=help_text("base_image_override"),
    )
    parser.add_argument(
        "--set",
        dest="set_settings",
        action="append",
        metavar="STAGE.KEY=VALUE",
        help=help_text("set_settings"),
    )
    parser.add_argument("--work-dir", metavar="DIR", help=help_text("work_dir"))
    parser.add_argument(
        "--skip-stage",
        dest="skip_stages",
        action="append",
        metavar="STAGE",
        help=help_text("skip_stages"),
    )
    parser.add_argument(
        "--strict", action="store_true", default=None, help=help_text("strict")
    )
    for name in stages_in_pipeline_order():
        get_stage_class(name).add_arguments(parser=parser)


def parse_set_option(text):
    """
    Parse ``STAGE.KEY=VALUE`` (VALUE as YAML).

    Parameters
    ----------
    text : str
        The option value.

    Returns
    -------
    stage, key, value : str, str, object
        The parts.

    Raises
    ------
    :class:`cotainr_lumi.errors.InputError`
        If the text is malformed or the value is not YAML.
    """
    name, sep, raw_value = text.partition("=")
    stage, dot, key = name.partition(".")
    if not sep or not dot or not stage or not key:
        raise InputError(
            f"--set {quoted(text)}: expected STAGE.KEY=VALUE, e.g. "
            "--set provenance.hash-base-image=false"
        )

    def error(message):
        return InputError(
            f"--set {quoted(text)}: the value {message}; quote strings with "
            "special characters, e.g. --set 'lumi-env.path=[\"/x\"]'"
        )

    value = read_yaml_text(text=raw_value, error=error) if raw_value.strip() else ""
    return stage, key, value


def stage_settings(*, set_settings, stage_args):
    """
    Collect stage setting overrides from ``--set`` and the stage options.

    Parameters
    ----------
    set_settings : list of str
        The ``--set`` values.
    stage_args : :class:`argparse.Namespace`
        The parsed stage options.

    Returns
    -------
    settings : dict
        ``{stage: {key: value}}``, read by the settings loader (typed).

    Raises
    ------
    :class:`cotainr_lumi.errors.InputError`
        For a malformed ``--set``, an unknown stage or key, or a bad value
        (the message names the option or the stage's options).
    """
    settings = {}
    for name in available_stages():
        overrides = get_stage_class(name).settings_from_args(args=stage_args)
        if overrides:
            loaded = load_stage_settings(
                raw={name: overrides},
                origin=OptionOrigin(option=f"the {name} options"),
            )
            settings.setdefault(name, {}).update(loaded[name])
    for text in set_settings:
        name, sep, raw = text.partition("=")
        if sep and name and "." not in name:
            # STAGE={...}: a whole stage's settings ({} runs it with defaults).
            value = parse_set_option(f"{name}.settings={raw}")[2]
            if not isinstance(value, dict):
                raise InputError(
                    f"--set {quoted(text)}: expected STAGE={{KEY: VALUE, ...}} "
                    "or STAGE.KEY=VALUE"
                )
            settings.setdefault(name, {}).update(value)
            continue
        stage, key, value = parse_set_option(text)
        loaded = load_stage_settings(
            raw={stage: {key: value}}, origin=OptionOrigin(option=f"--set {text!r}")
        )
        settings.setdefault(stage, {}).update(loaded[stage])
    return settings


def request_from_options(
    *,
    image_path,
    system,
    base_image,
    conda_env,
    accept_licenses,
    force,
    dry_run,
    options,
):
    """
    The build request the parsed options describe.

    Parameters
    ----------
    image_path : os.PathLike
        The image to build.
    system : str or None
        The system name.
    base_image : str or None
        The base image of a build without a system.
    conda_env : os.PathLike or list of os.PathLike or None
        The conda environment file(s).
    accept_licenses : bool
        ``--accept-licenses``.
    force : bool
        ``--force``.
    dry_run : bool
        ``--dry-run``.
    options : mapping
        The values of the options :func:`add_options` added (without
        ``force``/``dry_run``), by destination name.

    Returns
    -------
    request : :class:`cotainr_lumi.engine.plan.BuildRequest`
        The request.

    Raises
    ------
    :class:`cotainr_lumi.errors.InputError`
        For a malformed ``--set``.
    """
    options = dict(options)
    set_settings = options.pop("set_settings", None) or []
    skip_stages = options.pop("skip_stages", None) or ()
    work_dir = options.pop("work_dir", None)
    base_image_override = options.pop("base_image_override", None)
    if options.pop("strict", None):
        set_settings = ["rocm.strict=true", *set_settings]
    settings = stage_settings(
        set_settings=set_settings, stage_args=argparse.Namespace(**options)
    )
    if work_dir is not None:
        settings.setdefault("build", {})["work-dir"] = str(work_dir)
    return BuildRequest(
        image_path=image_path,
        system=system,
        base_image=base_image,
        base_image_override=base_image_override,
        conda_env=conda_env,
        settings=settings,
        skip_stages=tuple(skip_stages),
        force=force,
        dry_run=dry_run,
        accept_licenses=accept_licenses,
    )
