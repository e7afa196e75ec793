"""
The ``lumi-env`` stage: LUMI runtime settings in the image and beside it.

:mod:`.stage` is the stage, :mod:`.settings` its settings; :mod:`.envfile` renders the image's env file,
:mod:`.modulefile` the Lmod module and shell snippet written next to the
image, ``runscripts/`` holds the scripts installed in ``/runscripts`` (the
tests check ``get-master`` against ``tests/nodelist.py``).
"""

from .stage import LumiEnvStage

__all__ = ["LumiEnvStage"]
