"""cotainr's add_metadata leaves no tail of a longer labels.json (_cotainr/labels.py)."""

import json

from cotainr_lumi._cotainr import _cli
from cotainr_lumi._cotainr.labels import load_labels, prepare_for_cotainr_metadata
from cotainr_lumi.imagelayout import LABELS_FILE


class _Sandbox:
    """Just enough of cotainr's SingularitySandbox to run its add_metadata."""

    def __init__(self, root):
        self.sandbox_dir = root

    def _assert_within_sandbox_context(self):
        pass


def test_a_longer_base_labels_file_is_written_so_cotainr_leaves_no_tail(tmp_path):
    from cotainr.container import SingularitySandbox

    path = tmp_path / LABELS_FILE.lstrip("/")
    path.parent.mkdir(parents=True)
    base = {
        "cotainr.command": "cotainr build first.sif --system=x "
        + "--long-option " * 20,
        "cotainr.version": "2025.7.1",
        "org.label": "kept",
    }
    path.write_text(json.dumps(base, indent=2))
    prepare_for_cotainr_metadata(root=tmp_path)
    SingularitySandbox.add_metadata(_Sandbox(tmp_path))
    labels = json.loads(path.read_text())  # no "Extra data"
    assert labels["org.label"] == "kept" and labels["cotainr.url"]
    assert _cli  # cotainr is importable through the package


def test_load_labels_ignores_a_tail(tmp_path):
    path = tmp_path / "labels.json"
    path.write_text('{"a": "1"}"b": "2"}')
    assert load_labels(path=path) == {"a": "1"}
    assert load_labels(path=tmp_path / "none.json") == {}
