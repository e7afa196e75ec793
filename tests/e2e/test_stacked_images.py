"""End-to-end: images cotainr-lumi built are good bases for others (issue 30).

A colleague with plain cotainr builds on an image cotainr-lumi built. cotainr
2025.7.1 and older rewrite labels.json compact and in place without
truncating it; Apptainer writes it indented, so without the padding label the
rewrite left the old file's tail behind and Apptainer stopped with ``while
inserting labels json: invalid character ...``.
"""

import json
import re
import subprocess

import pytest

from cotainr_lumi.apptainer import SIF_OVERLAY, SIF_PARTITION, SIF_SYSTEM, sif_objects

pytestmark = pytest.mark.e2e


def test_stock_cotainr_builds_on_an_image_cotainr_lumi_built(
    tmp_path, lumi_like_base_image, apptainer_path, cotainr_build
):
    ours, theirs = tmp_path / "ours.sif", tmp_path / "s.sif"
    # --flatten: Apptainer's unpack (stock cotainr's sandbox) reads no layer.
    cotainr_build(
        tmp_path,
        ours,
        "--system=stacked-e2e",
        "--force",
        "--flatten",
        systems={"stacked-e2e": {"base-image": lumi_like_base_image}},
        timeout=900,
    )
    # Plain cotainr, the shortest command line: the rewrite is shortest.
    cotainr_build(
        tmp_path,
        theirs.name,
        "--base-image",
        ours.name,
        env={"COTAINR_DISABLE_PLUGINS": "1"},
        timeout=900,
    )
    labels = _labels(apptainer_path, theirs)
    command = f"cotainr build {theirs.name} --base-image {ours.name}"
    assert labels["cotainr.command"].endswith(command)
    assert labels["cotainr-lumi.system"] == "stacked-e2e"  # the base's, kept
    # A layered build on the zstd image (issue 40): a zstd layer on it.
    layered = tmp_path / "layered.sif"
    cotainr_build(
        tmp_path, layered, "--lumi-system=stacked-e2e", "--base-image", ours.name
    )
    parts = [o.parttype for o in sif_objects(layered) if o.datatype == SIF_PARTITION]
    assert parts == [SIF_SYSTEM, SIF_OVERLAY]
    labels = _labels(apptainer_path, layered)
    assert labels["cotainr-lumi.compression"] == "zstd:3"
    assert labels["cotainr-lumi.layers"] == "ours.sif + this build"


def _labels(apptainer_path, image):
    proc = subprocess.run(
        [str(apptainer_path / "apptainer"), "inspect", "--json", "--labels"]
        + [str(image)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)["data"]["attributes"]["labels"]


def test_the_dry_run_shows_the_space_a_build_needs_measured(
    tmp_path, lumi_like_base_image, apptainer_path, cotainr_build
):
    """The estimate counts the base's files (listed, not guessed from the SIF)."""
    sandbox = tmp_path / "sandbox"
    apptainer = str(apptainer_path / "apptainer")
    subprocess.run(
        [apptainer, "build", "--sandbox", str(sandbox), str(lumi_like_base_image)],
        capture_output=True,
        check=True,
        timeout=900,
    )
    du = subprocess.run(
        ["du", "-sb", "--apparent-size", str(sandbox)], capture_output=True, text=True
    )
    unpacked = int(du.stdout.split()[0])
    sif = lumi_like_base_image.stat().st_size
    for flatten, expected in (
        # The sandbox (squashed without a copy), twice the SIF, 2 GiB for pip.
        (["--flatten"], unpacked + 2 * sif + 2 * 1024**3),
        ([], sif + 2 * 1024**3),  # a layer: nothing unpacked, a copy of the base
        (["--layer-only"], 2 * 1024**3),  # the layer alone: no copy either
    ):
        proc = cotainr_build(
            tmp_path,
            tmp_path / "x.sif",
            "--dry-run",
            *flatten,
            "--base-image",
            lumi_like_base_image,
            "--lumi-system=lumi-g-ext-rocm-6.2",
            timeout=300,
        )
        shown = float(re.search(r"needs about ([0-9.]+) GiB", proc.stdout)[1])
        shown *= 1024**3
        limit = 0.06 * 1024**3 + 0.05 * expected
        assert abs(shown - expected) < limit, (shown, expected)
