"""A build plan as the stages read it, for unit tests of one stage."""

from pathlib import Path
from types import SimpleNamespace

from cotainr_lumi.engine.rocmwindow import RocmSettings
from cotainr_lumi.engine.targetenv import TargetEnvSettings


def stand_in_plan(**fields):
    """What the stages read of a plan, with a real plan's defaults (`fields` win)."""
    defaults = dict(
        image_path=Path("/tmp/out/x.sif"),
        base_image=SimpleNamespace(given="docker://debian"),
        system=None,
        conda_env=None,
        target_settings=TargetEnvSettings(),
        rocm_settings=RocmSettings(),
        base_target=None,
        base_facts=None,
        layer_only=False,
    )
    return SimpleNamespace(**{**defaults, **fields})
