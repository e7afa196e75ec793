"""
The Python API for build scripts.

Example
-------
>>> import cotainr_lumi
>>> result = cotainr_lumi.build(
...     image_path="pytorch.sif",
...     system="lumi-g-ext",
...     conda_env="env.yml",
...     settings={"provenance": {"hash-base-image": False}},
...     force=True,
... )  # doctest: +SKIP
>>> result.labels["cotainr-lumi.system"]  # doctest: +SKIP
'lumi-g-ext'

Functions
---------
plan(**request)
    Resolve a build into a plan without building.
build(**request)
    Build an image and return what was built.
"""

import logging

from . import _cotainr
from .engine.pipeline import run_plan
from .engine.plan import BuildRequest, make_plan

logger = logging.getLogger(f"cotainr.{__name__}")


def plan(
    *,
    image_path,
    system=None,
    base_image=None,
    base_image_override=None,
    conda_env=None,
    settings=None,
    skip_stages=(),
    force=False,
    accept_licenses=False,
):
    """
    Resolve a build into a plan without building.

    Parameters are those of :func:`build` (without the logging ones).

    Returns
    -------
    plan : :class:`cotainr_lumi.engine.plan.BuildPlan`
        The plan; ``plan.describe()`` is the ``--dry-run`` text.
    """
    _cotainr.check_cotainr_version()
    return make_plan(
        request=BuildRequest(
            image_path=image_path,
            system=system,
            base_image=base_image,
            base_image_override=base_image_override,
            conda_env=conda_env,
            settings=dict(settings or {}),
            skip_stages=tuple(skip_stages),
            force=force,
            dry_run=False,
            accept_licenses=accept_licenses,
        )
    )


def build(
    *,
    image_path,
    system=None,
    base_image=None,
    base_image_override=None,
    conda_env=None,
    settings=None,
    skip_stages=(),
    force=False,
    dry_run=False,
    accept_licenses=False,
    verbosity=0,
    log_to_file=False,
    setup_logging=False,
):
    """
    Build an image and return what was built.

    Parameters
    ----------
    image_path : os.PathLike
        The image to build.
    system : str, optional
        A system name, e.g. ``"lumi-g-ext"`` (exclusive with `base_image`).
    base_image : str, optional
        A base image for a build without a system.
    base_image_override : str, optional
        Replaces the system's base image.
    conda_env : os.PathLike, optional
        A conda environment file for cotainr's conda step.
    settings : dict, optional
        Stage settings overriding the profile's, per stage name, in the
        profile's format: ``{"provenance": {"hash-base-image": False}}``.
    skip_stages : sequence of str, default=()
        Stages of the system not to run.
    force : bool, default=False
        Replace an existing image (only once the new one is built).
    dry_run : bool, default=False
        Only resolve the plan; ``result.plan_text`` describes it.
    accept_licenses : bool, default=False
        Accept the Miniforge licence (needed with `conda_env`).
    verbosity : int, default=0
        cotainr's verbosity (-1 to 5) for subprocess output.
    log_to_file : bool or os.PathLike, default=False
        Also log to files (cotainr's naming, or this path prefix).
    setup_logging : bool, default=False
        Attach cotainr's console handlers to the ``cotainr`` logger (a
        library leaves logging to the caller by default).

    Returns
    -------
    result : :class:`cotainr_lumi.engine.pipeline.BuildResult`
        Image path, labels and per-stage reports.

    Raises
    ------
    :class:`cotainr_lumi.errors.UnknownSystemError`
        Unknown system (the message lists the available ones).
    :class:`cotainr_lumi.errors.ProfileError`
        An invalid profile file.
    :class:`cotainr_lumi.errors.InputError`
        Invalid inputs.
    :class:`cotainr_lumi.errors.ImageExistsError`
        The image exists and `force` is False.
    :class:`cotainr_lumi.errors.StageError`
        A step of the build failed (no image is written).
    """
    build_plan = plan(
        image_path=image_path,
        system=system,
        base_image=base_image,
        base_image_override=base_image_override,
        conda_env=conda_env,
        settings=settings,
        skip_stages=skip_stages,
        force=force,
        accept_licenses=accept_licenses,
    )
    build_plan.request.dry_run = dry_run
    log_settings = _cotainr.make_log_settings(
        verbosity=verbosity, log_to_file=log_to_file, no_color=True
    )
    if setup_logging:
        _cotainr.setup_cli_logging(log_settings=log_settings)
    return run_plan(plan=build_plan, log_settings=log_settings)
