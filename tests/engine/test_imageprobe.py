"""The probe of an image: dry runs ask a local base image, builds their sandbox."""

import os
import subprocess

from planfakes import build_facts
import pytest

from cotainr_lumi import apptainer
from cotainr_lumi.engine import imageprobe
from cotainr_lumi.errors import StageError
from cotainr_lumi.processes import CommandError

SIF_HEADER = b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC\x0001\x00rest"


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """An `apptainer` on PATH that prints FATAL and exits 255 (a failed start)."""
    (tmp_path / "bin").mkdir()
    path = tmp_path / "bin" / "apptainer"
    path.write_text(
        "#!/bin/sh\necho 'FATAL:   context deadline exceeded' >&2\nexit 255\n"
    )
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{path.parent}{os.pathsep}{os.environ['PATH']}")
    return path


def test_a_base_that_cannot_run_here_is_not_asked(tmp_path, runtime, monkeypatch):
    not_an_image = tmp_path / "base.sif"
    not_an_image.write_text("a stand-in for a base image\n")
    assert imageprobe.probe_image_facts(image=not_an_image) is None
    sif = tmp_path / "real.sif"
    sif.write_bytes(SIF_HEADER)
    monkeypatch.setattr(apptainer, "find_runtime", lambda: None)
    assert imageprobe.probe_image_facts(image=sif) is None


def test_a_probe_that_failed_raises_with_its_output(tmp_path, runtime):
    sif = tmp_path / "base.sif"
    sif.write_bytes(SIF_HEADER)
    with pytest.raises(subprocess.CalledProcessError) as info:
        imageprobe.probe_image_facts(image=sif)
    assert info.value.returncode == 255
    assert "context deadline exceeded" in info.value.stderr


class NoisySandbox:
    """A sandbox whose container fails after an env script printed 20 MB."""

    def __init__(self, root):
        self.root = root

    def run(self, args, *, env=None, timeout=None):
        raise CommandError(
            cmd=args,
            returncode=1,
            stdout="",
            stderr="x" * 20_000_000 + "\nERROR: " + "y" * 20_000_000 + "\nFATAL: end",
        )


def test_a_20_mb_line_makes_a_short_error(tmp_path):
    with pytest.raises(StageError) as info:
        imageprobe.probe_build(sandbox=NoisySandbox(tmp_path), build=build_facts())
    message = str(info.value)
    assert len(message.encode()) < 5000
    assert "could not start the container" in message
    assert "(20000007 bytes)" in message and message.endswith("FATAL: end")
