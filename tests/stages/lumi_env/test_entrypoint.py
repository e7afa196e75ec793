"""The env file giving exec what the image's runscript prepares (unit level, sh).

The env file is sourced by ``sh`` as Apptainer sources env scripts: the host's
variables only in ``$__exported_env__``, restored afterwards unless set (as
Apptainer's action script does). The runscripts are the LUMI AI Factory forms
written from their artefacts (``tests/entrypoints.py``); e2e through real
Apptainer: tests/e2e/test_aif_images.py.
"""

import subprocess

import entrypoints
import pytest

from cotainr_lumi.stages.lumi_env import entrypoint

#: Apptainer's restore_env after the env scripts: host values not set by them.
RESTORE = """
_r_nl='
'
_r_rest=$__exported_env__
while [ -n "$_r_rest" ]; do
    _r_kv=${_r_rest%%"$_r_nl"*}; _r_rest=${_r_rest#"$_r_kv"}; _r_rest=${_r_rest#"$_r_nl"}
    eval "_r_set=\\${${_r_kv%%=*}+x} _r_v=\\${${_r_kv%%=*}-}"
    if [ -z "$_r_set" ]; then export "$_r_kv"; elif [ -z "$_r_v" ]; then unset "${_r_kv%%=*}"; fi
done
"""
SHOWN = ("FI_HMEM_DISABLE_P2P", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
#: Job environments as Slurm sets them (plus the opt-ins users export).
ONE_NODE = {"SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_LOCALID": "0"}
MULTI_NODE = {
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "3",
    "SLURM_GPUS_ON_NODE": "8",
    "ROCR_USE_SLURM_LOCALID": "1",
    "MAP_HIP_TO_ROCR_VISIBLE_DEVICES": "1",
}
GPUS = {**ONE_NODE, "SLURM_GPUS_ON_NODE": "8", "ROCR_VISIBLE_DEVICES": "0,1,2,3"}


def image(tmp_path, release=None, *, script=None):
    """A runscript (the release's form, or `script`) and the reporter."""
    form = entrypoints.facts(release) if release else {"kind": "sif-runscript"}
    runscript = tmp_path / "runscript"
    text = script or entrypoints.script(release)
    if form["kind"] == "oci-entrypoint":  # the runscript runs the ENTRYPOINT
        (tmp_path / "oci-entrypoint.sh").write_text(text)
        (tmp_path / "oci-entrypoint.sh").chmod(0o755)
        text = f'#!/bin/sh\nexec {tmp_path}/oci-entrypoint.sh "$@"\n'
    runscript.write_text(text)
    runscript.chmod(0o755)
    reporter = tmp_path / "report"
    reporter.write_text(entrypoint._shipped("entrypoint-report.sh"))
    env_file = entrypoint.env_file_text(
        runscript=str(runscript), reporter=str(reporter)
    )
    return runscript, env_file


def _printer(show):
    return "".join(f'printf "%s\\n" "${{{n}-unset}}"\n' for n in show)


def start(env_file, host, *, action="exec", show=SHOWN):
    """`action` on the image: the env file sourced, host values restored after.

    The command (a child shell) prints what it sees of `show`.
    """
    exported = "\n".join(f"{k}={v}" for k, v in host.items())
    script = "__apptainer_cmd__=$1\n" + env_file + RESTORE + 'exec sh -c "$2"'
    env = {"PATH": "/usr/bin:/bin", "__exported_env__": exported}
    proc = subprocess.run(
        ["sh", "-c", script, "sh", action, _printer(show)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(zip(show, proc.stdout.splitlines())), proc.stderr


def run(runscript, host, *, show=SHOWN):
    """`run`: the runscript with the host's environment, printing `show`."""
    env = {"PATH": "/usr/bin:/bin", **host}
    proc = subprocess.run(
        [str(runscript), "sh", "-c", _printer(show)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(zip(show, proc.stdout.splitlines()))


@pytest.mark.parametrize("release", entrypoints.RELEASES)
@pytest.mark.parametrize("job", [{}, ONE_NODE, MULTI_NODE, GPUS])
def test_exec_gets_what_run_gets_for_each_release_form(tmp_path, release, job):
    runscript, env_file = image(tmp_path, release)
    got, err = start(env_file, job)
    assert got == run(runscript, job) and err == ""
    want = {n: job.get(n, "unset") for n in SHOWN}
    assert got == {**want, **entrypoints.expected(release, job)}


def test_the_may_form_binds_one_gpu_per_task_on_many_nodes(tmp_path):
    # laifs #6/#13: ROCR from SLURM_LOCALID, HIP re-indexed from 0.
    _, env_file = image(tmp_path, "20260807")
    got, _ = start(env_file, MULTI_NODE)
    assert got == {
        "FI_HMEM_DISABLE_P2P": "unset",
        "ROCR_VISIBLE_DEVICES": "3",
        "HIP_VISIBLE_DEVICES": "0",
    }


def test_run_itself_is_left_to_the_runscript(tmp_path):
    _, env_file = image(tmp_path, "20260513")
    got, _ = start(env_file, ONE_NODE, action="run")
    assert got["FI_HMEM_DISABLE_P2P"] == "unset"  # run's runscript sets it


HOSTILE = "a b 'c' \"d\" $(touch PWNED) `touch PWNED` * ; | & \\ é"


def test_values_are_applied_as_data_and_shell_state_is_kept(tmp_path):
    quoted = HOSTILE.replace("'", "'\\''")
    script = f"""#!/bin/sh
export WEIRD='{quoted}'
export _cl_ep=broken __exported_env__=x BASH_ENV=/x APPTAINER_NAME=x HOME=/x
export CHANGED="new $KEPT"
unset GONE HOSTGONE
exec "$@"
"""
    runscript, env_file = image(tmp_path, script=script)
    show = ("WEIRD", "CHANGED", "GONE", "HOSTGONE", "BASH_ENV", "APPTAINER_NAME")
    show += ("HOME", "_cl_ep")
    host = {"KEPT": "host value", "HOSTGONE": "1", "HOME": "/home/me"}
    env_file = "export GONE=image\n" + env_file
    got, _ = start(env_file, host, show=show)
    assert got == {
        "WEIRD": HOSTILE,
        "CHANGED": "new host value",
        "GONE": "unset",  # an image variable the runscript removed
        "HOSTGONE": "unset",  # a host one: not restored either
        "BASH_ENV": "unset",  # shell and runtime state is not taken over
        "APPTAINER_NAME": "unset",
        "HOME": "/home/me",
        "_cl_ep": "unset",
    }
    assert not list(tmp_path.glob("**/PWNED"))


def test_the_runscript_runs_once_per_start_as_under_run(tmp_path):
    # Issue 38 (9): nothing runs that run would not run; the runscript once.
    log = tmp_path / "log"
    script = f'#!/bin/sh\nif [ x; echo started >>{log}; [ x ]; then :; fi\nexec "$@"\n'
    runscript, env_file = image(tmp_path, script=script)
    start(env_file, {})
    assert log.read_text() == "started\n"
    run(runscript, {})
    assert log.read_text() == "started\n" * 2


def test_a_runscript_that_does_not_run_its_command_changes_nothing(tmp_path):
    # Apptainer's runscript of an image without one.
    script = '#!/bin/sh\necho "There is no runscript defined for this container\\n";\n'
    _, env_file = image(tmp_path, script=script)
    got, err = start(env_file, ONE_NODE)
    assert got == dict.fromkeys(SHOWN, "unset")
    assert "did not run its command" in err


def _proc(stdout="", stderr="", returncode=0):
    return subprocess.CompletedProcess([], returncode, stdout=stdout, stderr=stderr)


REPORT = f"{entrypoint.MARKER}\nA=1\n"


@pytest.mark.parametrize(
    ("after", "words"),
    [
        (_proc(REPORT), None),
        (_proc(REPORT, stderr="WARNING: apptainer\n"), None),  # the runtime's own
        (_proc("There is no runscript defined\n"), "did not run its command"),
        (_proc("banner\n" + REPORT), "printed 'banner' before running"),
        (_proc(REPORT, stderr="WARNING: apptainer\nhello\n"), "'hello' on stderr"),
        (_proc(REPORT, returncode=3), "exited with status 3"),
        (None, "did not finish within 60 s"),
    ],
)
def test_what_the_build_refuses_in_a_runscript(after, words):
    before = _proc(REPORT, stderr="WARNING: apptainer\n")
    found = entrypoint.problem(before, after)
    assert found == words or words in found


def test_the_label_names_what_a_one_node_job_changes():
    # (bash, the entry point's shell, drops PS1: shell state, not applied.)
    before = f"{entrypoint.MARKER}\nA=1\nB=2 x\nPS1=Apptainer> \n"
    after = f"{entrypoint.MARKER}\nA=1\nB=3 x\nFI_HMEM_DISABLE_P2P=1\n"
    assert entrypoint.changed_names(before, after) == ["B", "FI_HMEM_DISABLE_P2P"]
