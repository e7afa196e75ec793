"""Building on an image cotainr-lumi built keeps its records apart (engine/history.py)."""

from cotainr_lumi import imagelayout
from cotainr_lumi.engine.history import keep_earlier_build


def write(root, path, text="x"):
    host = root / path.lstrip("/")
    host.parent.mkdir(parents=True, exist_ok=True)
    host.write_text(text)
    return host


def test_a_base_not_built_by_cotainr_lumi_is_left_alone(tmp_path):
    assert keep_earlier_build(root=tmp_path) is None
    assert not (tmp_path / imagelayout.HISTORY_DIR.lstrip("/")).exists()


def test_the_bases_records_move_to_the_history_with_conda_stays(tmp_path):
    write(tmp_path, imagelayout.PROVENANCE_FILE, "first")
    write(tmp_path, imagelayout.TARGET_ENV_FILE)
    write(tmp_path, f"{imagelayout.PIP_DIR}/step2/req.txt")
    write(tmp_path, imagelayout.CYCLONEDX_SBOM_FILE)
    with_conda = write(tmp_path, imagelayout.WITH_CONDA_FILE, "chain")
    assert keep_earlier_build(root=tmp_path) == 1
    entry = tmp_path / imagelayout.HISTORY_DIR.lstrip("/") / "1"
    assert (entry / "provenance.json").read_text() == "first"
    assert (entry / "pip/step2/req.txt").is_file()
    assert sorted(p.name for p in entry.iterdir()) == [
        "pip",
        "provenance.json",
        "sbom.cdx.json",
        "target-env.json",
    ]
    assert not (tmp_path / imagelayout.PIP_DIR.lstrip("/")).exists()
    assert with_conda.read_text() == "chain"
    # A third build: the second's records become history/2.
    write(tmp_path, imagelayout.PROVENANCE_FILE, "second")
    assert keep_earlier_build(root=tmp_path) == 2
    assert (entry.parent / "2/provenance.json").read_text() == "second"


def test_the_bases_labels_move_to_the_history_too(tmp_path):
    import json

    write(tmp_path, imagelayout.PROVENANCE_FILE)
    write(
        tmp_path,
        imagelayout.LABELS_FILE,
        json.dumps(
            {
                "org.label-schema.build-date": "x",
                "cotainr.command": "cotainr build a very long command line",
                "cotainr-lumi.pip.steps": "/opt/cotainr-lumi/pip/steps.json",
            },
            indent=2,
        ),
    )
    assert keep_earlier_build(root=tmp_path) == 1
    labels = json.loads((tmp_path / imagelayout.LABELS_FILE.lstrip("/")).read_text())
    assert labels == {
        "org.label-schema.build-date": "x",
        "cotainr.command": "cotainr build a very long command line",
    }
    moved = tmp_path / imagelayout.HISTORY_DIR.lstrip("/") / "1/labels.json"
    assert json.loads(moved.read_text()) == {
        "cotainr-lumi.pip.steps": "/opt/cotainr-lumi/pip/steps.json"
    }
