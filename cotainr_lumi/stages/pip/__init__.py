"""
The ``pip`` stage: ordered pip steps after conda.

:mod:`.stage` is the stage; :mod:`.steps` reads and checks the steps,
:mod:`.requirements` scans and stages requirement files, :mod:`.protect`
keeps later steps from replacing what is installed, :mod:`.cache` moves the
host pip cache in and out of the sandbox.
"""

from .stage import PipStage

__all__ = ["PipStage"]
