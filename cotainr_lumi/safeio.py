"""Reading files that a user, a co-user, a base image or a host tree names: bounded."""

import os
import stat
import subprocess
import threading

#: The most bytes read of a label file, a record or a SIF's JSON object.
MAX_RECORD_BYTES = 64 * 1024**2


def open_regular(path):
    """`path` opened to read bytes if it is a regular file (a device is never opened)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(f"{path} is not a regular file (a FIFO, device or directory)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file (it was replaced)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path, *, limit=MAX_RECORD_BYTES):
    """The bytes of a regular file of at most `limit` bytes (OSError: not one)."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes (not read)")
    return data


def output_bounded(cmd, *, limit=MAX_RECORD_BYTES, timeout=120):
    """The standard output of `cmd` (OSError: more than `limit` bytes); killed after `timeout` s."""
    with subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            data = proc.stdout.read(limit + 1)
        finally:
            timer.cancel()
            proc.kill()
    if len(data) > limit:
        raise OSError(f"{cmd[0]} printed more than {limit} bytes (not read)")
    return data
