"""
cotainr-lumi: LUMI extensions for the cotainr container builder.

Adds stages to cotainr's build pipeline (ordered pip steps after conda,
safety-checked pruning, LUMI runtime injection, provenance) and registers
them as systems such as ``lumi-g-ext`` (LUST's ``lumi-g`` base image) and
``lumi-g-ext-rocm-6.2``, so that ``cotainr build --system=lumi-g-ext-rocm-6.2``
yields an image equivalent to the hand-built LUMI PyTorch image.

Copyright the cotainr-lumi developers.
Licensed under the European Union Public License (EUPL) 1.2
- see the LICENSE file for details.
"""

from ._version import __version__
from .errors import (
    CotainrLumiError,
    ImageExistsError,
    InputError,
    ProfileError,
    StageError,
    UnknownSystemError,
    UnsupportedCotainrError,
)

try:
    from .api import build, plan
    from .engine.stage import Stage, StageContext, StageReport
    from .pipeline.run import BuildResult
except UnsupportedCotainrError as missing:  # no cotainr: the command says so
    _MISSING_COTAINR = missing

    def __getattr__(name):
        """The API without cotainr: its names raise why."""
        if name in __all__:
            raise _MISSING_COTAINR
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "build",
    "plan",
    "BuildResult",
    "CotainrLumiError",
    "ImageExistsError",
    "InputError",
    "ProfileError",
    "StageError",
    "UnknownSystemError",
    "UnsupportedCotainrError",
    "Stage",
    "StageContext",
    "StageReport",
]
