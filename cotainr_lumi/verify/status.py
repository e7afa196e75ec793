"""The statuses of a ``cotainr-lumi verify`` row."""

PASS = "PASS"
FAIL = "FAIL"
NA = "N/A"
WARN = "WARN"
