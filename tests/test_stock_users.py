"""What a stock cotainr user sees change when cotainr-lumi is installed."""

import os
from pathlib import Path
import subprocess
import sys

COTAINR = Path(sys.executable).parent / "cotainr"


def build_help(*, with_cotainr_lumi):
    env = dict(os.environ, COLUMNS="80")
    if not with_cotainr_lumi:
        env.update(COTAINR_LUMI_DISABLE="1", COTAINR_DISABLE_PLUGINS="1")
    out = subprocess.run(
        [COTAINR, "build", "--help"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout


def test_build_help_only_gains_the_cotainr_lumi_group():
    stock = build_help(with_cotainr_lumi=False).strip().split("\n\n")
    lumi = build_help(with_cotainr_lumi=True).strip().split("\n\n")
    # Description, positional arguments and cotainr's own options: unchanged.
    assert lumi[1:4] == stock[1:4]
    # Then argument groups only: on a cotainr without them the shim's
    # --force and --dry-run, then the cotainr-lumi plugin's, holding all its
    # options (titled as cotainr's hook titles a plugin's group).
    groups = "\n\n".join(lumi[4:])
    plugin_group = groups[groups.index("lumi plugin:") :]
    assert plugin_group.count(":\n") == 1
    for option in ("--lumi-system", "--set", "--skip-stage", "--pip-steps"):
        assert option in plugin_group and option not in "".join(stock)
    # The usage keeps cotainr's options in their order (the plugin's come
    # after them on the shim, before them on a cotainr with the hook).
    stock_usage = stock[0].split()
    lumi_usage = lumi[0].split()
    kept = [word for word in lumi_usage if word in stock_usage]
    assert kept == stock_usage
    assert lumi_usage[-1] == "image_path"
