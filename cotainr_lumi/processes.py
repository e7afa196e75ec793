"""
Commands that fail and processes that are stopped.

:class:`CommandError` is a failed command run in the build's sandbox;
:func:`process_tree` and :func:`killed_after` find and stop the processes
below this one (Linux ``/proc``); :func:`stop_cleanly_on_signals` turns a
stop signal into :class:`BuildInterruptedError`, so that clean-up runs.
"""

import contextlib
import os
from pathlib import Path
import shlex
import signal
import threading

from .errors import clip_output


class CommandError(Exception):
    """A command run in the sandbox failed."""

    def __init__(self, *, cmd, returncode, stdout="", stderr=""):
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stdout = stdout or ""
        self.stderr = stderr or ""
        super().__init__(
            f"Command {shlex.join(self.cmd)} exited with status {returncode}"
        )

    def error_lines(self, *, limit=40):
        """The lines of output that explain the failure."""
        lines = (self.stderr or self.stdout).splitlines()
        tags = ("ERROR", "error", "Error", "FATAL", "No module named")
        chosen = [ln for ln in lines if any(tag in ln for tag in tags)] or lines
        return clip_output("\n".join(chosen[-limit:]))


class CommandTimeoutError(CommandError):
    """A command run in the sandbox ran longer than its timeout (and was killed)."""

    def __init__(self, *, cmd, timeout):
        super().__init__(
            cmd=cmd, returncode=-9, stderr=f"ERROR: killed after {timeout:g} s"
        )


def process_tree(pid):
    """`pid` and the process ids below it (Linux /proc)."""
    found = [pid]
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


@contextlib.contextmanager
def killed_after(timeout, *, marker):
    """After `timeout` s, kill the process working on `marker` and all below it."""
    fired = []

    def kill():
        fired.append(True)
        for pid in process_tree(os.getpid())[1:]:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                for victim in reversed(process_tree(pid)):
                    with contextlib.suppress(OSError):
                        os.kill(victim, signal.SIGKILL)
                return

    timer = threading.Timer(timeout or 0, kill)
    timer.daemon = True
    if timeout:
        timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class BuildInterruptedError(BaseException):
    """The build was stopped by a signal (a ``BaseException``, as Ctrl-C's)."""

    def __init__(self, signum):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(
            f"the build was interrupted by {signal.Signals(signum).name}; no image "
            "was written (an existing image is kept) and the build's sandbox and "
            "partial files were removed"
        )


@contextlib.contextmanager
def stop_cleanly_on_signals():
    """Turn SIGTERM/SIGHUP/SIGINT into :class:`BuildInterruptedError`."""

    def handler(signum, frame):
        for sig in STOP_SIGNALS:  # once: the clean-up must not be interrupted
            signal.signal(sig, signal.SIG_IGN)
        for pid in process_tree(os.getpid())[1:]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        raise BuildInterruptedError(signum)

    try:
        saved = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread
        saved = {}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
