"""Every artefact in tests/artefacts/ names a real source and states facts."""

import artefacts
import pytest

ALL = sorted(artefacts.ARTEFACTS_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_each_artefact_cites_repository_path_lines_and_commit(path):
    artefact = artefacts.load(path.stem)
    assert artefact.source.cite().startswith(artefact.source.repo)
    assert artefact.facts, f"{path.name} states no facts"


def test_a_source_without_a_full_commit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(artefacts, "ARTEFACTS_DIR", tmp_path)
    (tmp_path / "bad.yaml").write_text(
        "source: {repo: a/b, path: p, commit: abc123, lines: '1', "
        "checked: 2026-11-28}\nfacts: {x: 1}\n"
    )
    with pytest.raises(ValueError, match="40 hex digits"):
        artefacts.load("bad")
