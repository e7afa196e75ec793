"""The cotainr-lumi version number (CalVer, like cotainr)."""

__version__ = "2026.11.0"
