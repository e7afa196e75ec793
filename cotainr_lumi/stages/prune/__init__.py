"""The ``prune`` stage: safety-checked pruning after the software is installed."""

from .stage import PruneStage

__all__ = ["PruneStage"]
