"""The build plan (cotainr_lumi/pipeline/plan.py)."""

import re

from planfakes import plan_text
import pytest
import yaml

import cotainr_lumi
from cotainr_lumi.errors import InputError
from cotainr_lumi.pipeline import checks


@pytest.fixture
def env(tmp_path):
    """A conda environment file."""
    path = tmp_path / "env.yml"
    path.write_text("name: x\ndependencies: [python]\n")
    return path


@pytest.mark.parametrize("conda", [False, True])
def test_a_local_base_whose_metadata_links_out_is_refused(
    tmp_path, test_profile, conda, env
):
    base = tmp_path / "base"  # a sandbox directory as the base image
    (base / ".singularity.d/env").mkdir(parents=True)
    (base / ".singularity.d/labels.json").write_text("{}")
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "x.sif",
        system="lumi-test",
        base_image_override=str(base),
        conda_env=env if conda else None,
        accept_licenses=True,
    )
    checks.refuse_base_links(plan)  # no links
    host = tmp_path / "host"
    host.mkdir()
    (base / ".singularity.d/env").rmdir()
    (base / ".singularity.d/env").symlink_to(host)
    if conda:  # cotainr's conda step would append to the host's directory
        with pytest.raises(InputError, match=r"/\.singularity\.d/env is a symbolic"):
            checks.refuse_base_links(plan)
    else:  # the stages replace the link inside the sandbox (claim_build_dirs)
        checks.refuse_base_links(plan)
    (base / ".singularity.d/labels.json").unlink()
    (base / ".singularity.d/labels.json").symlink_to(host / "labels.json")
    with pytest.raises(InputError, match=f"labels.json is a symbolic link .to {host}"):
        checks.refuse_base_links(plan)
    assert list(host.iterdir()) == []


def release(root, tag, variants=("torch", "full")):
    """A LAIF release dir: lumi-multitorch-<variant>-<digest>-<tag>.sif files."""
    directory = root / f"lumi-multitorch-u24r70f21m50t210-{tag}"
    directory.mkdir(parents=True)
    for variant in variants:
        sif = directory / f"lumi-multitorch-{variant}-u24r70f21m50t210-{tag}.sif"
        sif.write_bytes(f"{variant} {tag}\n".encode())
    return directory


@pytest.fixture
def laif(tmp_path, monkeypatch):
    """The `lumi-multitorch` latest link to the newer of two releases."""
    containers = tmp_path / "laifs/containers"
    release(containers, "20260415_130625")  # the decoy: an older release
    new = release(containers, "20260807_115122")
    (containers / "lumi-multitorch").symlink_to(new.name)
    profile = tmp_path / "laif.yaml"
    profile.write_text(
        "systems:\n"
        "  laif-torch:\n"
        "    extends: lumi-aif-torch\n"
        f"    base-image: {containers}/lumi-multitorch/lumi-multitorch-torch-*.sif\n"
        "  laif-any:\n"
        "    extends: lumi-aif-torch\n"
        f"    base-image: {containers}/lumi-multitorch/lumi-multitorch-*.sif\n"
        "  laif-none:\n"
        "    extends: lumi-aif-torch\n"
        f"    base-image: {containers}/lumi-multitorch/lumi-multitorch-plus-*.sif\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(profile))
    return containers, new


def test_a_glob_base_image_resolves_to_its_one_file_in_the_latest_release(
    tmp_path, laif
):
    containers, new = laif
    plan = cotainr_lumi.plan(image_path=tmp_path / "x.sif", system="laif-torch")
    matched = f"{containers}/lumi-multitorch/lumi-multitorch-torch-u24r70f21m50t210-20260807_115122.sif"
    assert plan.base_image.given == matched
    assert plan.base_image.resolved == str(
        new / "lumi-multitorch-torch-u24r70f21m50t210-20260807_115122.sif"
    )
    assert plan.base_image.pattern.endswith("lumi-multitorch-torch-*.sif")
    text = plan_text(plan)
    assert f"base image: {matched}" in text and "matched by: " in text


LATEST = "/appl/local/laifs/containers/lumi-multitorch-latest.sif"


def test_lumi_multitorch_latest_is_accepted_resolved_and_recorded(
    tmp_path, laif, monkeypatch
):
    # LUMI's docs give users the link lumi-multitorch-latest.sif to the newest
    # release's full image (lumi-userguide PR #315; DeiC-HPC/cotainr#171).
    containers, new = laif
    packaged = cotainr_lumi.plan(
        image_path=tmp_path / "x.sif", system="lumi-aif-latest"
    )
    assert packaged.system.base_image == LATEST
    latest = containers / "lumi-multitorch-latest.sif"
    full = "lumi-multitorch-full-u24r70f21m50t210-20260807_115122.sif"
    latest.symlink_to(f"{new.name}/{full}")
    for request in (
        dict(system="lumi-aif-latest", base_image_override=str(latest)),
        dict(base_image=str(latest)),  # as #171 gave it
    ):
        plan = cotainr_lumi.plan(image_path=tmp_path / "x.sif", **request)
        assert plan.base_image.given == str(latest)
        assert plan.base_image.link == str(new / full)  # where it pointed
        assert plan.base_image.resolved == str(new / full)
    assert f"a link to: {new / full}" in plan_text(plan)


@pytest.mark.parametrize(
    ("system", "found"), [("laif-any", "matches 2 files: "), ("laif-none", "no file")]
)
def test_a_glob_matching_no_or_several_files_is_one_error(
    tmp_path, laif, system, found
):
    with pytest.raises(InputError) as info:
        cotainr_lumi.plan(image_path=tmp_path / "x.sif", system=system)
    text = str(info.value)
    assert found in text and f"--lumi-system {system} --base-image FILE" in text
    if system == "laif-any":
        assert "lumi-multitorch-full-" in text and "lumi-multitorch-torch-" in text
    # --base-image pins one file instead.
    pinned = laif[1] / "lumi-multitorch-full-u24r70f21m50t210-20260807_115122.sif"
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "x.sif", system=system, base_image_override=str(pinned)
    )
    assert plan.base_image.resolved == str(pinned) and plan.base_image.pattern is None


