"""The ``system-packages`` stage: distribution packages under proot's fake root."""

from .stage import SystemPackagesStage

__all__ = ["SystemPackagesStage"]
