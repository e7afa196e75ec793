"""
Run an installed Apptainer/Singularity on a finished image.

cotainr drives ``singularity`` during builds; inspecting a finished ``.sif``
(``cotainr-lumi verify``) only needs ``exec`` and nothing of cotainr.

Functions
---------
runtime()
    The Apptainer/Singularity executable to use.
exec_in_image(*, image, args, clean_env=True, env=None, timeout=600)
    Run a command in an image.
"""

import logging
import os
import shutil
import subprocess

from ..errors import InputError

logger = logging.getLogger(f"cotainr.{__name__}")


def runtime():
    """
    The Apptainer/Singularity executable to use.

    Returns
    -------
    path : str
        ``apptainer`` if on PATH, else ``singularity``.

    Raises
    ------
    :class:`cotainr_lumi.errors.InputError`
        If neither is on PATH.
    """
    for name in ("apptainer", "singularity"):
        path = shutil.which(name)
        if path:
            return path
    raise InputError(
        "Neither 'apptainer' nor 'singularity' is on PATH. On LUMI they are "
        "always available; elsewhere install Apptainer (this project's tests "
        "use scripts/provision-apptainer.sh)."
    )


def exec_in_image(*, image, args, clean_env=True, env=None, timeout=600):
    """
    Run a command in an image.

    Parameters
    ----------
    image : os.PathLike
        The ``.sif`` (or sandbox directory).
    args : sequence of str
        The command.
    clean_env : bool, default=True
        Start from a clean environment (``--cleanenv``) so the image's own
        defaults are seen, not the host's.
    env : mapping of str to str, optional
        Variables to pass in (``--env``).
    timeout : float, default=600
        Seconds before the command is killed.

    Returns
    -------
    process : :class:`subprocess.CompletedProcess`
        With text ``stdout``/``stderr``; the exit status is not checked.
    """
    cmd = [runtime(), "exec", "--no-home"]
    if clean_env:
        cmd.append("--cleanenv")
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    cmd += [os.fspath(image), *args]
    logger.debug("Running %s", cmd)
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False
    )
