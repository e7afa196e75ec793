"""The label that keeps stock cotainr's labels.json rewrite valid (stock_cotainr_pad)."""

import json
import sys
from unittest import mock

from cotainr.container import SingularitySandbox
import pytest

from cotainr_lumi._cotainr import stock_cotainr_pad


@pytest.mark.parametrize("command", ["", "cotainr build a.sif --base-image b.sif"])
def test_stock_cotainrs_rewrite_of_apptainers_labels_json_stays_valid(
    tmp_path, command
):
    # 40 labels, some with what Apptainer escapes (<>&), and a long command.
    labels = {f"cotainr-lumi.k{i}": f"/opt/v{i}<&>" * 3 for i in range(40)}
    labels["cotainr.command"] = "/opt/venv/bin/cotainr build x.sif " + "-x " * 60
    labels["cotainr.version"] = "2025.7.1"
    labels.update(stock_cotainr_pad(labels=labels))
    text = json.dumps(labels, indent="\t", ensure_ascii=False, sort_keys=True)
    for c in "<>&":  # as Go's encoding/json writes them
        text = text.replace(c, f"\\u{ord(c):04x}")
    sandbox = tmp_path / "sandbox"
    (sandbox / ".singularity.d").mkdir(parents=True)
    (sandbox / ".singularity.d/labels.json").write_text(text)
    # cotainr's own add_metadata (the installed release), with its argv.
    stock = SingularitySandbox.__new__(SingularitySandbox)  # no sandbox made
    stock.sandbox_dir = sandbox
    stock._assert_within_sandbox_context = lambda: None
    with mock.patch.object(sys, "argv", command.split() or [""]):
        stock.add_metadata()
    rewritten = json.loads((sandbox / ".singularity.d/labels.json").read_text())
    assert rewritten["cotainr.command"] == command
