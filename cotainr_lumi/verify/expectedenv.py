"""
The LUMI env values ``cotainr-lumi verify`` expects in an image.

They come from the system profiles, the one place they are written: the
lumi-env ``env`` settings of the image's system (its label
``cotainr-lumi.system``) over those of :data:`DEFAULT_SYSTEM` in the
packaged ``systems.yaml`` (the settings of the hand-built images; their
sources are named there). A profile value ``null`` removes a variable
from the expected ones.
"""

import logging

from ..errors import CotainrLumiError
from ..pipeline.profiles import PACKAGED_PROFILE, load_systems

logger = logging.getLogger(f"cotainr.{__name__}")

#: The system of the packaged profile whose lumi-env settings are expected
#: of every image.
DEFAULT_SYSTEM = "lumi-g-ext"
#: The stage whose settings hold the env values.
LUMI_ENV_STAGE = "lumi-env"


def _apply_env_settings(expected, *, system):
    """Apply the lumi-env ``env`` settings of `system` to `expected`."""
    if LUMI_ENV_STAGE not in system.stages:
        return
    settings = system.stage_settings(LUMI_ENV_STAGE)
    for key, value in (settings.get("env") or {}).items():
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = str(value)


def default_lumi_env():
    """The values expected of every image, unless its system says otherwise."""
    systems = load_systems(files=[PACKAGED_PROFILE], include_stock=False)
    expected = {}
    _apply_env_settings(expected, system=systems[DEFAULT_SYSTEM])
    return expected


def expected_env(*, system_name):
    """The values expected of an image of one system."""
    expected = default_lumi_env()
    if not system_name:
        return expected
    try:
        system = load_systems().get(system_name)
    except CotainrLumiError as e:
        logger.debug("Profiles unreadable, expecting the defaults: %s", e)
        system = None
    if system is not None:
        _apply_env_settings(expected, system=system)
    return expected
