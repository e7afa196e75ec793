"""End-to-end: a stacked build costs what it changes (issue 30's layered builds).

A build on a local SIF base mounts the base read-only under a writable dir;
the image is the base's file plus one squashfs overlay partition, used only
when the runtime shows it. Pip steps cannot uninstall; a version change
removes the old version's files (whiteouts in the layer).
"""

import hashlib
import json
import os
from pathlib import Path
import subprocess
import sys

from hosttools import need_lmod
from pkgfixtures import make_wheel
import pytest
import yaml

from cotainr_lumi.apptainer import SIF_OVERLAY, SIF_SYSTEM, sif_objects

pytestmark = pytest.mark.e2e

COTAINR = Path(sys.executable).with_name("cotainr")
SYSTEM = "layered-e2e"
#: The state a test reads back: the packages' versions, the removed module.
PROBE = (
    "import importlib.metadata as m, importlib.util as u, added, keep, swap; "
    "print(keep.VERSION, swap.VERSION, added.VERSION, u.find_spec('swap.old'), "
    "*[d.version for d in m.distributions() if d.metadata['Name'] == 'swap'])"
)
#: What PROBE prints on the stacked image: 1.0 of swap and swap.old are gone.
STACKED = ["1.0", "2.0", "1.0", "None", "2.0"]


@pytest.fixture(scope="module")
def work(tmp_path_factory, lumi_like_base_image, write_systems):
    work = tmp_path_factory.mktemp("layered")
    # The base's sha256 is the first entry of the layers label.
    sha = {"provenance": {"hash-base-image": True}}
    system = {"base-image": lumi_like_base_image, "settings": sha}
    write_systems(work / "systems.yaml", {SYSTEM: system})
    make_wheel(work, "keep", "1.0")
    make_wheel(work, "swap", "1.0", modules={"old": "GONE_IN_2 = True\n"})
    make_wheel(work, "swap", "2.0")
    make_wheel(work, "added", "1.0")
    (work / "first.txt").write_text(
        "./keep-1.0-py3-none-any.whl\n./swap-1.0-py3-none-any.whl\n"
    )
    (work / "second.txt").write_text(
        "./swap-2.0-py3-none-any.whl\n./added-1.0-py3-none-any.whl\n"
    )
    (work / "steps.yml").write_text(
        yaml.safe_dump(
            {"steps": [{"requirements": "second.txt", "allow-changes": ["swap"]}]}
        )
    )
    return work


@pytest.fixture(scope="module")
def build(work, cotainr_build):
    """``build(IMAGE, *ARGS)``: ``cotainr build IMAGE ARGS`` in `work` (checked)."""

    def run(image, *args, env=None):
        by = "--lumi-system" if "--base-image" in args else "--system"
        return cotainr_build(work, image, by, SYSTEM, "--force", *args, env=env)

    return run


def partition_digests(image):
    """{(parttype, number of that type): sha256 of its bytes} of a SIF."""
    digests, seen = {}, {}
    with open(image, "rb") as f:
        for part in sif_objects(image):
            if part.parttype in (SIF_SYSTEM, SIF_OVERLAY):
                f.seek(part.offset)
                n = seen[part.parttype] = seen.get(part.parttype, 0) + 1
                digests[part.parttype, n] = hashlib.sha256(
                    f.read(part.size)
                ).hexdigest()
    return digests


@pytest.fixture(scope="module")
def first(build, work):
    """An image cotainr-lumi built: keep 1.0, swap 1.0 (with swap.old)."""
    return build(work / "first.sif", "--pip-requirements", "first.txt")


@pytest.fixture(scope="module")
def stacked(build, work, first):
    """On it: swap 2.0 (swap.old gone) and added 1.0, as a layer."""
    return build(
        work / "stacked.sif",
        "--base-image",
        "first.sif",
        "--pip-steps",
        "steps.yml",
    )


def test_the_first_build_is_the_base_plus_one_layer(work, first, lumi_like_base_image):
    base, image = (
        partition_digests(lumi_like_base_image),
        partition_digests(work / "first.sif"),
    )
    assert image[SIF_SYSTEM, 1] == base[SIF_SYSTEM, 1]
    assert sorted(image) == [(SIF_SYSTEM, 1), (SIF_OVERLAY, 1)]
    assert "Layered image: " in first.stdout


