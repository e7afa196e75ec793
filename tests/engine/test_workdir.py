"""The work directory of a build and the space it needs."""

import os
import subprocess
import tempfile

from planfakes import plan_text
import pytest

from cotainr_lumi.engine import workdir
from cotainr_lumi.errors import InputError
from tests.hookcontext import hook_context


def test_estimate_grows_with_the_base_and_the_conda_env(tmp_path):
    base = tmp_path / "base.sif"
    base.write_bytes(b"x" * 1000)
    plain = workdir.estimate_bytes(base_image=str(base), conda_env=None)
    conda = workdir.estimate_bytes(base_image=str(base), conda_env="env.yml")
    assert plain == 1000 * (workdir.EXPANSION + 2) + workdir.HEADROOM_BYTES
    assert conda - plain == workdir.CONDA_BYTES
    # Listed files: the sandbox and Apptainer's copy of it, twice the SIF.
    listed = workdir.estimate_bytes(base_image=str(base), conda_env=None, unpacked=5)
    assert listed == 5 + 2 * 1000 + workdir.HEADROOM_BYTES
    assert workdir.estimate_bytes(base_image="docker://x", conda_env=None) is None


def test_too_little_space_is_one_clear_error(tmp_path, mocker):
    base = tmp_path / "base.sif"
    base.write_bytes(b"x" * 1000)
    needed = workdir.estimate_bytes(base_image=str(base), conda_env=None)
    with pytest.raises(InputError) as info:
        workdir.check_space(work_dir=tmp_path, needed=needed, free=1024**3)
    message = str(info.value)
    assert "--work-dir" in message and "/flash" in message and "1.0 GiB" in message
    workdir.check_space(work_dir=tmp_path, needed=needed, free=1024**3, refuse=False)


@pytest.mark.parametrize("value", ["/no/such/dir", "~nosuchuser-xyz/work"])
def test_a_work_dir_that_cannot_be_used_is_one_clear_error(value):
    with pytest.raises(InputError, match="--work-dir"):
        workdir.resolve_work_dir(value)


def test_environment_points_temporary_files_there_and_is_restored(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", "/before")
    monkeypatch.delenv("APPTAINER_TMPDIR", raising=False)
    before = tempfile.tempdir
    (tmp_path / "users-file").write_text("kept")
    with workdir.work_dir_environment(tmp_path) as build_dir:
        assert build_dir.parent == tmp_path
        assert os.environ["APPTAINER_TMPDIR"] == str(build_dir)
        assert os.environ["SINGULARITY_TMPDIR"] == str(build_dir)
        assert tempfile.gettempdir() == str(build_dir)
        (build_dir / "sandbox").mkdir()
    assert [p.name for p in tmp_path.iterdir()] == ["users-file"]
    assert os.environ["TMPDIR"] == "/before"
    assert "APPTAINER_TMPDIR" not in os.environ
    assert tempfile.tempdir == before


def test_work_dir_option_reaches_the_plan(tmp_path, test_profile):
    from cotainr_lumi import buildoptions
    from cotainr_lumi.pipeline.plan import make_plan

    request = buildoptions.request_from_options(
        context=hook_context(
            image_path=tmp_path / "x.sif",
            system="lumi-test",
            options={"work_dir": str(tmp_path)},
        ),
        conda_env=None,
    )
    plan = make_plan(request=request)
    assert plan.work_dir == tmp_path
    assert f"work dir:   {tmp_path} (needs about" in plan_text(plan)


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_leftovers_of_a_killed_build_are_removed_and_named(tmp_path, caplog):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    dead, alive = _dead_pid(), os.getpid()
    (work / f"cotainr-lumi-build-{dead}-abc" / "sandbox").mkdir(parents=True)
    (work / f"cotainr-lumi-build-{alive}-def").mkdir()  # a running build's
    (out / f".x.sif.partial-{dead}").write_text("half an image")
    (out / f"x.sif.cotainr-partial-{dead}").write_text("cotainr's own name")
    (out / f".x.sif.partial-{alive}").write_text("a running build's")
    (out / f".y.sif.partial-{dead}").write_text("another image's")
    (work / "cotainr-lumi-build-junk").mkdir()  # no process id: not ours
    with caplog.at_level("WARNING"):
        workdir.remove_leftovers(work_dir=work, image_path=out / "x.sif")
    assert sorted(p.name for p in work.iterdir()) == [
        f"cotainr-lumi-build-{alive}-def",
        "cotainr-lumi-build-junk",
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        f".x.sif.partial-{alive}",
        f".y.sif.partial-{dead}",
    ]
    assert caplog.text.count("left behind by an earlier build that was killed") == 3


def test_the_build_directory_carries_the_process_id(tmp_path):
    with workdir.work_dir_environment(tmp_path) as build_dir:
        assert build_dir.name.startswith(f"cotainr-lumi-build-{os.getpid()}-")
