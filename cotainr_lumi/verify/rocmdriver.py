"""
The image's ROCm against the versions LUMI's GPU driver supports.

The range comes from the image's label ``cotainr-lumi.rocm.supported`` (what
its system's profile said when it was built), else from the profile of its
system (label ``cotainr-lumi.system``) or the packaged ``lumi-g-ext``. The
row ``rocm-driver`` is WARN when the base's ROCm or torch's (``+rocmX.Y``) is
outside it or the two disagree (FAIL with ``cotainr-lumi verify --strict``).
"""

import logging

from ..engine import rocmwindow
from ..errors import CotainrLumiError
from ..imagelayout import LABEL_ROCM_SUPPORTED, LABEL_SYSTEM
from ..pipeline.profiles import PACKAGED_PROFILE, load_systems

logger = logging.getLogger(f"cotainr.{__name__}")

#: The system whose range is expected of images that name none.
DEFAULT_SYSTEM = "lumi-g-ext"


def _profile_window(name):
    try:
        systems = load_systems(include_stock=False)
    except CotainrLumiError as e:
        logger.debug("Profiles unreadable: %s", e)
        systems = load_systems(files=[PACKAGED_PROFILE], include_stock=False)
    system = systems.get(name) or systems.get(DEFAULT_SYSTEM)
    if system is None:
        return None
    settings = rocmwindow.RocmSettings.complete(
        system.stage_settings(rocmwindow.SETTINGS_NAME)
    )
    return rocmwindow.Window.from_text(settings.supported, source=settings.source)


def window_for(*, labels):
    """The supported range for an image."""
    profile = _profile_window(labels.get(LABEL_SYSTEM) or DEFAULT_SYSTEM)
    recorded = rocmwindow.Window.from_text(labels.get(LABEL_ROCM_SUPPORTED))
    if recorded is None:
        return profile
    if profile is not None and (profile.low, profile.high) == (
        recorded.low,
        recorded.high,
    ):
        return profile  # the same range, with its source
    return recorded


def check_rocm_driver(*, report, facts, strict, warn, fail, passed):
    """Add the ``rocm-driver`` row."""
    window = window_for(labels=facts.get("labels") or {})
    base = (facts.get("rocm") or {}).get("version_file")
    torch = facts.get("torch") or None
    found = rocmwindow.problems(window=window, base_rocm=base, torch=torch)
    if found:
        report.add("rocm-driver", fail if strict else warn, "; ".join(found))
        return
    parts = [f"base ROCm {base or 'unknown'}"]
    built_for = rocmwindow.torch_rocm(torch)
    if built_for is not None:
        parts.append(f"torch for ROCm {built_for[0]}.{built_for[1]}")
    words = window.words() if window else "no supported range stated"
    report.add("rocm-driver", passed, f"{', '.join(parts)}; {words}")
