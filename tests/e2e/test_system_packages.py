"""End-to-end: system packages without root (issue 42), real Apptainer and proot.

On a base laid out like LUST's 2024 EasyBuild PyTorch images (layout 1 of
``layouts.py``: the env ``/opt/miniconda3/envs/pytorch`` activated by
``$WITH_CONDA``; Debian 12, so Debian's mirrors and Debian's ``proot``, which
stands for LUMI's PRoot module), a build run by a **non-root user** (the
provisioned Apptainer then runs unprivileged, through user namespaces) adds
``jq`` and ``libaio-dev`` with the base's apt-get under proot's fake root and
a pip step with uv; the tool runs and the records list the packages. Then,
as root on the same base, bad input: an unknown package, apt failing
mid-way (a proxy that fails a package download), no network (a proxy that
refuses), a package that needs real root, proot missing and a base without a
package manager each give one error, write no image and change nothing on
this machine (its dpkg database, apt's sources and log).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

from errorlines import error_lines
from hosttools import as_user, need_proot, real_users
import layouts
from pkgfixtures import make_wheel
import pytest
import yaml

pytestmark = pytest.mark.e2e

SYSTEM = "syspkg-e2e"
#: What a build must not change on this machine (not its users: other tests
#: add and remove users).
HOST_FILES = (
    "/var/lib/dpkg/status",
    "/etc/apt/sources.list.d/debian.sources",
    "/var/log/apt/history.log",
)


def host_state():
    return {
        path: hashlib.sha256(Path(path).read_bytes()).hexdigest()
        for path in HOST_FILES
        if Path(path).exists()
    }


@pytest.fixture(scope="module")
def work(derived_base, write_systems):
    """A work dir any user can read, the layout-1 base and the test system."""
    need_proot()
    work = Path(tempfile.mkdtemp(prefix="syspkg-e2e-", dir="/tmp"))
    work.chmod(0o755)
    # test_module_dropin.py's layout-1 base; a copy the user can read.
    shared = derived_base(
        "layout1-bare",
        cases=(),
        setup=layouts.LAYOUT1,
        python=f"{layouts.ENV}/bin/python",
    )
    base = shutil.copy(shared, work / "derived-base.sif")
    write_systems(work / "systems.yaml", {SYSTEM: {"base-image": base}})
    (work / "wheels").mkdir()
    wheel = make_wheel(work / "wheels", "syspkgdemo", "1.0")
    (work / "req.txt").write_text(f"./wheels/{wheel.name}\n")
    steps = {
        "system-packages": ["jq", "libaio-dev"],
        "installer": "uv",
        "steps": [{"requirements": "req.txt"}],
    }
    (work / "steps.yml").write_text(yaml.safe_dump(steps))
    yield work
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def user_image(work, apptainer_path, build_times):
    """The build run by a user who is not root (and the build's output)."""
    with real_users(1, why="a build by a user who is not root") as (user,):
        shutil.chown(work, user)
        image = work / "user.sif"
        env = {
            "PATH": f"{apptainer_path}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(work),
            "TMPDIR": str(work),
            "XDG_CACHE_HOME": str(work / "xdg-cache"),
            "COTAINR_LUMI_SYSTEMS": str(work / "systems.yaml"),
            "APPTAINER_MKSQUASHFS_ARGS": os.environ.get(
                "APPTAINER_MKSQUASHFS_ARGS", ""
            ),
        }
        command = [Path(sys.executable).with_name("cotainr"), "build", image]
        command += [f"--system={SYSTEM}", "--pip-steps", "steps.yml"]
        proc = subprocess.run(
            as_user(user) + [str(c) for c in command],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
        assert image.stat().st_uid != 0
        yield image, proc.stdout + proc.stderr


def test_a_user_adds_system_packages_and_the_records_list_them(
    user_image, apptainer_exec
):
    image, log = user_image
    assert "Finished stage system-packages" in log
    script = (
        "jq --version; ls /usr/lib/x86_64-linux-gnu/libaio.so; "
        "$WITH_CONDA; python -c 'import syspkgdemo; print(syspkgdemo.VERSION)'; "
        "echo ===; cat /opt/cotainr-lumi/system-packages.json; echo ===; "
        "cat /opt/cotainr-lumi/pip/steps.json; echo ===; "
        "ls -a /opt/cotainr-lumi /tmp /usr/sbin"
    )
    proc = apptainer_exec(image, "bash", "-c", script)
    assert proc.returncode == 0, proc.stderr
    head, record, steps, listing = proc.stdout.split("===\n")
    lines = head.splitlines()
    assert lines[0].startswith("jq-") and lines[2] == "1.0", lines
    record = json.loads(record)
    added = {p["name"]: p["version"] for p in record["added"]}
    assert {"jq", "libaio-dev", "libaio1"} <= set(added) and record["manager"] == "apt"
    assert json.loads(steps)["steps"][0]["installer"] == "uv"
    # Nothing of the build's scratch, apt's lists or uv stays in the image.
    names = listing.split()
    assert not {".system-packages-work", ".pip-work", "policy-rc.d"} & set(names)
    proc = apptainer_exec(image, "bash", "-c", "ls /var/lib/apt/lists; command -v uv")
    assert proc.stdout.split() in ([], ["auxfiles"], ["lock"], ["auxfiles", "lock"])


@contextlib.contextmanager
def apt_proxy(*, fail=None):
    """An HTTP proxy for apt on 127.0.0.1 that fails the downloads naming `fail`."""

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if fail and fail in self.path:
                self.send_error(500, "failed by the test proxy")
                return
            try:
                with urllib.request.urlopen(self.path, timeout=60) as upstream:
                    body = upstream.read()
                    status = upstream.status
            except urllib.error.HTTPError as e:
                self.send_error(e.code)
                return
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _refused(cotainr_build, work, name, *args, env=None):
    """A build that must fail with one error and no image; its stderr."""
    image = work / f"{name}.sif"
    before = host_state()
    proc = cotainr_build(
        work, image, *args, env=env, ok=False, name=f"system-packages: {name}"
    )
    assert proc.returncode != 0, proc.output[-3000:]
    assert len(error_lines(proc.stderr)) == 1, proc.output[-6000:]
    assert not image.exists() and host_state() == before
    return proc.stderr


def test_bad_input_is_one_error_and_changes_nothing(
    work, cotainr_build, apptainer_path
):
    system = (f"--system={SYSTEM}",)
    jq = "--set=system-packages.packages=[jq]"
    err = _refused(
        cotainr_build,
        work,
        "unknown",
        *system,
        "--set=system-packages.packages=[no-such-pkg-42]",
    )
    assert "knows no package no-such-pkg-42" in err
    err = _refused(
        cotainr_build,
        work,
        "offline",
        *system,
        jq,
        env={"http_proxy": "http://127.0.0.1:1"},
    )
    assert "could not reach the base image's package sources" in err
    with apt_proxy(fail="/jq_") as proxy:  # after the lists and other packages
        err = _refused(
            cotainr_build, work, "mid-way", *system, jq, env={"http_proxy": proxy}
        )
    assert "apt-get install could not reach" in err and "500" in err
    err = _refused(
        cotainr_build, work, "root", *system, "--set=system-packages.packages=[systemd]"
    )
    assert "systemd cannot be installed without root" in err
    err = _refused(
        cotainr_build,
        work,
        "no-proot",
        *system,
        jq,
        "--set=system-packages.proot=/no/such/proot",
        "--dry-run",
    )
    assert "system-packages needs proot" in err and "module load LUMI PRoot" in err
    # A base with no package manager: the base unpacked, apt-get and dpkg removed.
    bare = work / "bare"
    subprocess.run(
        [
            apptainer_path / "apptainer",
            "build",
            "--sandbox",
            bare,
            work / "derived-base.sif",
        ],
        capture_output=True,
        check=True,
        cwd=work,
    )
    for tool in ("apt-get", "dpkg"):
        (bare / "usr/bin" / tool).unlink()
    err = _refused(
        cotainr_build, work, "bare", "--base-image", bare, "--lumi-system", SYSTEM, jq
    )
    assert "the base image has no package manager" in err
