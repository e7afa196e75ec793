"""Canned output of the image probe (engine/imageprobe.py) for unit tests.

Stage unit tests fake the sandbox; this gives them what a real container with
an active env at `prefix` answers, in the probe's own line format.
"""

import json

from cotainr_lumi.engine.imageprobe import PROBE_SCRIPT

MARK = "COTAINR_LUMI_TARGET_ENV"


def is_probe(args):
    """Whether a sandbox command is the target env probe."""
    return PROBE_SCRIPT in list(args)


def probe_stdout(
    prefix=None,
    *,
    var="CONDA_PREFIX",
    version="3.11.2",
    site=None,
    conda_exe="",
    rocm_path="/opt/rocm",
    ldcache=(),
    rocm_version="",
):
    """The probe's output for an image whose env files activate `prefix`.

    ``prefix=None``: an image with only a system python3 on PATH. The image
    also sets CONDA_EXE and ROCM_PATH; `ldcache` are its ``ldconfig -p``
    lines for libstdc++.
    """
    lines = [
        f"{MARK} image with_conda_set ",
        f"{MARK} image with_conda ",
        f"{MARK} image conda_exe {conda_exe}",
        f"{MARK} image rocm_path {rocm_path}",
        f"{MARK} image rocm_version {rocm_version}",
        *(f"{MARK} image ldcache {line}" for line in ldcache),
    ]
    if prefix is None:
        system = {
            "prefix": "/usr",
            "base_prefix": "/usr",
            "executable": "/usr/bin/python3",
            "version": version,
            "site": [],
        }
        lines += [
            f"{MARK} image virtual_env ",
            f"{MARK} image conda_prefix ",
            f"{MARK} image path /usr/bin:/bin",
            f"{MARK} image path_python /usr/bin/python3",
            f"{MARK} image.path_python python {json.dumps(system)}",
        ]
        return "\n".join(lines) + "\n"
    info = {
        "prefix": prefix,
        "base_prefix": "/usr",
        "executable": f"{prefix}/bin/python",
        "version": version,
        "site": site or [f"{prefix}/lib/python3.11/site-packages"],
    }
    key = var.lower()
    lines += [
        f"{MARK} image virtual_env {prefix if key == 'virtual_env' else ''}",
        f"{MARK} image conda_prefix {prefix if key == 'conda_prefix' else ''}",
        f"{MARK} image path {prefix}/bin:/usr/bin:/bin",
        f"{MARK} image path_python {prefix}/bin/python",
        f"{MARK} image.{key} python {json.dumps(info)}",
        f"{MARK} image.path_python python {json.dumps(info)}",
    ]
    return "\n".join(lines) + "\n"
