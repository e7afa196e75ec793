"""End-to-end tests of hostile base images: the sandbox is the only place a build writes.

Two bases are made with real Apptainer from one sandbox of the LUMI-like
base, each with a link leaving the image to a host directory under /tmp
(which the container shares with the host):

- ``/opt/cotainr-lumi -> /tmp/<host dir>``, where another user planted a
  requirements file and a wheel: the build must install the requested step,
  from the files it wrote, and leave the host directory as it was;
- ``/.singularity.d/labels.json -> /tmp/<host dir>/labels.json``: the build
  (and its dry run) stops with one error before Apptainer makes the sandbox
  (Apptainer would add its ``org.label-schema.*`` build labels through the
  link), writes no image, and the host file is left as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile
import time

from pkgfixtures import make_wheel
import pytest
import yaml

pytestmark = pytest.mark.e2e

COTAINR = Path(sys.executable).with_name("cotainr")
SYSTEM = "hostile-base-e2e"


def host_files(host):
    """Every path below `host` with its content (None for a directory)."""
    return {p: p.read_bytes() if p.is_file() else None for p in host.rglob("*")}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, lumi_like_base_image, apptainer_path):
    """(work dir, host dir, base with the records link, base with the labels link)."""
    apptainer = str(apptainer_path / "apptainer")
    work = tmp_path_factory.mktemp("hostile-base")
    host = Path(tempfile.mkdtemp(prefix="cl29-host-", dir="/tmp"))
    run = dict(capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=work)
    sandbox = work / "sandbox"
    proc = subprocess.run(
        [apptainer, "build", "--sandbox", str(sandbox), str(lumi_like_base_image)],
        timeout=900,
        **run,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bases = []
    records = sandbox / "opt/cotainr-lumi"
    labels = sandbox / ".singularity.d/labels.json"
    for name in ("records-link", "labels-link"):
        if name == "records-link":
            records.symlink_to(host)
        else:
            records.unlink()
            labels.unlink()
            labels.symlink_to(host / "labels.json")
        image = work / f"{name}.sif"
        proc = subprocess.run(
            [apptainer, "build", "--force", str(image), str(sandbox)],
            timeout=900,
            **run,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        bases.append(image)
    shutil.rmtree(sandbox)
    for entry in host.iterdir():  # what building the bases wrote there
        entry.unlink()
    (work / "systems.yaml").write_text(
        yaml.safe_dump(
            {
                "systems": {
                    SYSTEM: {
                        "extends": "lumi-g-ext",
                        "base-image": str(lumi_like_base_image),
                        "rocm-version": "6.1",
                        "settings": {"provenance": {"hash-base-image": False}},
                    }
                }
            }
        )
    )
    yield work, host, *bases
    shutil.rmtree(host)


def build(work, image, base, *args):
    """``cotainr build IMAGE --base-image BASE --lumi-system ...``."""
    return subprocess.run(
        [
            str(COTAINR),
            "build",
            str(image),
            "--base-image",
            str(base),
            "--lumi-system",
            SYSTEM,
            *args,
        ],
        cwd=work,
        env={**os.environ, "COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml")},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def test_a_records_link_to_a_host_dir_installs_the_requested_step(
    hostile, apptainer_exec, build_times
):
    # Before: records were written inside the sandbox, but pip in the
    # container read the host's /tmp/<dir>: it installed the planted package,
    # said "added by this build" and exited 0.
    work, host, base, _ = hostile
    wanted = make_wheel(work, "wanted-pkg", "1.0")
    (work / "reqs.txt").write_text(f"./{wanted.name}\n")
    planted = make_wheel(host, "planted-pkg", "6.6.6")
    (host / "pip/step1").mkdir(parents=True)
    (host / "pip/step1/reqs.txt").write_text(f"{planted}\n")
    (host / "pip/step1/protected-constraints.txt").write_text("")
    before = host_files(host)
    image = work / "records.sif"
    t0 = time.time()
    proc = build(work, image, base, "--pip-requirements", "reqs.txt")
    build_times["hostile base, records link"] = time.time() - t0
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    script = (
        "import importlib.util as u, os; "
        "print(u.find_spec('wanted_pkg') is not None, "
        "u.find_spec('planted_pkg') is not None, "
        "os.path.islink('/opt/cotainr-lumi'), "
        "'planted' in open('/opt/cotainr-lumi/pip/step1/reqs.txt').read())"
    )
    proc = apptainer_exec(image, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "False", "False"]
    assert host_files(host) == before
    assert "/opt/cotainr-lumi is a symbolic link" in output


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_labels_link_to_a_host_file_is_one_error_and_no_image(hostile, dry_run):
    work, host, _, base = hostile
    labels = host / "labels.json"
    labels.write_text(json.dumps({"host": "precious"}))
    before = host_files(host)
    image = work / "labels.sif"
    proc = build(work, image, base, *(["--dry-run"] if dry_run else []))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert output.count("error:") == 1, output[-3000:]
    assert f"/.singularity.d/labels.json is a symbolic link (to {labels})" in output
    assert "Creating Singularity Sandbox" not in output  # refused before Apptainer
    assert not image.exists()
    assert not list(work.glob(".labels.sif*"))
    assert host_files(host) == before  # not even Apptainer's build labels
