"""The image's SBOMs (stages/pip/sbom.py): CycloneDX, and the AI Factory format."""

import json

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from cotainr_lumi.imagelayout import AIF_SBOM_FILE, CYCLONEDX_SBOM_FILE
from cotainr_lumi.stages.pip.sbom import cyclonedx_json, update_aif_sbom, write_sboms

BASE = [
    {"name": "torch", "version": "2.10.0+rocm7.0"},
    {"name": "numpy", "version": "2.3.1"},
    {"name": "Jinja2", "version": "3.1.6"},
]
AFTER = [
    *BASE[:2],
    {"name": "jinja2", "version": "3.1.6"},
    {"name": "peft", "version": "0.17.0"},
]


def test_cyclonedx_document_is_valid_and_says_what_the_build_added():
    text = cyclonedx_json(
        image_name="my.sif",
        packages=AFTER,
        base_packages=BASE,
        target_prefix="/opt/venv",
        base_image="/appl/x.sif",
    )
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    image = doc["metadata"]["component"]
    assert (image["name"], image["type"]) == ("my.sif", "container")
    assert {"name": "cotainr-lumi:target-env", "value": "/opt/venv"} in image[
        "properties"
    ]
    origins = {c["name"]: c["properties"][0]["value"] for c in doc["components"]}
    # Jinja2/jinja2: the same distribution (canonical names).
    assert origins == {
        "jinja2": "base",
        "numpy": "base",
        "peft": "build",
        "torch": "base",
    }
    torch = next(c for c in doc["components"] if c["name"] == "torch")
    assert torch["purl"] == "pkg:pypi/torch@2.10.0%2Brocm7.0"
    [deps] = [d for d in doc["dependencies"] if d["ref"] == image["bom-ref"]]
    assert len(deps["dependsOn"]) == 4
    tools = doc["metadata"]["tools"]["components"]
    assert tools[0]["name"] == "cotainr-lumi"


def test_without_steps_everything_is_the_bases():
    doc = json.loads(
        cyclonedx_json(
            image_name="x.sif", packages=BASE, base_packages=None, target_prefix="/e"
        )
    )
    assert {c["properties"][0]["value"] for c in doc["components"]} == {"base"}


def test_the_ai_factory_sbom_keeps_its_format_with_the_new_pip_list(tmp_path):
    apt = [{"name": "libfabric", "version": "2.1.git-e9cf535a"}]
    (tmp_path / AIF_SBOM_FILE.lstrip("/")).write_text(
        json.dumps({"apt": apt, "pip": BASE})
    )
    written = write_sboms(
        root=tmp_path,
        image_name="x.sif",
        packages=AFTER,
        base_packages=BASE,
        target_prefix="/opt/venv",
    )
    assert written == {
        "cyclonedx": CYCLONEDX_SBOM_FILE,
        "aif": AIF_SBOM_FILE,
        "added": ["peft"],
    }
    sbom = json.loads((tmp_path / AIF_SBOM_FILE.lstrip("/")).read_text())
    assert sbom == {"apt": apt, "pip": AFTER}
    assert (tmp_path / CYCLONEDX_SBOM_FILE.lstrip("/")).is_file()


def test_other_sboms_are_left_alone(tmp_path, caplog):
    assert update_aif_sbom(root=tmp_path, packages=AFTER) is False
    path = tmp_path / AIF_SBOM_FILE.lstrip("/")
    for text in ("not json", '{"spdxVersion": "SPDX-2.3"}'):
        path.write_text(text)
        assert update_aif_sbom(root=tmp_path, packages=AFTER) is False
        assert path.read_text() == text
    assert "Leaving /.sbom.json alone" in caplog.text
