"""
Install the seam guard in a Python process (``tests/seam_guard/cotainr_seam_guard.py``).

Active when ``COTAINR_LUMI_SEAM_GUARD`` names a file: the guard is installed
at start-up, before cotainr-lumi is imported, and the violations are written
to that file (one a line) when the process ends. ``tests/e2e/test_seam_guard.py``
puts this directory first on ``PYTHONPATH`` of the ``cotainr`` it runs.
"""

import atexit
import os
from pathlib import Path

REPORT = os.environ.get("COTAINR_LUMI_SEAM_GUARD")

if REPORT:
    import cotainr_seam_guard

    cotainr_seam_guard.install()

    @atexit.register
    def _write_report():
        with Path(REPORT).open("a") as report:
            report.writelines(f"{line}\n" for line in cotainr_seam_guard.violations())
