"""The Python API for build scripts (an example: ``examples/api_build.py``)."""

import logging

from . import _cotainr, console
from .errors import CotainrLumiError, ImageExistsError, StageError
from .pipeline import describe
from .pipeline.build import Build, BuildResult
from .pipeline.plan import BuildRequest, make_plan

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
        The plan; ``build(dry_run=True, ...)`` gives its ``--dry-run`` text.

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
    result : :class:`cotainr_lumi.pipeline.build.BuildResult`
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
    if setup_logging:
        console.setup_logging(verbosity=verbosity)
    if dry_run:
        text, _answer = describe.dry_run(build_plan)
        return BuildResult.of_plan(build_plan, dry_run=True, plan_text=text)
    return _run_build(
        build=Build(plan=build_plan), verbosity=verbosity, log_to_file=log_to_file
    )


def _run_build(*, build, **build_args):
    """Run cotainr's build of `build`'s plan with cotainr-lumi taking part."""
    from .plugin import HOOK

    build_plan = build.plan
    if build_plan.image_exists and not build_plan.request.force:
        raise ImageExistsError(
            f"The image {build_plan.image_path} already exists. Pass --force "
            "(force=True) to replace it, or choose another path."
        )
    try:
        with HOOK.running(build):
            cotainr_build = _cotainr.build_command()(
                image_path=build_plan.image_path,
                base_image=build_plan.base_image.given,
                conda_env=build_plan.request.conda_env,
                accept_licenses=build_plan.request.accept_licenses,
                no_color=True,
                force=True,
                **build_args,
            )
            cotainr_build.execute()
    except _cotainr.PluginError as e:
        if isinstance(e.__cause__, CotainrLumiError):
            raise e.__cause__ from None
        raise StageError(str(e), stage="cotainr") from e
    if build.result is None:  # pragma: no cover - plan() found an extended build
        raise StageError("the cotainr-lumi hook did not run", stage="cotainr")
    return build.result
