"""The ``lumi-env`` stage: LUMI runtime settings in the image and beside it."""

from .stage import LumiEnvStage

__all__ = ["LumiEnvStage"]
