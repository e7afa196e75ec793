import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from cotainr_lumi.processes import (
    BuildInterruptedError,
    CommandError,
    CommandTimeoutError,
    killed_after,
    process_tree,
    stop_cleanly_on_signals,
)

# A shell (`marker` on its command line) whose child shell starts a sleep; it
# exits with its child's status, which is not 0 once the sleep is killed.
SLEEPER = "sh -c 'sleep 60; exit 3' \"$0\" & wait $!"


def _start(marker):
    proc = subprocess.Popen(["sh", "-c", SLEEPER, str(marker)])
    for _ in range(100):
        if len(process_tree(proc.pid)) >= 3:
            return proc
        time.sleep(0.05)
    raise AssertionError("the grandchild did not start")


def test_process_tree_finds_the_grandchildren(tmp_path):
    proc = _start(tmp_path)
    try:
        tree = process_tree(os.getpid())
        assert proc.pid in tree and len(process_tree(proc.pid)) >= 3
    finally:
        for pid in reversed(process_tree(proc.pid)):
            with contextlib.suppress(ProcessLookupError):  # its parent exited
                os.kill(pid, 9)
        proc.wait()


def test_killed_after_kills_the_marked_tree_and_says_so(tmp_path):
    with killed_after(2, marker=str(tmp_path)) as fired:
        proc = _start(tmp_path)
        assert proc.wait(timeout=30) != 0
    assert fired == [True]


def test_killed_after_without_a_timeout_kills_nothing(tmp_path):
    with killed_after(None, marker=str(tmp_path)) as fired:
        done = subprocess.run([sys.executable, "-c", "pass"], check=False)
    assert done.returncode == 0 and fired == []


def test_error_lines_pick_the_error_and_a_timeout_says_so():
    error = CommandError(
        cmd=["pip", "install", "x"],
        returncode=1,
        stdout="Collecting x\n",
        stderr="Collecting x\nERROR: No matching distribution found for x\n",
    )
    assert str(error) == "Command pip install x exited with status 1"
    assert error.error_lines() == "ERROR: No matching distribution found for x"
    timeout = CommandTimeoutError(cmd=["sleep", "9"], timeout=2)
    assert timeout.returncode == -9
    assert timeout.error_lines() == "ERROR: killed after 2 s"


def test_a_stop_signal_is_an_interruption_that_stops_the_children_too(tmp_path):
    proc = _start(tmp_path)
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    with pytest.raises(BuildInterruptedError) as caught:
        with stop_cleanly_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal interrupts this
    assert caught.value.exit_code == 128 + signal.SIGTERM
    assert "SIGTERM" in str(caught.value)
    assert proc.wait(timeout=10) != 0  # its tree got SIGTERM
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers
