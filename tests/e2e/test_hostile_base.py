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
from pathlib import Path
import shutil
import subprocess
import tempfile

from errorlines import error_lines
from pkgfixtures import make_wheel
import pytest

pytestmark = pytest.mark.e2e

SYSTEM = "hostile-base-e2e"


def system_on(base):
    """The arguments of a build of the test system on the image `base`."""
    return ("--base-image", base, "--lumi-system", SYSTEM)


def host_files(host):
    """Every path below `host` with its content (None for a directory)."""
    return {p: p.read_bytes() if p.is_file() else None for p in host.rglob("*")}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, lumi_like_base_image, apptainer_path, write_systems):
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
    write_systems(work / "systems.yaml", {SYSTEM: {"base-image": lumi_like_base_image}})
    yield work, host, *bases
    shutil.rmtree(host)


def test_a_records_link_to_a_host_dir_installs_the_requested_step(
    hostile, apptainer_exec, cotainr_build
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
    output = cotainr_build(
        work,
        image,
        *system_on(base),
        "--pip-requirements",
        "reqs.txt",
        name="hostile base, records link",
    ).output
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
def test_a_labels_link_to_a_host_file_is_one_error_and_no_image(
    hostile, dry_run, cotainr_build
):
    work, host, _, base = hostile
    labels = host / "labels.json"
    labels.write_text(json.dumps({"host": "precious"}))
    before = host_files(host)
    image = work / "labels.sif"
    dry = ["--dry-run"] if dry_run else []
    proc = cotainr_build(work, image, *system_on(base), *dry, ok=False)
    output = proc.output
    assert proc.returncode == 2
    assert len(error_lines(output)) == 1, output[-3000:]
    assert f"/.singularity.d/labels.json is a symbolic link (to {labels})" in output
    assert "Creating Singularity Sandbox" not in output  # refused before Apptainer
    assert not image.exists()
    assert not list(work.glob(".labels.sif*"))
    assert host_files(host) == before  # not even Apptainer's build labels
