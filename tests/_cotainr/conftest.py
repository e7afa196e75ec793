"""On a cotainr with the build stage seam the backport is not used: its tests are not collected."""

from cotainr_lumi import _cotainr

collect_ignore = ["test_backport.py"] if _cotainr.has_build_stage_seam() else []
