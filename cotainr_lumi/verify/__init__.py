"""``cotainr-lumi verify``: check a built image against the hand-built image."""

from .checks import VerifyReport, verify_image

__all__ = ["VerifyReport", "verify_image"]
