"""Run ``cotainr-lumi verify``'s probe with this machine's python (the tests' image)."""

import json
import os
from pathlib import Path
import subprocess
import sys

from cotainr_lumi.verify import checks as verify

PROBE = Path(verify.__file__).with_name("probe.py")


def run_probe(tmp_path, mpi=None, **files):
    """Run the probe with a real python on `files` (name -> content); its facts.

    `mpi`: the MPI inputs to give instead (mpi_file, load_check, load_check_mark).
    """
    paths = {}
    for name, content in files.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(content)
    inputs = {
        **verify.probe_inputs(),
        "labels_file": str(paths.get("labels", tmp_path / "absent")),
        "target_env_file": str(paths.get("target", tmp_path / "absent")),
        "runtime_file": str(paths.get("runtime", tmp_path / "absent")),
        "prune_manifest_file": str(paths.get("manifest", tmp_path / "absent")),
        "records": {
            str(paths.get("manifest", tmp_path / "absent")): "object",
            str(paths.get("packages", tmp_path / "absent")): "array",
        },
    }
    inputs.update(mpi or {})
    source = PROBE.read_text()
    out = subprocess.run(
        [sys.executable, "-c", source, source, json.dumps(inputs)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "COTAINR_LUMI_VERIFY_REEXEC"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout), paths
