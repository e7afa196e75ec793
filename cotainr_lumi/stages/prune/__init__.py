"""
The ``prune`` stage: safety-checked pruning after the software is installed.

:mod:`.stage` is the stage; :mod:`.libstdcxx` decides about the env's
``libstdc++``, :mod:`.rocm` about torch's bundled ROCm libraries;
:mod:`.manifest` records what was removed or kept and why; ELF files
(SONAMEs, symbol versions) are read with :mod:`cotainr_lumi.engine.elfinfo`,
shared with the lumi-env stage's MPI checks.
"""

from .stage import PruneStage

__all__ = ["PruneStage"]
