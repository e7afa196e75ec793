"""The statuses of a ``cotainr-lumi verify`` row."""

PASS = "PASS"
FAIL = "FAIL"
NA = "N/A"
WARN = "WARN"


def hardware_row(check, what, instead):
    """The N/A row of a check only LUMI's hardware answers, and how to run it there."""
    return check, NA, f"needs LUMI hardware: {what}; run: {instead}"
