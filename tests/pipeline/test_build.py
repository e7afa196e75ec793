from dataclasses import dataclass
import os
from pathlib import Path
import subprocess

import pytest

from cotainr_lumi import api, stages
from cotainr_lumi.engine.layer import LayerError
from cotainr_lumi.engine.settings import StageSettings, setting
from cotainr_lumi.engine.stage import HostFiles, Stage, StageReport
from cotainr_lumi.errors import ImageExistsError, StageError

RUN_ORDER = []


class RecordA(Stage):
    name = "test-record-a"

    def run(self, *, context):
        RUN_ORDER.append((self.name, list(r.name for r in context.earlier)))
        context.sandbox.run(["echo", "a"], env={"X": "1"})
        return StageReport(name=self.name, summary="did a", labels={"test.a": "1"})


class RecordB(Stage):
    name = "test-record-b"

    def run(self, *, context):
        RUN_ORDER.append((self.name, list(r.name for r in context.earlier)))
        return StageReport(
            name=self.name,
            labels={
                "test.b": "a-ran-before"
                if any("test.a" in r.labels for r in context.earlier)
                else "b-first"
            },
        )


class Failing(Stage):
    name = "test-failing"

    def run(self, *, context):
        raise StageError("deliberate failure", stage=self.name)


@pytest.fixture(autouse=True)
def test_stages(monkeypatch):
    """The pipeline with this module's stages after the built-in ones."""
    test_only = (RecordA, RecordB, Failing, Buggy, WritesOutputs)
    monkeypatch.setattr(stages, "PIPELINE", (*stages.PIPELINE, *test_only))


