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
import shutil
import subprocess
import sys

from errorlines import error_lines
from hosttools import need_lmod, need_tool
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
    # A package's own file named as a whiteout of pip (site-packages/pip).
    make_wheel(work, "whout", "1.0", files={".wh.pip": "not a whiteout\n"})
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

    def run(image, *args, env=None, ok=True):
        by = "--lumi-system" if "--base-image" in args else "--system"
        return cotainr_build(work, image, by, SYSTEM, "--force", *args, env=env, ok=ok)

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


@pytest.fixture(scope="module")
def layer_only(build, work, first):
    """A --layer-only build on a copy of first.sif: (base, layer, sha256, build)."""
    base, only = work.resolve() / "only-base.sif", work.resolve() / "only.sqfs"
    shutil.copyfile(work / "first.sif", base)
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    proc = build(only, "--base-image", base, "--pip-steps", "steps.yml", "--layer-only")
    return base, only, digest, proc


def test_layer_only_writes_the_layer_and_the_module_mounts_it_on_the_base(
    work, layer_only, lmod_init, apptainer_path, verify_image
):
    """--layer-only: no copy of the base; SIF is the base, *_OVERLAY the layer."""
    base, only, digest, proc = layer_only
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


def failing_mount():
    """``mount`` failing as the layered build calls it (as root), not as Apptainer does."""
    return (
        'case " $* " in *sizelimit=*) echo "mount: simulated" >&2; exit 32;; esac\n'
        f'exec {need_tool("mount", install="apt-get install -y mount")} "$@"'
    )


def wrapped(work, name, **scripts):
    """A directory of ``NAME`` scripts (sh bodies) before PATH; returns {"PATH": ...}."""
    bin_dir = work / name
    bin_dir.mkdir(exist_ok=True)
    for command, body in scripts.items():
        (bin_dir / command).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / command).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def refused_without_trace(proc, image):
    """One error, exit non-zero, no image and no partial image beside it."""
    assert proc.returncode != 0, proc.output[-3000:]
    assert len(error_lines(proc.stderr)) == 1, proc.output[-3000:]
    assert "Traceback" not in proc.output
    assert not [p for p in image.parent.iterdir() if p.name.startswith(image.name)]
    assert not [p for p in image.parent.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("fault", ["mount", "runtime"])
def test_a_layered_base_that_does_not_mount_is_refused_not_unpacked(
    build, work, first, apptainer_path, fault
):
    """A failing mount, or a runtime that cannot run the mounted view (issue 38, 1)."""
    real = apptainer_path / "apptainer"
    runtime = (
        'case " $* " in *" --writable "*" true ") '
        'echo "FATAL: simulated: the mount is not seen" >&2; exit 255;; esac\n'
        f'exec {real} "$@"'
    )
    scripts = {"mount": failing_mount()}
    if fault == "runtime":
        scripts = {"apptainer": runtime, "singularity": runtime}
    env = wrapped(work, f"no-{fault}", **scripts)
    image = work / f"refused-{fault}.sif"
    proc = build(image, "--base-image", "first.sif", env=env, ok=False)
    refused_without_trace(proc, image)
    assert "first.sif has layers (SIF overlay partitions)" in proc.stderr
    assert "simulated" in proc.stderr and "--flatten" in proc.stderr
    assert "unpacked (not mounted)" not in proc.output


def test_a_base_without_layers_that_does_not_mount_is_unpacked(build, work):
    env = wrapped(work, "no-mount", mount=failing_mount())
    proc = build(work / "unpacked.sif", env=env)
    assert "The base image is unpacked (not mounted): mount -t squashfs" in proc.stderr
    assert sorted(partition_digests(work / "unpacked.sif")) == [(SIF_SYSTEM, 1)]


def test_a_base_renamed_over_mid_build_gives_no_mixed_image(
    build, work, first, lumi_like_base_image
):
    """Another file is renamed over the base once the view is mounted (issue 38, 2)."""
    moving, other = work / "moving.sif", work / "other.sif"
    shutil.copyfile(work / "first.sif", moving)
    shutil.copyfile(lumi_like_base_image, other)
    real = need_tool("mount", install="apt-get install -y mount")
    mount = (
        f'{real} "$@" || exit\n'
        f'case " $* " in *" -t overlay "*) mv -f {other} {moving};; esac'
    )
    env = wrapped(work, "renaming-mount", mount=mount)
    image = work / "moved.sif"
    proc = build(image, "--base-image", moving.name, "--pip-steps", "steps.yml",
                 env=env, ok=False)  # fmt: skip
    assert not other.exists()  # renamed over it meanwhile
    refused_without_trace(proc, image)
    assert f"The base image {moving} changed during the build" in proc.stderr


@pytest.mark.parametrize("flatten", [False, True])
def test_a_packages_wh_file_stays_a_file(build, work, first, apptainer_exec, flatten):
    """A wheel's ``.wh.pip`` is no whiteout of pip (issue 38, 3)."""
    (work / "whout.txt").write_text("./whout-1.0-py3-none-any.whl\n")
    image = work / f"whout-{flatten}.sif"
    args = ["--base-image", "first.sif", "--pip-requirements", "whout.txt"]
    proc = build(image, *args, *(["--flatten"] * flatten))
    assert ("Layered image: " in proc.stdout) != flatten, proc.output[-2000:]
    script = (
        "import os, pip; site = os.path.dirname(os.path.dirname(pip.__file__)); "
        "print(open(os.path.join(site, '.wh.pip')).read().strip())"
    )
    run = apptainer_exec(image, "python3", "-c", script)
    assert run.stdout.strip() == "not a whiteout", run.stderr


def test_a_layer_only_image_runs_without_the_module_and_never_on_another_base(
    work, layer_only, lmod_init, verify_image, lumi_like_base_image
):
    """The host wrappers alone (issue 38, 5); a base swapped (issue 38, 4)."""
    base, only, _, _ = layer_only
    env = {"HOME": str(work), "PATH": os.environ["PATH"]}
    python = [str(work / "only.root/bin/python3"), "-c", PROBE]
    proc = subprocess.run(python, env=env, capture_output=True, text=True)
    assert proc.stdout.split() == STACKED, proc.stderr
    kept = base.with_name("only-base.kept")
    os.rename(base, kept)
    try:
        shutil.copyfile(lumi_like_base_image, base)  # another base at its path
        code, statuses, report = verify_image(only, env={"XDG_CACHE_HOME": str(work)})
        assert code == 1 and statuses["layer-base"] == "FAIL", report
        module = (
            f'source {lmod_init} && module use "$1" && module load only && echo $SIF'
        )
        for cmd in (python, ["bash", "-c", module, "bash", work]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            assert proc.returncode != 0 and str(base) not in proc.stdout, proc.stdout
            message = " ".join(proc.stderr.split())
            assert f"the base image {base} is not the one the layer" in message
    finally:
        os.replace(kept, base)
    code, statuses, report = verify_image(only, env={"XDG_CACHE_HOME": str(work)})
    assert statuses["layer-base"] == "PASS", report


@pytest.fixture(scope="session")
def lmod_init():
    return need_lmod()
