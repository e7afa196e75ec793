"""
``cotainr-lumi verify``: check a built image against the hand-built image.

:mod:`.checks` runs :mod:`.probe` inside the image (through
:mod:`cotainr_lumi.apptainer`) and turns what it reports into PASS/FAIL/N/A rows;
:mod:`.expectedenv` reads the LUMI env values expected from the system
profiles; :mod:`.mpi` adds the MPI rows. One run in the image per verify.
"""

from .checks import VerifyReport, verify_image

__all__ = ["VerifyReport", "verify_image"]
