"""
The ``lumi-env`` stage: LUMI runtime settings in the image and beside it.

:mod:`.stage` is the stage, :mod:`.settings` its settings; :mod:`.envfile` renders the image's env file,
:mod:`.modulefile` the Lmod module and shell snippet written next to the
image, ``runscripts/`` holds the scripts installed in ``/runscripts`` (the
tests check ``get-master`` against ``tests/nodelist.py``). MPI: :mod:`.mpi`
decides which ``libmpi.so.12`` the image's MPI users run on (the image's
MPICH or LUMI's Cray MPICH), :mod:`.mpiscan` finds the image's MPI,
:mod:`.mpienv` writes its env file and module lines.
"""

from .stage import LumiEnvStage

__all__ = ["LumiEnvStage"]
