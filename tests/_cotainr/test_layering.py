"""cotainr's sandbox as a mounted view (cotainr_lumi/_cotainr/layering.py)."""

from pathlib import Path

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
    def __init__(self, log, *, fails=False, writes=True):
        self.log, self.fails, self.writes, self.merged = log, fails, writes, None

    def mount(self, *, at):
        if self.fails:
            raise OSError("no loop devices")
        self.merged = at
        self.log.append(("mount", str(at)))

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
    with layering.layered(View(log, fails=True)), Sandbox(log) as sandbox:
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


def test_whole_images_are_the_writers_and_cotainrs_where_it_cannot(caplog):
    log, calls = [], []

    def write_sif(**where):
        calls.append(where)
        return where["architecture"] == "x86_64" or None  # None: it cannot

    for arch, squashed in (("x86_64", False), ("vax", True)):
        with layering.whole_images(write_sif), Sandbox(log) as sandbox:
            sandbox.architecture = arch
            sandbox.build_image(path="x.sif")
        assert (("squash", "x.sif") in log) == squashed
    assert calls[0] == {
        "sandbox_dir": Path("/sandbox"),
        "path": Path("x.sif"),
        "architecture": "x86_64",
    }
    log.clear()
    with Sandbox(log) as sandbox:  # after whole_images(): cotainr's own
        sandbox.build_image(path="x.sif")
    assert ("squash", "x.sif") in log and len(calls) == 2
