"""
The cotainr-lumi options of ``cotainr build`` and the request they make.

Adding the options imports no stage (``cotainr build --help`` stays quick);
the options are turned into settings when a build is planned.
"""

from .errors import InputError, quoted


def _requirements_file(value):
    return ("requirements", value)


def _steps_file(value):
    return ("steps", value)


#: The options, in the order of ``--help``: name and ``add_argument`` keywords.
OPTIONS = (
    (
        "--lumi-system",
        dict(
            metavar="NAME",
            help="with --base-image: build as the cotainr-lumi system NAME does, "
            "on this base image (e.g. an image you built with NAME, to add "
            "packages to it)",
        ),
    ),
    (
        "--set",
        dict(
            dest="set_settings",
            action="append",
            metavar="STAGE.KEY=VALUE",
            help="override a stage setting of the system profile, as "
            "STAGE.KEY=VALUE with VALUE in YAML, or a whole stage's settings as "
            "STAGE=MAPPING (repeatable)",
        ),
    ),
    (
        "--work-dir",
        dict(
            metavar="DIR",
            help="put the sandbox and Apptainer's temporary files in DIR (a file "
            "system with room for the unpacked image; on LUMI not /tmp, which is "
            "in memory on compute nodes)",
        ),
    ),
    (
        "--flatten",
        dict(
            action="store_true",
            help="squash the whole image again, also where the change could be a "
            "layer on a SIF base (build.layered=false)",
        ),
    ),
    (
        "--layer-only",
        dict(
            action="store_true",
            help="write only the layer at the image path, no copy of the SIF "
            "base; the module file and shell snippet mount it on the base "
            "(build.layer-only)",
        ),
    ),
    (
        "--skip-stage",
        dict(
            dest="skip_stages",
            action="append",
            metavar="STAGE",
            help="do not run this stage of the system (repeatable)",
        ),
    ),
    (
        "--pip-requirements",
        dict(
            dest="pip_inputs",
            action="append",
            type=_requirements_file,
            metavar="FILE",
            help="pip: install this requirements file as one step after the "
            "conda env (repeatable: one step per file, in order, mixed with "
            "--pip-steps in command line order); installed packages are "
            "protected from later steps",
        ),
    ),
    (
        "--pip-steps",
        dict(
            dest="pip_inputs",
            action="append",
            type=_steps_file,
            metavar="FILE",
            help="pip: a YAML file of pip steps with per-step settings "
            "(no-build-isolation, env, pip-args, index-url, extra-index-urls, "
            "allow-changes, installer) and system-packages; paths in it are "
            "relative to the file (repeatable)",
        ),
    ),
    (
        "--env",
        dict(
            dest="lumi_env_set",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="lumi-env: set a default environment variable in the image "
            "(overridable at run time; repeatable)",
        ),
    ),
)


def add_options(*, parser):
    """Add the cotainr-lumi options to a ``build`` parser."""
    for name, keywords in OPTIONS:
        parser.add_argument(name, **keywords)


def _env_settings(texts):
    """The lumi-env settings of ``--env NAME=VALUE`` options."""
    from .stages.lumi_env.envfile import EnvError, validate_name

    env = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep:
            raise InputError(
                f"--env {text!r}: expected NAME=VALUE (to drop a profile "
                "default: --set 'lumi-env.env={NAME: null}')"
            )
        try:
            validate_name(name)
        except EnvError as e:
            raise InputError(f"--env {text!r}: {e}") from None
        env[name] = value
    return {"env": env}


def _system_packages(inputs):
    """The system-packages settings of the pip steps files (``--pip-steps``)."""
    from .stages.system_packages.stage import packages_of_steps_file

    packages = []
    for kind, value in inputs:
        if kind == "steps":
            packages += packages_of_steps_file(value).get("packages", [])
    return {"packages": packages}


def option_settings(options):
    """The stage settings of the options ``--pip-*`` and ``--env``, by stage."""
    settings = {}
    if options.get("pip_inputs"):
        from .stages.pip.steps import steps_from_inputs

        settings["pip"] = steps_from_inputs(inputs=options["pip_inputs"])
        packages = _system_packages(options["pip_inputs"])
        if packages["packages"]:
            settings["system-packages"] = packages
    if options.get("lumi_env_set"):
        settings["lumi-env"] = _env_settings(options["lumi_env_set"])
    return settings


def _parse_set(text):
    """``STAGE.KEY=VALUE`` or ``STAGE=MAPPING`` (YAML): (stage, key or "", value)."""
    from .engine.yamlfile import read_yaml_text

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


def stage_settings(*, set_settings, options):
    """The settings the stage options and ``--set`` give, in that order."""
    from .engine.origins import Origin
    from .engine.settings import load_sections
    from .pipeline.profiles import merge_mappings, sections

    def load(stage, values, *, option):
        origin = Origin(option=option)
        raw = {stage: values}
        return load_sections(sections=sections(), raw=raw, origin=origin)[stage]

    settings = {}
    for stage, overrides in option_settings(options).items():
        settings[stage] = load(stage, overrides, option=f"the {stage} options")
    for text in set_settings:
        stage, key, value = _parse_set(text)
        if key:  # checked now, to name the option; STAGE={...} when planned
            value = load(stage, {key: value}, option=f"--set {text!r}")
        settings[stage] = merge_mappings(settings.get(stage, {}), value)
    return settings


def request_from_options(*, context, conda_env):
    """The build request of a build hook's context."""
    from .pipeline.plan import BuildRequest

    options = context.options
    lumi_system = options.get("lumi_system")
    if lumi_system and context.system is not None:
        raise InputError(
            "--lumi-system goes with --base-image (build as that system on "
            "another base image); with --system, leave it out."
        )
    settings = stage_settings(
        set_settings=options.get("set_settings") or [], options=options
    )
    build = _build_settings(options)
    if build:
        settings["build"] = {**settings.get("build", {}), **build}
    base_image = context.base_image
    if lumi_system or context.system:
        base_image = None
    override = None
    if lumi_system:
        override = context.base_image
    return BuildRequest(
        image_path=context.image_path,
        system=lumi_system or context.system,
        base_image=base_image,
        base_image_override=override,
        conda_env=conda_env,
        settings=settings,
        skip_stages=tuple(options.get("skip_stages") or ()),
    )


def _build_settings(options):
    """The ``build`` settings of ``--work-dir``, ``--flatten`` and ``--layer-only``."""
    settings = {}
    if options.get("work_dir") is not None:
        settings["work-dir"] = str(options["work_dir"])
    if options.get("flatten"):
        settings["layered"] = False
    if options.get("layer_only"):
        settings["layer-only"] = True
    return settings
