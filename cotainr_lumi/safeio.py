"""Reading files that a user, a co-user, a base image or a host tree names: bounded."""

import os
import stat

#: The most bytes read of a label file, a record or a SIF's JSON object.
MAX_RECORD_BYTES = 64 * 1024**2


def open_regular(path):
    """
    `path` opened for reading in binary, if it is a regular file.

    Checked before and after opening (a FIFO opens without blocking and is
    refused; a device is never opened). OSError says why not.
    """
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
