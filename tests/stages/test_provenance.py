import hashlib
import json
import os
from types import SimpleNamespace

from cotainr.container import SingularitySandbox
from planfakes import stage_context

from cotainr_lumi import _cotainr, _version, build
from cotainr_lumi.pipeline.plan import BuildRequest, make_plan


def test_labels_record_given_and_resolved_base_image(
    tmp_path, fake_singularity, test_profile, base_image, mocker
):
    captured = {}

    real_build_image = SingularitySandbox.build_image

    def capture(self, *, path):
        captured["record"] = json.loads(
            (self.sandbox_dir / "opt/cotainr-lumi/provenance.json").read_text()
        )
        return real_build_image(self, path=path)

    mocker.patch.object(SingularitySandbox, "build_image", capture)
    result = build(image_path=tmp_path / "p.sif", system="lumi-test")
    labels = result.labels
    real = os.path.realpath(base_image)
    assert labels["cotainr-lumi.base-image"] == str(base_image)
    assert labels["cotainr-lumi.base-image.resolved"] == real and real != str(
        base_image
    )
    assert (
        labels["cotainr-lumi.base-image.sha256"]
        == hashlib.sha256(open(real, "rb").read()).hexdigest()
    )
    assert labels["cotainr-lumi.version"] == _version.__version__
    assert labels["cotainr-lumi.cotainr-version"] == _cotainr.COTAINR_VERSION
    assert labels["cotainr-lumi.provenance"] == "/opt/cotainr-lumi/provenance.json"
    record = captured["record"]
    assert record["base-image"]["sha256"] == labels["cotainr-lumi.base-image.sha256"]
    # A link (as LUMI's lumi-multitorch-latest.sif): where it pointed, one step.
    assert record["base-image"]["link"] == str(
        base_image.parent / "lumi-rocm-6.1.3.sif"
    )
    assert (
        record["system"] == "lumi-test" and record["stages"][0]["name"] == "provenance"
    )


def test_remote_base_image_is_not_resolved_or_hashed(tmp_path, fake_singularity):
    result = build(
        image_path=tmp_path / "r.sif",
        base_image="docker://ubuntu:24.04",
        settings={"provenance": {}},
    )
    assert result.labels["cotainr-lumi.base-image.resolved"] == "docker://ubuntu:24.04"
    assert "cotainr-lumi.base-image.sha256" not in result.labels
    assert fake_singularity.commands[0][-1] == "docker://ubuntu:24.04"


def test_record_and_labels_hold_no_credentials_or_step_secrets(tmp_path):
    (tmp_path / "r.txt").write_text("x\n")
    plan = make_plan(
        request=BuildRequest(
            image_path=tmp_path / "x.sif",
            base_image="docker://debian",
            settings={
                "pip": {
                    "steps": [
                        {
                            "requirements": str(tmp_path / "r.txt"),
                            "index-url": "https://user:s3cret@idx.example.org/simple",
                            "extra-index-urls": ["https://tok3n@x.example.org/s"],
                            "packages": ["pkg @ https://a:pw-pkg@f.example.org/p.whl"],
                            "env": {"HF_TOKEN": "hf_abc123", "CXX": "g++"},
                        }
                    ]
                },
                "provenance": {},
            },
        )
    )
    stage = plan.stages[-1]
    sandbox = SimpleNamespace(root=tmp_path)
    report = stage.run(context=stage_context(sandbox, probe=False, build=plan.facts))
    record = (tmp_path / "opt/cotainr-lumi/provenance.json").read_text()
    for text in (record, json.dumps(report.labels)):
        assert [
            s for s in ("s3cret", "tok3n", "pw-pkg", "hf_abc123") if s in text
        ] == []
    step = json.loads(record)["stages"][0]["settings"]["steps"][0]
    assert step["index-url"] == "https://user:***@idx.example.org/simple"
    assert step["extra-index-urls"] == ["https://***@x.example.org/s"]
    assert step["env"] == {"HF_TOKEN": "***", "CXX": "g++"}
