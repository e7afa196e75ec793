"""
What ``cotainr-lumi verify`` expects of an image, from the system profiles.

The LUMI env values: the lumi-env ``env`` settings of the image's system over
those of :data:`DEFAULT_SYSTEM` (``null`` removes a variable). The ROCm range
LUMI's GPU driver supports: the image's label, else its system's profile.
"""

import logging

from ..engine import rocmwindow
from ..errors import CotainrLumiError
from ..imagelayout import LABEL_ROCM_SUPPORTED, LABEL_SYSTEM
from ..pipeline.profiles import PACKAGED_PROFILE, load_systems
from .status import FAIL, PASS, WARN

logger = logging.getLogger(f"cotainr.{__name__}")

#: The system of the packaged profile whose lumi-env settings and ROCm range
#: are expected of every image that names none.
DEFAULT_SYSTEM = "lumi-g-ext-rocm-6.2"
#: The stage whose settings hold the env values.
LUMI_ENV_STAGE = "lumi-env"


def _profiles():
    """Every profile's systems (the packaged ones alone when others are unreadable)."""
    try:
        return load_systems(include_stock=False)
    except CotainrLumiError as e:
        logger.debug("Profiles unreadable, reading the packaged one alone: %s", e)
        return load_systems(files=[PACKAGED_PROFILE], include_stock=False)


def _env_setting(system):
    """A system's lumi-env ``env`` setting ({} without one)."""
    if not system or LUMI_ENV_STAGE not in system.stages:
        return {}
    return system.stage_settings(LUMI_ENV_STAGE).get("env") or {}


def expected_env(*, system_name):
    """The values expected of an image of one system (None: the defaults)."""
    packaged = load_systems(files=[PACKAGED_PROFILE], include_stock=False)
    expected = {}
    for system in (packaged[DEFAULT_SYSTEM], _profiles().get(system_name)):
        for name, value in _env_setting(system).items():
            if value is None:
                expected.pop(name, None)
            else:
                expected[name] = str(value)
    return expected


def window_for(*, labels):
    """The supported range for an image."""
    systems = _profiles()
    # The packaged profile, read first, always has DEFAULT_SYSTEM.
    system = systems.get(labels.get(LABEL_SYSTEM)) or systems[DEFAULT_SYSTEM]
    profile = rocmwindow.system_window(system)
    recorded = rocmwindow.Window.from_text(labels.get(LABEL_ROCM_SUPPORTED))
    if recorded is None or str(profile) == str(recorded):
        return profile  # none recorded, or the same range with its source
    return recorded


def check_rocm_driver(report, facts, *, strict):
    """Add the ``rocm-driver`` row."""
    window = window_for(labels=facts["labels"])
    base = (facts["rocm"] or {}).get("version_file")
    torch = facts["torch"]
    found = rocmwindow.problems(window=window, base_rocm=base, torch=torch)
    if found:
        report.add("rocm-driver", FAIL if strict else WARN, "; ".join(found))
        return
    parts = [f"base ROCm {base or 'unknown'}"]
    built_for = rocmwindow.torch_rocm(torch)
    if built_for is not None:
        parts.append(f"torch for ROCm {built_for[0]}.{built_for[1]}")
    words = window.words() if window else "no supported range stated"
    report.add("rocm-driver", PASS, f"{', '.join(parts)}; {words}")