def test_cotainr_builds_from_the_matched_file_and_records_it(
    tmp_path, laif, fake_singularity
):
    _, new = laif
    result = cotainr_lumi.build(
        image_path=tmp_path / "out.sif",
        system="laif-torch",
        skip_stages=("pip", "prune", "lumi-env"),
    )
    real = str(new / "lumi-multitorch-torch-u24r70f21m50t210-20260807_115122.sif")
    assert fake_singularity.commands[0][-1].endswith(
        "lumi-multitorch/lumi-multitorch-torch-u24r70f21m50t210-20260807_115122.sif"
    )
    assert result.labels["cotainr-lumi.base-image.resolved"] == real


def test_off_lumi_a_glob_is_planned_as_a_file_that_is_not_here(tmp_path):
    plan = cotainr_lumi.plan(image_path=tmp_path / "x.sif", system="lumi-aif-torch")
    assert plan.base_image.given.endswith(
        "/lumi-multitorch/lumi-multitorch-torch-*.sif"
    )
    assert not plan.base_image.is_local_file
    assert "(not a file on this machine: the build will fail here)" in plan_text(plan)


def test_a_glob_is_in_the_file_name_only_and_a_literal_name_is_itself(
    tmp_path, monkeypatch
):
    # Directories with ':' and '[x]' in their names; a file named with '[1]'.
    odd = tmp_path / "a:b [x]"
    odd.mkdir()
    (odd / "one-[1].sif").write_bytes(b"sif\n")
    (odd / "one-1.sif").write_bytes(b"decoy\n")
    systems = {"odd-glob": f"{odd}/*].sif", "odd-literal": f"{odd}/one-[1].sif"}
    profile = tmp_path / "odd.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "systems": {
                    name: {"extends": "lumi-g-ext", "base-image": base}
                    for name, base in systems.items()
                }
            }
        )
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(profile))
    for system in systems:
        plan = cotainr_lumi.plan(image_path=tmp_path / "x.sif", system=system)
        assert plan.base_image.given == f"{odd}/one-[1].sif", system


def test_the_plan_says_whether_the_build_adds_a_layer_and_why_not(
    tmp_path, test_profile, monkeypatch, env
):
    from siffile import PARTITION, SQUASHFS, SYSTEM, write_sif

    base = tmp_path / "base.sif"
    write_sif(base, [(PARTITION, b"system", SQUASHFS, SYSTEM, "")])
    monkeypatch.setattr("os.geteuid", lambda: 0)  # kernel mounts

    def layered(**request):
        plan = cotainr_lumi.plan(
            image_path=tmp_path / "x.sif", system="lumi-test", **request
        )
        return [ln for ln in plan_text(plan).splitlines() if "layered:" in ln][0]

    assert layered(base_image_override=str(base)).endswith("layered:    yes")
    assert "squashfs:   zstd:3 (gzip where the runtime cannot run it)" in (
        plan_text(cotainr_lumi.plan(
            image_path=tmp_path / "x.sif", system="lumi-test",
            settings={"build": {"compression": "zstd:3"}},
        ))
    )  # fmt: skip
    only = {"build": {"layer-only": True}}
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "x.sqfs", system="lumi-test",
        base_image_override=str(base), settings=only,
    )  # fmt: skip
    text = plan_text(plan)
    assert f"layered:    yes, only the layer (on {base}, no copy)" in text
    assert "write only the change, a squashfs layer for the base SIF" in text
    assert "copy of the base" not in text
    flatten = {"build": {"layered": False}}
    assert layered(base_image_override=str(base), settings=flatten).endswith(
        "no, the whole image is squashed: --flatten (build.layered=false)"
    )
    both = {"build": {"layered": False, "layer-only": True}}  # --flatten wins
    assert layered(base_image_override=str(base), settings=both).endswith(
        "no, the whole image is squashed: --flatten (build.layered=false)"
    )
    assert layered(base_image_override=str(base), conda_env=env).endswith(
        ": a conda env is installed"
    )
    assert layered(base_image_override=str(tmp_path)).endswith(
        ": the base image is not a local SIF file"
    )


