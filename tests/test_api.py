import pytest

import cotainr_lumi


def test_build_returns_result_with_labels_and_reports(
    tmp_path, fake_singularity, test_profile
):
    result = cotainr_lumi.build(image_path=tmp_path / "a.sif", system="lumi-test")
    assert result.image_path == tmp_path / "a.sif" and result.image_path.exists()
    assert result.labels["cotainr-lumi.system"] == "lumi-test"
    # The stages' labels, and the engine's check of the ROCm versions.
    rocm = {
        k: v for k, v in result.labels.items() if k.startswith("cotainr-lumi.rocm.")
    }
    assert rocm == {"cotainr-lumi.rocm.supported": "6.1-7.0"}
    compression = {"cotainr-lumi.compression": "zstd:3"}  # build.compression's
    assert {
        **result.report("provenance").labels,
        **rocm,
        **compression,
    } == result.labels
    with pytest.raises(KeyError):
        result.report("pip")


def test_dry_run_and_plan(tmp_path, fake_singularity, test_profile):
    result = cotainr_lumi.build(
        image_path=tmp_path / "a.sif", system="lumi-test", dry_run=True
    )
    assert (
        result.dry_run
        and not (tmp_path / "a.sif").exists()
        and "provenance" in result.plan_text
    )
    plan = cotainr_lumi.plan(image_path=tmp_path / "a.sif", system="lumi-test")
    assert plan.stage_names == ["provenance"] and plan.extended


def test_typed_exceptions(tmp_path, fake_singularity, test_profile):
    with pytest.raises(cotainr_lumi.UnknownSystemError):
        cotainr_lumi.build(image_path=tmp_path / "a.sif", system="nope")
    with pytest.raises(cotainr_lumi.InputError):
        cotainr_lumi.build(
            image_path=tmp_path / "missing-dir" / "a.sif", system="lumi-test"
        )
    with pytest.raises(cotainr_lumi.InputError):
        cotainr_lumi.build(
            image_path=tmp_path / "a.sif", system="lumi-test", base_image="x.sif"
        )
    with pytest.raises(cotainr_lumi.InputError, match="pip"):
        cotainr_lumi.build(
            image_path=tmp_path / "a.sif", system="lumi-test", settings={"pip": {}}
        )
    (tmp_path / "a.sif").write_text("x")
    with pytest.raises(cotainr_lumi.ImageExistsError):
        cotainr_lumi.build(image_path=tmp_path / "a.sif", system="lumi-test")
    assert isinstance(cotainr_lumi.ImageExistsError("x"), cotainr_lumi.CotainrLumiError)


def test_base_image_build_with_settings_is_extended(
    tmp_path, fake_singularity, base_image
):
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "a.sif",
        base_image=str(base_image),
        settings={"provenance": {"hash-base-image": False}},
    )
    assert plan.extended and plan.stage_names == ["provenance"]
    stock = cotainr_lumi.plan(image_path=tmp_path / "a.sif", base_image=str(base_image))
    assert not stock.extended and stock.stage_names == []


def test_several_conda_env_files_where_cotainr_takes_several(
    tmp_path, fake_singularity, test_profile, monkeypatch
):
    from cotainr_lumi import _cotainr

    files = []
    for name in ("base.yml", "apex.yml"):
        files.append(tmp_path / name)
        files[-1].write_text("name: x\ndependencies: [python]\n")
    monkeypatch.setattr(_cotainr, "takes_several_conda_envs", lambda: False)
    with pytest.raises(cotainr_lumi.InputError, match="takes one conda environment"):
        cotainr_lumi.plan(
            image_path=tmp_path / "a.sif", system="lumi-test", conda_env=files
        )
    # The cotainr in use takes several (its multi-file branch): each file is
    # checked, and the plan says they are applied in order.
    monkeypatch.setattr(_cotainr, "takes_several_conda_envs", lambda: True)
    result = cotainr_lumi.build(
        image_path=tmp_path / "a.sif",
        system="lumi-test",
        conda_env=files,
        dry_run=True,
    )
    text = result.plan_text
    assert f"conda env:  {files[0]}, {files[1]}" in text
    assert "install the conda env base.yml" in text
    assert "then update it with apex.yml" in text
    files[1].write_text("- not a mapping\n")
    with pytest.raises(cotainr_lumi.InputError, match="apex.yml must be a YAML"):
        cotainr_lumi.plan(
            image_path=tmp_path / "a.sif", system="lumi-test", conda_env=files
        )


def test_the_build_runs_the_plan_the_api_made(
    tmp_path, fake_singularity, test_profile, mocker
):
    from cotainr_lumi import api, plugin
    from cotainr_lumi.pipeline.plan import make_plan

    made = []
    counted = mocker.Mock(
        side_effect=lambda **kw: made.append(make_plan(**kw)) or made[-1]
    )
    mocker.patch.object(api, "make_plan", counted)
    mocker.patch("cotainr_lumi.pipeline.plan.make_plan", counted)
    result = cotainr_lumi.build(
        image_path=tmp_path / "a.sif",
        system="lumi-test",
        settings={"provenance": {"hash-base-image": False}},
    )
    assert len(made) == 1  # planned once: cotainr's build hook takes that plan
    assert plugin.HOOK.build.plan is made[0]
    assert result.labels["cotainr-lumi.system"] == "lumi-test"
    assert plugin.HOOK._handed is None  # handed back after the build
