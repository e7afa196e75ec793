"""The build as the stages read it, for unit tests of one stage."""

from dataclasses import replace
from pathlib import Path

from cotainr_lumi.engine import imageprobe
from cotainr_lumi.engine.stage import BaseImage, BuildFacts, StageContext
from cotainr_lumi.engine.targetenv import TargetEnvSettings
from cotainr_lumi.pipeline import describe


def build_facts(**fields):
    """A BuildFacts with a real build's defaults (`fields` win)."""
    facts = BuildFacts(
        image_path=Path("/tmp/out/x.sif"),
        system=None,
        profile_sources=(),
        base_image=BaseImage(
            given="docker://debian", resolved="docker://debian", is_local_file=False
        ),
        conda_envs=(),
        stages=(),
        layer_only=False,
        rocm_version=None,
        target_settings=TargetEnvSettings(),
    )
    return replace(facts, **fields)


def stage_context(sandbox, *, probe=True, build=None, **fields):
    """The context a stage gets: the build, and the target env the probe finds."""
    if build is None:
        build = build_facts(**fields)
    if not probe:
        return StageContext(sandbox=sandbox, build=build)
    target = imageprobe.probe_build(sandbox=sandbox, build=build)
    return StageContext(
        sandbox=sandbox,
        build=build,
        target_env=target.env,
        target_problem=target.problem,
    )


def plan_text(plan):
    """The dry-run text of a plan."""
    return describe.dry_run(plan)[0]
