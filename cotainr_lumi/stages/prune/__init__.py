"""
The ``prune`` stage: safety-checked pruning after the software is installed.

:mod:`.stage` is the stage; :mod:`.libstdcxx` decides about the env's
``libstdc++``, :mod:`.rocm` about torch's bundled ROCm libraries;
:mod:`.elfinfo` reads ELF files (SONAMEs, symbol versions) and
:mod:`.manifest` records what was removed or kept and why.
"""

from .stage import PruneStage

__all__ = ["PruneStage"]
