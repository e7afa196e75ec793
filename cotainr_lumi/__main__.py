"""Run ``python -m cotainr_lumi`` (the same as ``cotainr-lumi``)."""

import sys

from .cli import main

sys.exit(main())