@pytest.fixture
def ordered_profile(tmp_path, base_image, monkeypatch):
    path = tmp_path / "ordered.yaml"
    path.write_text(
        "systems:\n"
        "  ordered:\n"
        f"    base-image: {base_image}\n"
        "    stages: [test-record-b, test-record-a, provenance]\n"
        "  failing:\n"
        f"    base-image: {base_image}\n"
        "    stages: [test-record-a, test-failing, provenance]\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    RUN_ORDER.clear()
    return path


def build(tmp_path, system, **kwargs):
    """One build through the one driver: cotainr's Build with the seam."""
    return api.build(image_path=tmp_path / "out.sif", system=system, **kwargs)


def test_stages_run_in_profile_order_between_sandbox_and_image(
    tmp_path, fake_singularity, ordered_profile, labels_of
):
    result = build(tmp_path, "ordered")
    assert [name for name, _ in RUN_ORDER] == ["test-record-b", "test-record-a"]
    assert RUN_ORDER[1][1] == ["test-record-b"]  # a sees b's report
    assert [r.name for r in result.reports] == [
        "test-record-b",
        "test-record-a",
        "provenance",
    ]
    # sandbox first, image last, stage commands in between
    cmds = fake_singularity.commands
    assert "--sandbox" in cmds[0]
    # Built under a temporary name (the backport's, or cotainr's own with
    # the series' --force patch) and moved into place.
    assert cmds[-1][-2].endswith(f"partial-{os.getpid()}")
    assert ["env", "X=1", "echo", "a"] in fake_singularity.exec_commands
    labels = labels_of(tmp_path / "out.sif")
    assert labels["test.a"] == "1"
    assert labels["test.b"] == "b-first"
    assert labels["cotainr-lumi.stages"] == "test-record-b,test-record-a,provenance"
    assert "cotainr.version" in labels  # cotainr's own metadata is still there
    assert not list(tmp_path.glob("*partial-*")) + list(tmp_path.glob(".*partial-*"))


def test_failing_stage_leaves_no_image_and_keeps_existing(
    tmp_path, fake_singularity, ordered_profile
):
    existing = tmp_path / "out.sif"
    existing.write_bytes(b"precious")
    with pytest.raises(StageError, match="deliberate failure"):
        build(tmp_path, "failing", force=True)
    assert existing.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []
    assert not any(
        "--sandbox" not in c and "build" in c for c in fake_singularity.commands
    )


def test_failing_stage_without_existing_image_creates_nothing(
    tmp_path, fake_singularity, ordered_profile
):
    with pytest.raises(StageError):
        build(tmp_path, "failing")
    assert not (tmp_path / "out.sif").exists()


def test_existing_image_without_force_is_refused_before_anything_runs(
    tmp_path, fake_singularity, ordered_profile
):
    (tmp_path / "out.sif").write_bytes(b"precious")
    with pytest.raises(ImageExistsError, match="--force"):
        build(tmp_path, "ordered")
    assert fake_singularity.commands == []
    assert (tmp_path / "out.sif").read_bytes() == b"precious"


def test_force_replaces_existing_image(tmp_path, fake_singularity, ordered_profile):
    (tmp_path / "out.sif").write_bytes(b"old")
    build(tmp_path, "ordered", force=True)
    assert (tmp_path / "out.sif").read_bytes().startswith(b"FAKE-SIF")


def test_dry_run_runs_nothing(tmp_path, fake_singularity, ordered_profile):
    result = build(tmp_path, "ordered", dry_run=True)
    assert result.dry_run and fake_singularity.commands == []
    assert not (tmp_path / "out.sif").exists()
    assert "1. cotainr: create the sandbox" in result.plan_text
    assert result.plan_text.index("test-record-b") < result.plan_text.index(
        "test-record-a"
    )


def test_bind_variables_are_unset_during_build_and_restored(
    tmp_path, fake_singularity, ordered_profile, monkeypatch, mocker
):
    monkeypatch.setenv("SINGULARITY_BIND", "/var/spool/slurmd,/opt/cray")
    seen = []
    fake_singularity.add_handler(
        lambda argv: "echo" in argv,
        lambda argv: (
            seen.append(os.environ.get("SINGULARITY_BIND"))
            or __import__("subprocess").CompletedProcess(argv, 0, "", "")
        ),
    )
    build(tmp_path, "ordered")
    assert seen == [None]
    assert os.environ["SINGULARITY_BIND"] == "/var/spool/slurmd,/opt/cray"


def test_command_failure_becomes_stage_error_with_output(
    tmp_path, fake_singularity, ordered_profile
):
    import subprocess

    def fail(argv):
        raise subprocess.CalledProcessError(
            1, argv, output="", stderr="ERROR: something broke\nmore\n"
        )

    fake_singularity.add_handler(lambda argv: argv[:2] == ["env", "X=1"], fail)
    with pytest.raises(StageError) as info:
        build(tmp_path, "ordered")
    assert info.value.stage == "test-record-a"
    assert "ERROR: something broke" in str(info.value)
    assert not (tmp_path / "out.sif").exists()


def test_base_image_link_is_recorded_and_checked(
    tmp_path, fake_singularity, ordered_profile, base_image, caplog
):
    # cotainr builds from the base image as given (a plugin cannot replace
    # it); the link's target is logged and recorded.
    with caplog.at_level("INFO", logger="cotainr.cotainr_lumi"):
        build(tmp_path, "ordered")
    real = os.path.realpath(base_image)
    assert fake_singularity.commands[0][-1] == str(base_image)
    assert f"Base image {base_image} is a link to {real}" in caplog.text


def test_base_image_link_re_pointed_during_the_build_stops_it(
    tmp_path, fake_singularity, ordered_profile, base_image
):
    other = tmp_path / "other.sif"
    other.write_bytes(b"another base")

    def re_point(argv):  # while cotainr asks the sandbox for its architecture
        Path(base_image).unlink()
        Path(base_image).symlink_to(other)
        return subprocess.CompletedProcess(argv, 0, stdout="x86_64\n", stderr="")

    fake_singularity.add_handler(lambda argv: argv[:2] == ["uname", "-m"], re_point)
    with pytest.raises(StageError, match="re-pointed"):
        build(tmp_path, "ordered")
    assert not (tmp_path / "out.sif").exists()


class Buggy(Stage):
    name = "test-buggy"

    def run(self, *, context):
        return {}["missing"]


def test_unexpected_stage_exception_is_one_clear_error(
    tmp_path, fake_singularity, base_image, monkeypatch
):
    path = tmp_path / "buggy.yaml"
    path.write_text(
        f"systems:\n  buggy:\n    base-image: {base_image}\n    stages: [test-buggy]\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    with pytest.raises(StageError) as info:
        build(tmp_path, "buggy")
    assert (
        info.value.stage == "test-buggy"
        and "KeyError" in str(info.value)
        and "bug" in str(info.value)
    )
    assert not (tmp_path / "out.sif").exists()


@dataclass(frozen=True)
class WritesOutputsSettings(StageSettings):
    target: str = setting("", doc="the host file to write")


class WritesOutputs(Stage):
    name = "test-outputs"
    settings_class = WritesOutputsSettings

    def run(self, *, context):
        return StageReport(
            name=self.name,
            host_files=HostFiles(
                files={Path(self.settings.target): "# generated by cotainr-lumi\nx=1\n"}
            ),
        )


def outputs_build(tmp_path, base_image, monkeypatch, target):
    path = tmp_path / "outputs.yaml"
    path.write_text(
        f"systems:\n  out:\n    base-image: {base_image}\n    stages: [test-outputs]\n    settings: {{test-outputs: {{target: {target}}}}}\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    return build(tmp_path, "out", force=True)


def test_outputs_are_written_after_the_image(
    tmp_path, fake_singularity, base_image, monkeypatch
):
    target = tmp_path / "modules" / "out.lua"
    outputs_build(tmp_path, base_image, monkeypatch, target)
    assert target.read_text().startswith("# generated by cotainr-lumi")
    target.write_text("# generated by cotainr-lumi\nold\n")
    outputs_build(tmp_path, base_image, monkeypatch, target)  # ours: replaced
    assert "x=1" in target.read_text()
    assert not [p for p in tmp_path.rglob("*") if "partial-" in p.name]


def test_foreign_output_file_is_never_overwritten_and_no_image_is_built(
    tmp_path, fake_singularity, base_image, monkeypatch
):
    target = tmp_path / "mine.lua"
    target.write_text("my own module file\n")
    with pytest.raises(StageError, match="not written by cotainr-lumi"):
        outputs_build(tmp_path, base_image, monkeypatch, target)
    assert target.read_text() == "my own module file\n"
    assert not (tmp_path / "out.sif").exists()


def test_output_directory_that_cannot_exist_stops_before_the_image(
    tmp_path, fake_singularity, base_image, monkeypatch
):
    (tmp_path / "afile").write_text("not a directory\n")
    target = tmp_path / "afile" / "sub" / "out.lua"
    with pytest.raises(StageError, match="is not a writable directory"):
        outputs_build(tmp_path, base_image, monkeypatch, target)
    assert not (tmp_path / "out.sif").exists()
    assert (tmp_path / "afile").read_text() == "not a directory\n"


def test_output_symlink_is_never_written_through(
    tmp_path, fake_singularity, base_image, monkeypatch
):
    real = tmp_path / "real.txt"
    real.write_text("target\n")
    link = tmp_path / "link.lua"
    link.symlink_to(real)
    with pytest.raises(StageError, match="not written by cotainr-lumi"):
        outputs_build(tmp_path, base_image, monkeypatch, link)
    assert link.is_symlink() and real.read_text() == "target\n"
    assert not (tmp_path / "out.sif").exists()
    assert not [p for p in tmp_path.rglob("*") if "partial-" in p.name]


@pytest.mark.parametrize("kept", [True, False])
def test_a_kept_layer_only_image_gets_the_module_files_for_its_base(tmp_path, kept):
    """The stage reports both; the whole image (the layer not kept) keeps SIF."""
    from types import SimpleNamespace

    from cotainr_lumi.pipeline.build import Build

    lua = tmp_path / "x.lua"
    report = StageReport(
        name="lumi-env",
        host_files=HostFiles(
            files={lua: "-- generated by cotainr-lumi: SIF is the image"}
        ),
        layer_host_files=HostFiles(
            files={lua: "-- generated by cotainr-lumi: SIF is the base"}
        ),
    )
    plan = SimpleNamespace(
        image_path=tmp_path / "x.sif",
        facts=SimpleNamespace(system=None),
        base_image=SimpleNamespace(given="b.sif"),
        build_settings=SimpleNamespace(compression="zstd:3"),
    )
    build = Build(plan=plan)
    build.reports = [report]
    build.view = SimpleNamespace(only=True, kept=kept)
    build.finish(error=None)
    assert lua.read_text().endswith("the base" if kept else "the image")


class FakeView:
    """A mounted base as Build.sandbox sees it."""

    def __init__(self, *, fails=None, layers=0):
        self.fails = fails
        self.layers = layers
        self.mounted = False

    def mount(self, *, at):
        if self.fails is not None:
            raise self.fails
        self.mounted = True

    def unmount(self):
        self.mounted = False

    def refused(self, problem):
        return ValueError(f"refused: {problem}")


def _build_with(view):
    from types import SimpleNamespace

    from cotainr_lumi.pipeline.build import Build

    settings = SimpleNamespace(compression="zstd:3")
    build = Build(plan=SimpleNamespace(facts=None, build_settings=settings))
    build.view = view
    return build


def test_a_mounted_base_is_the_sandbox_until_released(tmp_path):
    view = FakeView()
    release = _build_with(view).sandbox(sandbox_dir=tmp_path)
    assert view.mounted
    release()
    assert not view.mounted


@pytest.mark.parametrize("error", [OSError("no loop"), LayerError("no fuse")])
def test_a_base_that_does_not_mount_is_unpacked_unless_it_has_layers(error, caplog):
    build = _build_with(FakeView(fails=error))
    assert build.sandbox(sandbox_dir="/s") is None and build.view is None
    assert f"The base image is unpacked (not mounted): {error}" in caplog.text
    layered = _build_with(FakeView(fails=error, layers=2))
    with pytest.raises(ValueError, match=f"refused: {error}"):
        layered.sandbox(sandbox_dir="/s")


def test_only_the_mount_errors_are_caught():
    build = _build_with(FakeView(fails=KeyError("bug")))
    with pytest.raises(KeyError):  # a bug: not "unpacked (not mounted)"
        build.sandbox(sandbox_dir="/s")


def test_the_image_is_a_layer_else_squashed_once_else_cotainrs(tmp_path, mocker):
    from types import SimpleNamespace

    from cotainr_lumi.engine import sifimage
    from cotainr_lumi.pipeline.build import Build

    calls = []

    def write_sif(**where):
        calls.append(where)
        return where["architecture"] == "x86_64" or None  # None: it cannot

    mocker.patch.object(sifimage, "write_sif", write_sif)
    plan = SimpleNamespace(
        facts=None, build_settings=SimpleNamespace(compression="zstd:3")
    )
    build = Build(plan=plan)
    build.view = SimpleNamespace(write_image=lambda path: True)  # a layer
    assert build.write_image(path="x.sif", sandbox_dir="/s", architecture="x86_64")
    assert calls == []
    build.view = None
    for architecture, written in (("x86_64", True), ("vax", False)):
        where = dict(path="x.sif", sandbox_dir="/s", architecture=architecture)
        assert build.write_image(**where) is written
    assert calls[0]["compression"] == sifimage.Compression.parse("zstd:3")
    assert calls[0]["sandbox_dir"] == Path("/s")
