"""
cotainr-lumi as a cotainr plugin: its systems and its build hook.

This module is the ``cotainr.plugins`` entry point: cotainr (or, on a
cotainr without plugin support, :mod:`cotainr_lumi._cotainr.shim`) reads
:func:`systems` and calls :data:`build_hook` (``docs/upstream/seam-api.md``).
cotainr's own ``Build.execute`` creates the sandbox, installs the conda env,
adds the metadata and builds the image; the hook runs the plan's stages
(pip, prune, lumi-env, provenance) before the metadata.
"""

import contextlib
from dataclasses import dataclass, field
import functools
import logging
import os
import sys
from typing import Any

from . import _cotainr, buildoptions, imagelayout
from .engine import history, layer, rocmwindow, rootfs, sifimage
from .engine.stage import StageContext
from .engine.workdir import remove_leftovers, work_dir_environment
from .errors import CotainrLumiError, InputError, UnknownSystemError, redact
from .pipeline.plan import make_plan, match_base_image
from .pipeline.profiles import load_systems
from .pipeline.run import (
    as_stage_error,
    check_base_image_unchanged,
    check_outputs,
    cotainr_failure,
    log_resolved_base_image,
    run_stage,
    without_bind_variables,
    write_outputs,
)
from .stages.provenance import stock_cotainr_pad

logger = logging.getLogger(f"cotainr.{__name__}")

_listing_systems = False


def systems():
    """
    The cotainr-lumi systems, in cotainr's ``systems.json`` format.

    Returns
    -------
    systems : dict
        ``{name: {"base-image": ..., "description": ...}}`` for the systems
        of the cotainr-lumi profiles (not cotainr's own). Empty (with a
        warning) when a profile file is invalid.
    """
    global _listing_systems
    if _listing_systems or disabled():  # load_systems() asks cotainr for its own
        return {}
    _listing_systems = True
    try:
        loaded = load_systems()
    except CotainrLumiError as e:
        logger.warning("cotainr-lumi systems are not available: %s", e)
        return {}
    finally:
        _listing_systems = False
    return {
        name: {"base-image": _base_image(system), "description": system.description}
        for name, system in loaded.items()
        if not system.stock
    }


def _base_image(system):
    """The file a glob base image matches (the glob when not one: the build says)."""
    try:
        return match_base_image(system.base_image, system=system.name)
    except InputError:
        return system.base_image


def system_problem(name):
    """The one line for a ``--system`` the profiles retired (else None)."""
    try:
        message = load_systems(include_stock=False).removed.get(name)
    except CotainrLumiError:
        message = None
    return message and str(UnknownSystemError(name, available=(), removed=message))


@dataclass
class LumiBuild:
    """One cotainr-lumi build: its plan and, once run, what to label and write."""

    plan: Any  # BuildPlan
    labels: dict = field(default_factory=dict)  # the stages' labels
    reports: list = field(default_factory=list)  # one StageReport per stage
    outputs: dict = field(default_factory=dict)  # host files, once built
    environment: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    cwd: str = field(default_factory=os.getcwd)
    view: Any = None  # the mounted base of a layered build


