"""The statuses of a ``cotainr-lumi verify`` row."""

PASS, FAIL, NA, WARN = "PASS", "FAIL", "N/A", "WARN"
