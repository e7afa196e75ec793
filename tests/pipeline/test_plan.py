"""The build plan (cotainr_lumi/pipeline/plan.py)."""

import pytest

import cotainr_lumi
from cotainr_lumi.errors import InputError


@pytest.mark.parametrize("conda", [False, True])
def test_a_local_base_whose_metadata_links_out_is_refused(
    tmp_path, test_profile, conda
):
    base = tmp_path / "base"  # a sandbox directory as the base image
    (base / ".singularity.d/env").mkdir(parents=True)
    (base / ".singularity.d/labels.json").write_text("{}")
    env = tmp_path / "env.yml"
    env.write_text("name: x\ndependencies: [python]\n")
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "x.sif",
        system="lumi-test",
        base_image_override=str(base),
        conda_env=env if conda else None,
        accept_licenses=True,
    )
    plan.check_base_links()  # no links
    host = tmp_path / "host"
    host.mkdir()
    (base / ".singularity.d/env").rmdir()
    (base / ".singularity.d/env").symlink_to(host)
    if conda:  # cotainr's conda step would append to the host's directory
        with pytest.raises(InputError, match=r"/\.singularity\.d/env is a symbolic"):
            plan.check_base_links()
    else:  # the stages replace the link inside the sandbox (claim_build_dirs)
        plan.check_base_links()
    (base / ".singularity.d/labels.json").unlink()
    (base / ".singularity.d/labels.json").symlink_to(host / "labels.json")
    with pytest.raises(InputError, match=f"labels.json is a symbolic link .to {host}"):
        plan.check_base_links()
    assert list(host.iterdir()) == []
