"""What a stock cotainr user sees change when cotainr-lumi is installed."""

import os
import subprocess
import sys

from cotainr_lumi import _cotainr

HELP = "from cotainr.cli import CotainrCLI\nCotainrCLI(args=['build', '--help'])"


def build_help(*, with_cotainr_lumi):
    env = dict(os.environ, COLUMNS="80")
    if not with_cotainr_lumi:
        env.update(COTAINR_LUMI_DISABLE="1", COTAINR_DISABLE_PLUGINS="1")
    out = subprocess.run(
        [sys.executable, "-c", HELP], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout


def test_build_help_only_gains_the_cotainr_lumi_group():
    stock = build_help(with_cotainr_lumi=False).strip().split("\n\n")
    lumi = build_help(with_cotainr_lumi=True).strip().split("\n\n")
    # Description, positional arguments and cotainr's own options: unchanged.
    assert lumi[1:4] == stock[1:4]
    # Then argument groups only: on a stock cotainr the backport's (--force,
    # --dry-run), then the cotainr-lumi stage's, holding all its options.
    groups = "\n\n".join(lumi[4:])
    if not _cotainr.has_build_stage_seam():
        backport, groups = groups.split("\n\n", 1)
        assert backport.startswith("build options (a backport")
        from cotainr_lumi._cotainr.backport import stock_build_options

        # Those a partial series (e.g. 0003's --force) has not given cotainr.
        for option in {"--force", "--dry-run"} - stock_build_options():
            assert option in backport
    group = groups
    # Titled as cotainr's seam titles a stage's group, with the stage's
    # one-line description: the same on both paths.
    assert group.startswith(
        "cotainr-lumi build stage:\n  Run the cotainr-lumi stages of the build plan."
    )
    assert group.count(":\n") == 1
    for option in ("--base-image-override", "--set", "--skip-stage", "--pip-steps"):
        assert option in group and option not in "".join(stock)
    # The usage lists cotainr's options first, unchanged, then the new ones.
    stock_usage = stock[0].split()
    lumi_usage = lumi[0].split()
    assert lumi_usage[: len(stock_usage) - 1] == stock_usage[:-1]
    assert lumi_usage[-1] == stock_usage[-1] == "image_path"