class LumiHook:
    """
    cotainr-lumi's build hook (API version 1, ``docs/upstream/seam-api.md``).

    Attributes
    ----------
    last : LumiBuild or None
        The build of the last :meth:`prepare` that took part.
    """

    api_version = 1

    def __init__(self):
        self.last = None
        self._handed = None  # a plan the Python API made (see :meth:`planned`)

    @contextlib.contextmanager
    def planned(self, plan):
        """Meanwhile, :meth:`prepare` takes `plan` instead of making one."""
        self._handed = plan
        try:
            yield
        finally:
            self._handed = None

    def add_arguments(self, *, parser):
        """
        Add the cotainr-lumi options of ``cotainr build``.

        Parameters
        ----------
        parser : argument group
            The plugin's group of the ``build`` parser.
        """
        buildoptions.add_options(parser=parser)

    def prepare(self, *, context):
        """
        Make the plan of a build; None for a build cotainr-lumi takes no part in.

        Parameters
        ----------
        context : BuildContext
            The build.

        Returns
        -------
        lines : list of str or None
            The plan, for ``--dry-run``.
        """
        self.last = None
        try:
            plan = self._handed or make_plan(
                request=buildoptions.request_from_options(
                    context=context, conda_env=list(context.conda_env_files) or None
                )
            )
            if not plan.extended:
                return None
            plan.check_base_links()
            build = LumiBuild(plan=plan)
            if context.dry_run:
                plan.ask_base_image()
                self.last = build
                if plan.base_problem:  # the plan, then a non-zero exit (as stated)
                    print(plan.describe())
                    raise InputError(
                        f"the dry run could not ask the base image: {plan.base_problem}"
                    )
                return plan.describe().splitlines()
            plan.check_space()
        except CotainrLumiError as e:
            raise _cotainr.plugin_error(e) from e
        log_resolved_base_image(plan.base_image)
        remove_leftovers(work_dir=plan.work_dir, image_path=context.image_path)
        build.environment.enter_context(without_bind_variables())
        work = build.environment.enter_context(work_dir_environment(plan.work_dir))
        compression = sifimage.Compression.parse(plan.build_settings.compression)
        write_sif = functools.partial(sifimage.write_sif, compression=compression)
        build.environment.enter_context(_cotainr.whole_images(write_sif))
        if plan.mount_problem is None:
            build.view = layer.BaseView(
                base=plan.base_image.resolved,
                work=work / "layer",
                layer=plan.layer_problem is None,
                only=plan.layer_only,
                compression=compression,
            )
            build.environment.enter_context(_cotainr.layered(build.view))
        else:
            logger.info("The base image is unpacked: %s.", plan.mount_problem)
        self.last = build
        return plan.describe().splitlines()

    def customize(self, *, sandbox, context):
        """
        Run the plan's stages on the sandbox, after cotainr's conda step.

        Parameters
        ----------
        sandbox : :class:`cotainr.container.SingularitySandbox`
            The build's sandbox.
        context : BuildContext
            The build.

        Returns
        -------
        labels : dict of str to str
            The labels the stages add.
        """
        build = self.last
        stage_context = StageContext(
            sandbox=_cotainr.Sandbox(stock=sandbox), plan=build.plan
        )
        current = "cotainr-lumi"
        try:
            used = os.path.join(build.cwd, context.base_image)  # cotainr chdir'ed
            check_base_image_unchanged(build.plan.base_image, used=used)
            root = stage_context.sandbox.root
            rootfs.claim_build_dirs(root=root)
            earlier = history.keep_earlier_build(root=root)
            if earlier is not None:
                stage_context.labels[imagelayout.LABEL_HISTORY] = str(earlier)
            current = rocmwindow.SETTINGS_NAME
            rocmwindow.check_build(context=stage_context, phase="start")
            for stage in build.plan.stages:
                current = stage.name
                run_stage(stage=stage, context=stage_context)
            current = rocmwindow.SETTINGS_NAME
            rocmwindow.check_build(context=stage_context, phase="end")
            current = "outputs"
            build.outputs = check_outputs(stage_context.reports)
        except Exception as e:
            error = as_stage_error(e, stage=current)
            raise _cotainr.plugin_error(error) from error
        build.reports = list(stage_context.reports)
        build.labels = dict(stage_context.labels)
        compression = sifimage.Compression.parse(build.plan.build_settings.compression)
        build.labels[imagelayout.LABEL_COMPRESSION] = str(compression)  # a layer's too
        if build.view is not None and build.view.layer:
            sha256 = build.labels.get(imagelayout.LABEL_BASE_IMAGE_SHA256)
            build.labels[imagelayout.LABEL_LAYERS] = build.view.label(sha256=sha256)
        # cotainr records the command line next (cotainr.command): without
        # credentials; finalize gives the caller its own sys.argv back.
        build.environment.callback(setattr, sys, "argv", sys.argv)
        sys.argv = [redact(arg) for arg in sys.argv]
        base = history.read_labels(root=stage_context.sandbox.root) or {}
        final = {**base, **build.labels, "cotainr.command": " ".join(sys.argv)}
        return {**build.labels, **stock_cotainr_pad(labels=final)}

    def finalize(self, *, context, error):
        """
        Write the host files once the image is built; say so when it is not.

        Parameters
        ----------
        context : BuildContext
            The build.
        error : BaseException or None
            What stopped the build, or None once the image is in place.
        """
        build = self.last
        if build is None:
            return
        build.environment.close()
        if error is not None:
            logger.warning(
                "No image was written to %s (an existing image is kept).",
                context.image_path,
            )
            if isinstance(error, Exception) and not isinstance(
                error, _cotainr.PluginError
            ):
                raise _cotainr.plugin_error(
                    cotainr_failure(error, plan=build.plan)
                ) from error
            return
        only = build.view is not None and build.view.only and build.view.kept
        for report in build.reports:  # --layer-only, and the layer kept
            layer = report.details.pop("layer", None)  # SIF: the base
            if layer and only:
                build.outputs.update(layer["outputs"])
                report.details["run-hint"] = layer["run-hint"]
        write_outputs(build.outputs)
        for report in build.reports:
            hint = (report.details or {}).get("run-hint")
            if hint:
                logger.info("%s", hint)


#: Turns cotainr-lumi off (the start-up hook's switch too; the hook is
#: installed at the top of site-packages, outside this package, in a wheel).
DISABLE_ENV_VAR = "COTAINR_LUMI_DISABLE"


def disabled():
    """
    Whether ``COTAINR_LUMI_DISABLE`` turns cotainr-lumi off.

    A cotainr that discovers plugins itself (upstream series) loads this
    module whatever the start-up hook does; the plugin then offers no system
    and no stage, so cotainr runs as if it were not installed.

    Returns
    -------
    off : bool
        True when the variable is set to a value other than "" or "0".
    """
    return os.environ.get(DISABLE_ENV_VAR, "") not in ("", "0")


def __getattr__(name):
    """``build_hook``: the hook cotainr calls (None when :func:`disabled`)."""
    if name == "build_hook":
        return None if disabled() else HOOK
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The one hook object of this plugin.
HOOK = LumiHook()


__all__ = ["HOOK", "LumiBuild", "LumiHook", "disabled", "systems"]