def test_a_layered_base_that_would_be_unpacked_is_refused(tmp_path, test_profile, env):
    from siffile import OVERLAY, PARTITION, SQUASHFS, SYSTEM, write_sif

    base = tmp_path / "layered.sif"
    parts = [(SYSTEM, b"system"), (OVERLAY, b"layer")]
    write_sif(base, [(PARTITION, data, SQUASHFS, kind, "") for kind, data in parts])
    with pytest.raises(InputError, match=r"has layers .* not mounted here \(a conda"):
        cotainr_lumi.plan(
            image_path=tmp_path / "x.sif",
            system="lumi-test",
            base_image_override=str(base),
            conda_env=env,
        )
    # Stock cotainr (no cotainr-lumi system or settings) would unpack it too.
    with pytest.raises(InputError, match=r"stock cotainr unpacks it: .*--lumi-system"):
        cotainr_lumi.plan(image_path=tmp_path / "x.sif", base_image=str(base))


def test_the_space_estimate_counts_what_each_kind_of_build_writes(
    tmp_path, test_profile, monkeypatch
):
    from siffile import PARTITION, SQUASHFS, SYSTEM, write_sif

    from cotainr_lumi.engine.workdir import HEADROOM_BYTES

    base = tmp_path / "base.sif"
    write_sif(base, [(PARTITION, b"s" * 4096, SQUASHFS, SYSTEM, "")])
    size = base.stat().st_size
    monkeypatch.setattr("os.geteuid", lambda: 0)  # kernel mounts
    monkeypatch.setattr("cotainr_lumi.apptainer.unpacked_bytes", lambda image: 7000)

    def needed(**build):
        plan = cotainr_lumi.plan(
            image_path=tmp_path / "x.sif",
            system="lumi-test",
            base_image_override=str(base),
            settings={"build": build},
        )
        return checks.space_needed(plan)[0] - HEADROOM_BYTES

    # unpacked once (the sandbox, no copy: issue 40) and the SIF twice
    assert needed(layered=False) == 7000 + 2 * size
    assert needed() == size  # a copy of the base, the layer (in the headroom)
    assert needed(**{"layer-only": True}) == 0


def test_the_dry_run_shows_the_system_packages_and_the_uv_command(
    tmp_path, test_profile
):
    text = test_profile.read_text()
    test_profile.write_text(text.replace("[provenance]", "[system-packages, pip]"))
    proot = tmp_path / "bin" / "proot"
    proot.parent.mkdir()
    proot.write_text("#!/bin/sh\nexit 1\n")
    proot.chmod(0o755)
    settings = {
        "system-packages": {"packages": ["jq", "libaio-dev"], "proot": str(proot)},
        "pip": {"installer": "uv", "steps": [{"packages": ["six==1.17.0"]}]},
    }
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "x.sif", system="lumi-test", settings=settings
    )
    lines = plan_text(plan).splitlines()
    text = "\n".join(lines)
    # The packages, and how they are installed: proot's fake root, no host root.
    assert "packages: jq, libaio-dev (and what they need" in text
    assert f"({proot} -0 -r SANDBOX)" in text
    # The step's command is uv's, for the target env, with its cache.
    (command,) = [ln.strip() for ln in lines if " pip install " in ln]
    assert command.split()[:2] == ["/opt/cotainr-lumi/.pip-work/uv", "--color"]
    assert "--compile-bytecode" in command
    assert command.endswith("-r /opt/cotainr-lumi/pip/step1/packages.txt")
    assert "package: six==1.17.0" in text
    assert "never kept in the image" in text
    # The numbered steps: system-packages before the pip steps, as they run.
    steps = [ln.split(". ", 1)[1] for ln in lines if re.match(r"  \d+\. ", ln)]
    assert steps[1:3] == ["system-packages", "pip"], steps