def test_a_stacked_build_adds_one_small_layer_and_runs(
    work, stacked, apptainer_exec, verify_image, apptainer_path, lumi_like_base_image
):
    before, after = (
        partition_digests(work / "first.sif"),
        partition_digests(work / "stacked.sif"),
    )
    assert {k: after[k] for k in before} == before  # byte for byte: O(change)
    assert sorted(after) == [(SIF_SYSTEM, 1), (SIF_OVERLAY, 1), (SIF_OVERLAY, 2)]
    grown = (work / "stacked.sif").stat().st_size - (work / "first.sif").stat().st_size
    assert 0 < grown < 1024**2, grown
    assert "The base image is mounted read-only" in stacked.stdout
    proc = apptainer_exec(work / "stacked.sif", "python3", "-c", PROBE)
    assert proc.stdout.split() == STACKED, proc.stderr
    env = {"COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml")}
    code, statuses, report = verify_image(work / "stacked.sif", env=env)
    assert code == 0 and "FAIL" not in statuses.values(), report
    labels = json.loads(
        subprocess.run(
            [str(apptainer_path / "apptainer"), "inspect", "--json", "--labels"]
            + [str(work / "stacked.sif")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["data"]["attributes"]["labels"]
    layers = labels["cotainr-lumi.layers"].split(" + ")
    assert layers[0].startswith(lumi_like_base_image.name + " sha256:")
    assert layers[1].startswith("layer sha256:") and layers[2] == "this build"
    sif = subprocess.run(
        [
            str(apptainer_path / "apptainer"),
            "sif",
            "dump",
            "2",
            str(work / "stacked.sif"),
        ],
        capture_output=True,
        text=True,
    )
    named = json.loads(sif.stdout)["data"]["attributes"]["labels"][
        "cotainr-lumi.layers"
    ]
    assert named.split(" + ")[:2] == layers[:2] and named.split(" + ")[2].startswith(
        "layer sha256:"
    )


def test_the_module_file_runs_the_layered_image(work, stacked, lmod_init):
    script = (
        f'source {lmod_init} && module use "$1" && module load stacked && '
        f'unset SINGULARITY_BIND && apptainer exec --no-home "$SIF" python3 -c "$2"'
    )
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(work), PROBE],
        env={"PATH": os.environ["PATH"], "HOME": str(work)},
        capture_output=True,
        text=True,
    )
    assert proc.stdout.split() == STACKED, proc.stderr


def test_a_runtime_that_ignores_the_layer_gets_the_whole_image(
    build, work, first, apptainer_path, apptainer_exec
):
    """Apptainer with ``enable overlay = no`` runs the image without its layer."""
    config = work / "no-overlay.conf"
    sid = apptainer_path.parent / "root/etc/apptainer/apptainer.conf"  # provisioned
    conf = sid if sid.is_file() else Path("/etc/apptainer/apptainer.conf")
    text = conf.read_text()
    assert "enable overlay = yes" in text, conf
    config.write_text(text.replace("enable overlay = yes", "enable overlay = no"))
    wrapped = work / "no-overlay-bin"
    wrapped.mkdir(exist_ok=True)
    (wrapped / "apptainer").write_text(
        f'#!/bin/sh\nexec {apptainer_path / "apptainer"} --config {config} "$@"\n'
    )
    (wrapped / "apptainer").chmod(0o755)
    path = f"{wrapped}:{os.environ['PATH']}"
    proc = build(
        work / "whole.sif", "--base-image", "first.sif", "--pip-steps", "steps.yml",
        env={"PATH": path},
    )  # fmt: skip
    assert "Building the whole image (no layer)" in proc.stderr
    assert "shows no layer" in proc.stderr
    parts = partition_digests(work / "whole.sif")
    assert sorted(parts) == [(SIF_SYSTEM, 1)]
    proc = apptainer_exec(work / "whole.sif", "python3", "-c", PROBE)
    assert proc.stdout.split() == STACKED, proc.stderr


#: An apptainer whose exec cannot mount a zstd squashfs (as a kernel and
#: squashfuse without zstd): it refuses a SIF with a zstd partition.
NO_ZSTD = """#!{python}
import os, sys
from cotainr_lumi.apptainer import SIF_SQUASHFS, is_sif, sif_objects
images = sys.argv[2:] if sys.argv[1:2] == ["exec"] else []
for image in (i for i in images if os.path.isfile(i) and is_sif(i)):
    with open(image, "rb") as f:
        for part in sif_objects(image):
            f.seek(part.offset + 20)
            if part.fstype == SIF_SQUASHFS and f.read(2) == b"\\x06\\x00":
                sys.exit("FATAL: no zstd here (simulated kernel and squashfuse)")
os.execv({apptainer!r}, ["apptainer", *sys.argv[1:]])
"""


def test_flatten_squashes_the_whole_image_with_gzip_where_zstd_does_not_mount(
    build, work, first, apptainer_exec, cotainr_build, apptainer_path
):
    """--flatten: the whole image; zstd first, gzip where the runtime lacks it."""
    wrapped = work / "no-zstd-bin"
    wrapped.mkdir(exist_ok=True)
    real = str(apptainer_path / "apptainer")
    (wrapped / "apptainer").write_text(
        NO_ZSTD.format(python=sys.executable, apptainer=real)
    )
    (wrapped / "apptainer").chmod(0o755)
    proc = build(
        work / "flat.sif", "--base-image", "first.sif", "--pip-steps", "steps.yml",
        "--flatten", env={"PATH": f"{wrapped}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert "--flatten: the whole image is squashed again." in proc.stdout
    why = "Squashing the image again with gzip: apptainer cannot run the zstd:3 "
    assert f"{why}image: FATAL: no zstd here" in proc.stderr, proc.output
    assert sorted(partition_digests(work / "flat.sif")) == [(SIF_SYSTEM, 1)]
    labels = apptainer_exec(work / "flat.sif", "cat", "/.singularity.d/labels.json")
    assert json.loads(labels.stdout)["cotainr-lumi.compression"] == "gzip:9"
    proc = apptainer_exec(work / "flat.sif", "python3", "-c", PROBE)
    assert proc.stdout.split() == STACKED, proc.stderr
    # Stock cotainr would unpack the layered first.sif without its layer.
    stock = cotainr_build(work, work / "stock.sif", "--base-image=first.sif", ok=False)
    assert stock.returncode != 0 and not (work / "stock.sif").exists()
    assert "has layers (SIF overlay partitions)" in stock.stderr, stock.output
    assert "Traceback" not in stock.output


def test_layer_only_writes_the_layer_and_the_module_mounts_it_on_the_base(
    build, work, first, lmod_init, apptainer_path, verify_image
):
    """--layer-only: no copy of the base; SIF is the base, *_OVERLAY the layer."""
    base, only = (work / "first.sif").resolve(), work.resolve() / "only.sqfs"
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    proc = build(only, "--base-image", base, "--pip-steps", "steps.yml", "--layer-only")
    assert "The layer alone (" in proc.stdout, proc.stderr
    assert f"--overlay {only}:ro {base} " in proc.stdout  # the run hint
    assert hashlib.sha256(base.read_bytes()).hexdigest() == digest  # untouched
    assert only.read_bytes()[:4] == b"hsqs" and only.stat().st_size < 1024**2
    labels = subprocess.run(
        ["unsquashfs", "-cat", only, "/.singularity.d/labels.json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    labels = json.JSONDecoder().raw_decode(labels)[0]
    assert labels["cotainr-lumi.base-image.resolved"] == str(base)
    assert labels["cotainr-lumi.base-image.sha256"] == digest
    apptainer = apptainer_path / "apptainer"
    script = (
        f'source {lmod_init} && module use "$1" && module load only && '
        f'unset SINGULARITY_BIND && [ "$SIF" = "$3" ] && '
        f'[ "$SINGULARITY_OVERLAY" = "$4:ro" ] && {apptainer} exec --no-home "$SIF" '
        'python3 -c "$2"'
    )
    module = ["bash", "-c", script, "bash", work, PROBE, base, only]
    plain = [apptainer, "exec", "--no-home", base, "python3", "-c", PROBE]
    for cmd, env in (
        (module, {}),
        (plain, {"APPTAINER_OVERLAY": f"{only}:ro"}),  # what the runtime reads
    ):
        proc = subprocess.run(
            list(map(str, cmd)),
            env={**env, "HOME": str(work), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
        )
        assert proc.stdout.split() == STACKED, proc.stderr
    env = {"COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml")}
    code, statuses, report = verify_image(only, env=env)
    assert code == 0 and "FAIL" not in statuses.values(), report


@pytest.fixture(scope="session")
def lmod_init():
    return need_lmod()
