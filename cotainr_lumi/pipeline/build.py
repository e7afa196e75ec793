"""
One cotainr-lumi build, top to bottom.

cotainr's ``build`` creates the sandbox, installs the conda env, adds its
metadata and builds the image. A cotainr-lumi build takes part in it at five
points, in this order (the build hook of ``docs/upstream/seam-api.md``;
:mod:`cotainr_lumi.plugin` adapts the hook's calls to these methods):

1. :meth:`Build.start`: before cotainr makes the sandbox;
2. :meth:`Build.sandbox`: where cotainr would unpack the base image;
3. :meth:`Build.customize`: after cotainr's conda step, before its metadata:
   the target Python environment, the stages in order, their checks;
4. :meth:`Build.write_image`: where cotainr would build the image;
5. :meth:`Build.finish`: once the image is in place (or the build failed).
"""

import contextlib
from dataclasses import dataclass, field, replace
import logging
from pathlib import Path
import time
from typing import Optional

from .. import imagelayout
from ..engine import (
    digest,
    history,
    imageprobe,
    layer,
    rocmwindow,
    rootfs,
    sifimage,
    workdir,
)
from ..engine.stage import StageContext
from ..errors import CotainrLumiError
from . import checks, hostfiles
from .plan import BuildPlan

logger = logging.getLogger(f"cotainr.{__name__}")


@dataclass(frozen=True)
class BuildResult:
    """
    What a build produced.

    Attributes
    ----------
    image_path : :class:`pathlib.Path`
        The image (not created for a dry run).
    system : str or None
        The system name.
    base_image : str
        The base image as given.
    labels : dict of str to str
        The labels cotainr-lumi added.
    reports : tuple of StageReport
        One report per stage, in order.
    duration : float
        Wall time in seconds.
    dry_run : bool
        True if nothing was built.
    plan_text : str
        The plan description.
    """

    image_path: Path
    system: Optional[str]
    base_image: str
    labels: dict = field(default_factory=dict)
    reports: tuple = ()
    duration: float = 0.0
    dry_run: bool = False
    plan_text: str = ""

    @classmethod
    def of_plan(cls, plan, **fields):
        """The result of a build of `plan`: its image, system and base image."""
        return cls(
            image_path=plan.image_path,
            system=plan.facts.system,
            base_image=plan.base_image.given,
            **fields,
        )

    def report(self, name):
        """The report of the stage `name` (KeyError: the stage did not run)."""
        for report in self.reports:
            if report.name == name:
                return report
        raise KeyError(name)


@contextlib.contextmanager
def blamed(step):
    """Meanwhile, an exception is the one clear error of `step`."""
    try:
        yield
    except CotainrLumiError:
        raise
    except Exception as e:
        raise checks.as_stage_error(e, stage=step) from e


