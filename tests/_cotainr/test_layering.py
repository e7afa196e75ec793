"""cotainr's sandbox as a mounted view (cotainr_lumi/_cotainr/layering.py)."""

from pathlib import Path

import pytest

from cotainr_lumi._cotainr import layering


class Sandbox:
    """cotainr's SingularitySandbox as far as layering sees it."""

    def __init__(self, log):
        self.log, self.sandbox_dir = log, Path("/sandbox")

    def _subprocess_runner(self, *, args):
        self.log.append(("run", " ".join(args)))

    def __enter__(self):
        self._subprocess_runner(args=["singularity", "build", "--sandbox", "/s", "b"])
        self._subprocess_runner(args=["singularity", "exec", "/s", "uname"])
        return self

    def __exit__(self, *exc):
        self.log.append(("cotainr removes", str(self.sandbox_dir)))

    def build_image(self, *, path):
        self.log.append(("squash", path))


layering.install(Sandbox)


class View:
    Error = RuntimeError  # engine/layer.py's LayerError

    def __init__(self, log, *, fails=None, writes=True, layers=0):
        self.log, self.fails, self.writes, self.merged = log, fails, writes, None
        self.layers = layers

    def mount(self, *, at):
        if self.fails:
            raise self.fails
        self.merged = at
        self.log.append(("mount", str(at)))

    def refused(self, problem):
        return ValueError(f"refused: {problem}")

    def unmount(self):
        self.log.append(("unmount",))

    def write_image(self, *, path):
        self.log.append(("layer", path))
        return self.writes


def test_a_view_is_mounted_instead_of_unpacked_and_unmounted_first():
    log = []
    with layering.layered(View(log)), Sandbox(log) as sandbox:
        sandbox.build_image(path="x.sif")
    assert log == [
        ("mount", "/sandbox"),
        ("run", "singularity exec /s uname"),
        ("layer", "x.sif"),
        ("unmount",),
        ("cotainr removes", "/sandbox"),
        ("unmount",),  # again at the end of layered(): nothing left
    ]


def test_a_view_that_cannot_be_mounted_or_written_is_cotainrs_build(caplog):
    log = []
    with (
        layering.layered(View(log, fails=OSError("no loop devices"))),
        Sandbox(log) as sandbox,
    ):
        sandbox.build_image(path="x.sif")
    assert log[0] == ("run", "singularity build --sandbox /s b")
    assert ("squash", "x.sif") in log and ("layer", "x.sif") not in log
    assert "The base image is unpacked (not mounted): no loop devices" in caplog.text
    log.clear()
    with layering.layered(View(log, writes=False)), Sandbox(log) as sandbox:
        sandbox.build_image(path="x.sif")
    assert log[2:4] == [("layer", "x.sif"), ("squash", "x.sif")]
    log.clear()
    with Sandbox(log) as sandbox:  # no view: cotainr's own
        sandbox.build_image(path="x.sif")
    assert log[0] == ("run", "singularity build --sandbox /s b")


@pytest.mark.parametrize("error", [OSError("no loop devices"), RuntimeError("FATAL")])
def test_a_base_with_layers_that_cannot_be_mounted_is_refused_not_unpacked(error):
    log = []
    view = View(log, fails=error, layers=2)
    with pytest.raises(ValueError, match=f"refused: {error}"):
        with layering.layered(view), Sandbox(log):
            pass
    assert ("run", "singularity build --sandbox /s b") not in log


def test_only_the_mount_errors_are_caught():
    log = []
    with pytest.raises(KeyError):  # e.g. a bug: not "unpacked (not mounted)"
        with layering.layered(View(log, fails=KeyError("bug"))), Sandbox(log):
            pass
    assert ("run", "singularity build --sandbox /s b") not in log
