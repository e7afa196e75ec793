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

#: The API's names and the module each comes from (imported when first used,
#: so that loading the plugin for ``cotainr info`` stays quick).
_LAZY = {
    "build": "api",
    "plan": "api",
    "BuildResult": "pipeline.build",
    "Stage": "engine.stage",
    "StageContext": "engine.stage",
    "StageReport": "engine.stage",
}


def __getattr__(name):
    """The API's names, imported on first use (cotainr missing: why)."""
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name]}", __name__)
    return getattr(module, name)


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