class Build:
    """
    One cotainr-lumi build of a plan.

    Parameters
    ----------
    plan : BuildPlan
        What to build.
    """

    def __init__(self, *, plan: BuildPlan):
        self.plan = plan
        self.facts = plan.facts  # with the base held open once started
        self.labels = {}
        self.reports = []
        self.compression = sifimage.Compression.parse(plan.build_settings.compression)
        self.result = None
        self.view = None  # the mounted base of a layered build
        self.started = time.time()
        self._environment = contextlib.ExitStack()

    def start(self):
        """Check the base image and the space; work in a directory of its own."""
        plan = self.plan
        checks.check_space(plan, refuse=plan.build_settings.check_space)
        checks.log_resolved_base_image(plan.base_image)
        workdir.remove_leftovers(work_dir=plan.work_dir, image_path=plan.image_path)
        self._pin_base()
        self._environment.enter_context(checks.without_bind_variables())
        work = workdir.work_dir_environment(plan.work_dir)
        work = self._environment.enter_context(work)
        if plan.mount_problem is None:
            self.view = layer.BaseView(
                base=plan.base_image.resolved,
                pinned=self.facts.base_image.pinned,
                work=work / "layer",
                layer=plan.layer_problem is None,
                only=plan.layer_only,
                compression=self.compression,
            )
        else:
            logger.info("The base image is unpacked: %s.", plan.mount_problem)

    def _pin_base(self):
        """Hold a local base image open: every later read is of this file."""
        base = self.plan.base_image
        if not base.is_local_file:
            return
        pinned = digest.Pinned(base.resolved)
        self._environment.callback(pinned.file.close)
        self.facts = replace(self.facts, base_image=replace(base, pinned=pinned))

    def sandbox(self, *, sandbox_dir):
        """
        Mount the base at `sandbox_dir` for a layered build (None: unpack it).

        Returns
        -------
        release : callable or None
            Unmounts the base; None: cotainr unpacks the base.
        """
        if self.view is None:
            return None
        try:
            self.view.mount(at=Path(sandbox_dir))
        except (OSError, layer.LayerError) as e:
            if self.view.layers:  # unpacking would leave them out
                raise self.view.refused(e) from None
            logger.warning("The base image is unpacked (not mounted): %s", e)
            self.view = None
            return None
        return self.view.unmount

    def _check_mounted(self):
        """Stop when cotainr unpacked a base it was to mount (its hook cannot)."""
        if self.view is None or self.view.merged is not None:
            return
        if self.view.layers:  # unpacked without them
            raise self.view.refused("cotainr did not ask for the sandbox")
        logger.info("The base image was unpacked (cotainr did not ask to mount it).")
        self.view = None

    def customize(self, *, sandbox, base_image_used):
        """
        Run the stages on the sandbox, after cotainr's conda step.

        Parameters
        ----------
        sandbox : :class:`cotainr_lumi._cotainr.Sandbox`
            The sandbox.
        base_image_used : str
            The base image cotainr built the sandbox from.

        Returns
        -------
        labels : dict of str to str
            The labels of the image.
        """
        plan = self.plan
        base = self.facts.base_image
        root = sandbox.root
        with blamed("cotainr-lumi"):
            self._check_mounted()
            checks.check_base_image_unchanged(base, used=base_image_used)
            rootfs.claim_build_dirs(root=root)
            earlier = history.keep_earlier_build(root=root)
        if earlier is not None:
            self.labels[imagelayout.LABEL_HISTORY] = str(earlier)
        with blamed(imageprobe.SETTINGS_NAME):
            target = imageprobe.probe_build(sandbox=sandbox, build=self.facts)
        self.labels.update(target.labels)
        with blamed(rocmwindow.SETTINGS_NAME):
            rocmwindow.check_start(
                root=root, target=target.env, settings=plan.rocm_settings
            )
        for stage in plan.stages:
            context = StageContext(
                sandbox=sandbox,
                build=self.facts,
                target_env=target.env,
                target_problem=target.problem,
                earlier=tuple(self.reports),
            )
            with blamed(stage.name):
                self._run_stage(stage, context)
        with blamed(rocmwindow.SETTINGS_NAME):
            rocm_labels = rocmwindow.check_end(
                root=root, target=target.env, settings=plan.rocm_settings
            )
        self.labels.update(rocm_labels)
        with blamed("cotainr-lumi"):  # the stages read the base it still is
            checks.check_base_image_unchanged(base, used=base_image_used)
        with blamed("outputs"):
            hostfiles.check(self.reports)
        self.labels[imagelayout.LABEL_COMPRESSION] = str(self.compression)
        if self.view is not None and self.view.layer:
            sha256 = self.labels.get(imagelayout.LABEL_BASE_IMAGE_SHA256)
            self.labels[imagelayout.LABEL_LAYERS] = self.view.label(sha256=sha256)
        return dict(self.labels)

    def _run_stage(self, stage, context):
        """Run one stage; keep its report and labels."""
        logger.info("Running stage: %s", stage.name)
        started = time.time()
        report = stage.run(context=context)
        report = replace(report, duration=time.time() - started)
        self.reports.append(report)
        self.labels.update(report.labels)
        summary = f": {report.summary}" if report.summary else ""
        logger.info(
            "Finished stage %s in %.1f s%s", stage.name, report.duration, summary
        )

    def write_image(self, *, path, sandbox_dir, architecture):
        """
        Write the image to `path`: a layer on the base, else squashed once.

        Returns
        -------
        written : bool
            False: cotainr builds the image (Apptainer, as stock cotainr).
        """
        if self.view is not None and self.view.write_image(path=Path(path)):
            return True
        written = sifimage.write_sif(
            sandbox_dir=Path(sandbox_dir),
            path=Path(path),
            compression=self.compression,
            architecture=architecture,
        )
        return written is not None

    def finish(self, *, error):
        """
        Write the host files once the image is in place; say so when it is not.

        Parameters
        ----------
        error : BaseException or None
            What stopped the build, or None once the image is in place.

        Returns
        -------
        result : BuildResult or None
            What was built (None after a failure).
        """
        self._environment.close()
        if error is not None:
            logger.warning(
                "No image was written to %s (an existing image is kept).",
                self.plan.image_path,
            )
            return None
        layer_kept = self.view is not None and self.view.only and self.view.kept
        hostfiles.write(hostfiles.joined(self.reports, layer=layer_kept))
        self.result = BuildResult.of_plan(
            self.plan,
            labels=dict(self.labels),
            reports=tuple(self.reports),
            duration=time.time() - self.started,
        )
        return self.result
