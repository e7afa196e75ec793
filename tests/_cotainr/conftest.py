"""On a cotainr with the build hook the shim is not used: its tests are not collected."""

from cotainr_lumi import _cotainr

collect_ignore = ["test_future_cotainr.py", "test_shim.py"] if _cotainr.NATIVE else []
