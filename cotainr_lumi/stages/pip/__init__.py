"""The ``pip`` stage: ordered pip steps after conda."""

from .stage import PipStage

__all__ = ["PipStage"]
