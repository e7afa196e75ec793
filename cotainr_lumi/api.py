"""The Python API for build scripts (an example: ``examples/api_build.py``)."""

import logging
import time

from . import _cotainr
from .errors import CotainrLumiError, ImageExistsError, StageError
from .pipeline.plan import BuildRequest, make_plan
from .pipeline.run import BuildResult

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
        Settings over the profile's: ``{"provenance": {"hash-base-image": False}}``.
    skip_stages : sequence of str, default=()
        Stages of the system not to run.
    force : bool, default=False
        Replace an existing image (only once the new one is built).
    accept_licenses : bool, default=False
        Accept the Miniforge licence (needed with `conda_env`).

    Returns
    -------
    plan : :class:`cotainr_lumi.pipeline.plan.BuildPlan`
        The plan; ``plan.describe()`` is the ``--dry-run`` text.

    Raises
    ------
    :class:`cotainr_lumi.errors.CotainrLumiError`
        Bad input (an unknown system, an invalid profile or inputs).
    """
    _cotainr.check_cotainr_version()
    request = BuildRequest(
        image_path=image_path,
        system=system,
        base_image=base_image,
        base_image_override=base_image_override,
        conda_env=conda_env,
        settings=dict(settings or {}),
        skip_stages=tuple(skip_stages),
        force=force,
        accept_licenses=accept_licenses,
    )
    return make_plan(request=request)


def build(
    *, dry_run=False, verbosity=0, log_to_file=False, setup_logging=False, **request
):
    """
    Build an image and return what was built.

    Parameters
    ----------
    dry_run : bool, default=False
        Only resolve the plan; ``result.plan_text`` describes it.
    verbosity : int, default=0
        cotainr's verbosity (-1 to 5) for subprocess output.
    log_to_file : bool or os.PathLike, default=False
        Also log to files (cotainr's naming, or this path prefix).
    setup_logging : bool, default=False
        Attach cotainr's console handlers to the ``cotainr`` logger (a
        library leaves logging to the caller by default).
    **request
        What to build: the keyword arguments of :func:`plan`.

    Returns
    -------
    result : :class:`cotainr_lumi.pipeline.run.BuildResult`
        Image path, labels and per-stage reports.

    Raises
    ------
    :class:`cotainr_lumi.errors.CotainrLumiError`
        As :func:`plan` raises, and :class:`~cotainr_lumi.errors.ImageExistsError`
        (the image exists and `force` is False) or
        :class:`~cotainr_lumi.errors.StageError` (a step of the build failed;
        no image is written).
    """
    build_plan = plan(**request)
    log_settings = _cotainr.make_log_settings(
        verbosity=verbosity, log_to_file=log_to_file, no_color=True
    )
    if setup_logging:
        _cotainr.setup_cli_logging(log_settings=log_settings)
    result = BuildResult(
        image_path=build_plan.image_path,
        system=build_plan.system.name if build_plan.system else None,
        base_image=build_plan.base_image.given,
        dry_run=dry_run,
    )
    if dry_run:
        build_plan.ask_base_image()
    result.plan_text = build_plan.describe()
    if dry_run:
        return result
    return _run_build(
        build_plan=build_plan,
        result=result,
        verbosity=verbosity,
        log_to_file=log_to_file,
    )


def _run_build(*, build_plan, result, **build_args):
    """Run cotainr's build of the plan with the hook; fill in `result`."""
    from .plugin import HOOK

    if build_plan.image_exists and not build_plan.request.force:
        raise ImageExistsError(
            f"The image {build_plan.image_path} already exists. Pass --force "
            "(force=True) to replace it, or choose another path."
        )
    t_start = time.time()
    try:
        with HOOK.planned(build_plan):
            build = _cotainr.build_command()(
                image_path=build_plan.image_path,
                base_image=build_plan.base_image.given,
                conda_env=build_plan.request.conda_env,
                accept_licenses=build_plan.request.accept_licenses,
                no_color=True,
                force=True,
                **build_args,
            )
            build.execute()
    except _cotainr.PluginError as e:
        if isinstance(e.__cause__, CotainrLumiError):
            raise e.__cause__ from None
        raise StageError(str(e), stage="cotainr") from e
    if HOOK.last is None:  # pragma: no cover - plan() found an extended build
        raise StageError("the cotainr-lumi hook did not run", stage="cotainr")
    result.labels = dict(HOOK.last.labels)
    result.reports = list(HOOK.last.reports)
    result.duration = time.time() - t_start
    return result
