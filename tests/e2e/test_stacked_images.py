"""End-to-end: images cotainr-lumi built are good bases for others (issue 30).

A colleague with plain cotainr builds on an image cotainr-lumi built. cotainr
2025.7.1 and older rewrite labels.json compact and in place without
truncating it; Apptainer writes it indented, so without the padding label the
rewrite left the old file's tail behind and Apptainer stopped with ``while
inserting labels json: invalid character ...``.
"""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.e2e

COTAINR = Path(sys.executable).with_name("cotainr")


def test_stock_cotainr_builds_on_an_image_cotainr_lumi_built(
    tmp_path, lumi_like_base_image, apptainer_path
):
    (tmp_path / "systems.yaml").write_text(
        yaml.safe_dump(
            {
                "systems": {
                    "stacked-e2e": {
                        "extends": "lumi-g-ext",
                        "base-image": str(lumi_like_base_image),
                        "rocm-version": "6.1",
                        "settings": {"provenance": {"hash-base-image": False}},
                    }
                }
            }
        )
    )
    env = {**os.environ, "COTAINR_LUMI_SYSTEMS": str(tmp_path / "systems.yaml")}
    run = dict(cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    ours, theirs = tmp_path / "ours.sif", tmp_path / "s.sif"
    proc = subprocess.run(
        [str(COTAINR), "build", str(ours), "--system=stacked-e2e", "--force"],
        env=env,
        timeout=900,
        **run,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Plain cotainr, the shortest command line: the rewrite is shortest.
    stock = {**env, "COTAINR_DISABLE_PLUGINS": "1"}
    proc = subprocess.run(
        ["cotainr", "build", theirs.name, "--base-image", ours.name],
        env={**stock, "PATH": f"{COTAINR.parent}:{os.environ['PATH']}"},
        timeout=900,
        **run,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    labels = json.loads(
        subprocess.run(
            [str(apptainer_path / "apptainer"), "inspect", "--json", "--labels"]
            + [str(theirs)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["data"]["attributes"]["labels"]
    command = f"cotainr build {theirs.name} --base-image {ours.name}"
    assert labels["cotainr.command"].endswith(command)
    assert labels["cotainr-lumi.system"] == "stacked-e2e"  # the base's, kept
