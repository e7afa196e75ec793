"""
MPI facts gathered inside an image for ``cotainr-lumi verify``.

Run by the image's ``python`` (``python -c <this source> <inputs>``) in a
clean environment: the standard library only, one JSON document printed.
Its inputs (:func:`cotainr_lumi.verify.mpi.probe_inputs`) name the build's
records and carry the lumi-env stage's check of mpi4py, which is run by the
target environment's interpreter: which ``libmpi`` mpi4py loads (without
``MPI_Init``); ``ldd`` of that library says whether its dependencies resolve.
"""

import json
import os
import subprocess
import sys

#: The paths and the check to run (verify/mpi.py's probe_inputs).
INPUTS = json.loads(sys.argv[1])


def run(args):
    """Run a command; return its exit status and output tails."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        return {"rc": p.returncode, "out": p.stdout[-4000:], "err": p.stderr[-2000:]}
    except Exception as e:  # noqa: BLE001 - report anything
        return {"rc": None, "out": "", "err": f"{type(e).__name__}: {e}"}


def read_json(path):
    """A JSON file's content, or None."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError):  # malformed: verify's records row
        return None


target = read_json(INPUTS["target_env_file"])
python = sys.executable
if isinstance(target, dict) and os.access(str(target.get("python")), os.X_OK):
    python = target["python"]
facts = {"mpi_probe": True, "python": python}
facts["record"] = read_json(INPUTS["mpi_file"])
facts["check"] = run([python, "-c", INPUTS["load_check"]])
facts["ldd"] = {}
for line in facts["check"]["out"].splitlines():
    if line.startswith(INPUTS["load_check_mark"]):
        loaded = json.loads(line[len(INPUTS["load_check_mark"]) :])
        for library in loaded.get("libmpi") or []:
            facts["ldd"][library] = run(["ldd", library])
names = ("COTAINR_LUMI_MPI", "COTAINR_LUMI_MPI_ACTIVE", "MPI4PY_LIBMPI")
facts["env"] = {name: os.environ.get(name) for name in names}
print(json.dumps(facts))
