"""The statuses of a ``cotainr-lumi verify`` row."""

PASS, FAIL, NA = "PASS", "FAIL", "N/A"
WARN = "WARN"
