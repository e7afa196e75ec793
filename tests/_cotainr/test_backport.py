"""The backport of the build stage seam on a stock cotainr (docs/upstream/seam-api.md)."""

import importlib.util

import pytest

from cotainr_lumi import _cotainr
from cotainr_lumi._cotainr import backport

SEEN = []


class RecordingStage(backport.BuildStage):
    """A stage that records what it sees."""

    name = "recording"

    @classmethod
    def add_arguments(cls, *, parser):
        parser.add_argument("--recording-label", default="on")

    @classmethod
    def from_context(cls, *, context):
        SEEN.append(("from_context", dict(context.options), context.dry_run))
        if context.options["recording_label"] == "skip":
            return None
        context.base_image = f"{context.base_image}"
        return cls()

    def describe(self):
        return ["recording: would record"]

    def run(self, *, context):
        SEEN.append(("run", context.sandbox is not None, context.conda_env_name))
        if context.options["recording_label"] == "fail":
            raise backport.StageError("deliberate", exit_code=3)
        context.add_output(path=context.image_path.with_suffix(".txt"), content="out\n")
        context.add_message(text="see recording.txt")
        if context.options["recording_label"] == "reserved":
            return {"cotainr.version": "mine"}
        return {"recording.label": context.options["recording_label"]}

    def on_failure(self, *, context, error):
        SEEN.append(("on_failure", type(error).__name__))


class Plugin:
    build_stages = (RecordingStage,)

    @staticmethod
    def systems():
        return {"plugged": {"base-image": "docker://plugged"}}


@pytest.fixture
def plugged(mocker):
    SEEN.clear()
    mocker.patch.object(backport, "load_plugins", return_value=[Plugin])
    if importlib.util.find_spec("cotainr.plugins") is not None:
        # A cotainr with plugin discovery (series 0005) adds the plugins'
        # systems itself.
        mocker.patch(
            "cotainr.plugins.get_plugin_systems",
            side_effect=lambda *, defined_systems: Plugin.systems(),
        )
    return SEEN


def make(tmp_path, base_image, **options):
    return backport.Build(
        image_path=tmp_path / "x.sif", base_image=str(base_image), **options
    )


def test_stage_options_and_context_reach_the_stage(tmp_path, base_image, plugged):
    build = make(tmp_path, base_image, recording_label="yes")
    assert plugged == [("from_context", {"recording_label": "yes"}, False)]
    assert [s.name for s in build.stages] == ["recording"]
    assert build.context.image_path == tmp_path / "x.sif"
    assert build.context.conda_env_files == [] and build.context.conda_prefix is None


def test_stages_run_before_the_metadata_and_label_the_image(
    tmp_path, base_image, plugged, fake_singularity, labels_of, caplog
):
    caplog.set_level("INFO", logger="cotainr")
    make(tmp_path, base_image, recording_label="yes").execute()
    assert ("run", True, None) in plugged
    labels = labels_of(tmp_path / "x.sif")
    assert labels["recording.label"] == "yes" and "cotainr.version" in labels
    assert (tmp_path / "x.txt").read_text() == "out\n"
    assert "see recording.txt" in caplog.text
    assert not list(tmp_path.glob(".x.sif.partial-*"))


def test_failure_calls_on_failure_and_keeps_the_old_image(
    tmp_path, base_image, plugged, fake_singularity
):
    (tmp_path / "x.sif").write_bytes(b"precious")
    build = make(tmp_path, base_image, recording_label="fail", force=True)
    with pytest.raises(backport.StageError) as info:
        build.execute()
    assert info.value.exit_code == 3
    assert ("on_failure", "StageError") in plugged
    assert (tmp_path / "x.sif").read_bytes() == b"precious"
    assert not list(tmp_path.glob(".x.sif.partial-*"))


def test_cotainr_labels_are_cotainrs(tmp_path, base_image, plugged, fake_singularity):
    with pytest.raises(backport.StageError, match="cotainr.version"):
        make(tmp_path, base_image, recording_label="reserved").execute()
    assert not (tmp_path / "x.sif").exists()


def test_a_stage_may_stay_out(tmp_path, base_image, plugged, fake_singularity):
    build = make(tmp_path, base_image, recording_label="skip")
    assert build.stages == []
    build.execute()  # cotainr's own build, untouched
    assert (tmp_path / "x.sif").exists() and not (tmp_path / "x.txt").exists()


def test_dry_run_describes_and_builds_nothing(
    tmp_path, base_image, plugged, fake_singularity, capsys
):
    make(tmp_path, base_image, dry_run=True).execute()
    assert capsys.readouterr().out == "recording: would record\n"
    assert fake_singularity.commands == []


def test_an_output_cannot_be_the_image(tmp_path):
    context = backport.BuildContext(
        image_path=tmp_path / "x.sif",
        base_image="b",
        system=None,
        conda_env_files=[],
        conda_prefix=None,
        conda_env_name=None,
        dry_run=False,
        log_settings=None,
    )
    with pytest.raises(ValueError, match="is the image"):
        context.add_output(path=tmp_path / "x.sif", content="lua")
    context.add_output(path=tmp_path / "x.lua", content="lua")
    with pytest.raises(ValueError, match="twice"):
        context.for_stage(options={}).add_output(path=tmp_path / "x.lua", content="")


def test_plugin_systems_and_unknown_system(tmp_path, plugged):
    build = backport.Build(image_path=tmp_path / "x.sif", system="plugged")
    assert build.base_image == "docker://plugged"
    with pytest.raises(backport.StageError, match="unknown system 'nope'") as info:
        backport.Build(image_path=tmp_path / "x.sif", system="nope")
    assert "plugged" in str(info.value) and info.value.exit_code == 2


def test_conda_env_name_and_prefix_come_from_cotainrs_behaviour(
    tmp_path, base_image, plugged
):
    env = tmp_path / "env.yml"
    env.write_text("name: x\n")
    build = make(tmp_path, base_image, conda_env=env)
    assert build.context.conda_env_name == "conda_container_env"
    assert build.context.conda_prefix == _cotainr.CONDA_PREFIX
    with pytest.raises(backport.StageError, match="does not exist"):
        make(tmp_path, base_image, conda_env=tmp_path / "missing.yml")


def test_several_conda_env_files_are_held_as_cotainr_holds_them(
    tmp_path, base_image, plugged, monkeypatch
):
    files = []
    for name in ("base.yml", "extension.yml"):
        files.append(tmp_path / name)
        files[-1].write_text("name: x\n")
    monkeypatch.setattr(_cotainr, "takes_several_conda_envs", lambda: True)
    build = make(tmp_path, base_image, conda_env=files)
    assert build.conda_env == files and build.context.conda_env_files == files
    # A cotainr that takes one file: one of them is its Path, several are
    # one clear error.
    monkeypatch.setattr(_cotainr, "takes_several_conda_envs", lambda: False)
    assert make(tmp_path, base_image, conda_env=files[:1]).conda_env == files[0]
    with pytest.raises(backport.StageError, match="takes one --conda-env file"):
        make(tmp_path, base_image, conda_env=files)


def test_stock_options_are_not_added_twice():
    assert backport.stock_build_options() <= {"--force", "--dry-run"}
