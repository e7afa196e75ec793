"""
The statuses of a ``cotainr-lumi verify`` row.

Attributes
----------
PASS, FAIL, NA : str
    The check passed, failed, or does not apply (with what to run instead).
WARN : str
    A finding that does not fail the image (FAIL with ``verify --strict``).
"""

PASS, FAIL, NA = "PASS", "FAIL", "N/A"
WARN = "WARN"
