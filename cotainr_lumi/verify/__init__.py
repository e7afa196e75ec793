"""
``cotainr-lumi verify``: check a built image against the hand-built image.

:mod:`.checks` runs :mod:`.probe` inside the image (through
:mod:`.apptainer`) and turns what it reports into PASS/FAIL/N/A rows.
"""

from .checks import VerifyReport, verify_image

__all__ = ["VerifyReport", "verify_image"]
