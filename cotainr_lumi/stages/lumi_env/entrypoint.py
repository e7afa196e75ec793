"""
The environment of the base image's OCI entry point, for ``exec`` too.

Apptainer keeps an OCI ``ENTRYPOINT`` as ``OCI_ENTRYPOINT=`` in
``/.singularity.d/runscript``: ``singularity run`` starts it, ``exec`` and
the runscripts do not. The LUMI AI Factory images set variables there
(``FI_HMEM_DISABLE_P2P`` on one node, GPU visibility). A script that is plain
sh (``sh -n``) doing nothing but tests and assignments before its final
``exec "$@"`` is reproduced, read from the base at build time, as an env file
block; anything else is a warning naming the script.
"""

import logging
import re
import shlex
import subprocess

from ...engine.rootfs import resolve_in_root
from .envfile import read_host_value

logger = logging.getLogger(f"cotainr.{__name__}")

_TEST = r"\[ [^]`]* \]"
_LINE = re.compile(
    rf"(?:if|elif) {_TEST}(?: (?:&&|\|\|) {_TEST})*; then|else|fi"
    r"|(?:export )?[A-Za-z_]\w*=(?:\"[^\"`]*\"|'[^']*'|[^\s;&|<>`'\"]*)"
)
_NAME = re.compile(r"\$\{?([A-Za-z_]\w*)")


def _entrypoint(*, root):
    """The entry point's command (a list), or None."""
    runscript = resolve_in_root(root=root, path="/.singularity.d/runscript")
    text = runscript.read_text(errors="replace") if runscript.is_file() else ""
    found = re.search(r"^OCI_ENTRYPOINT=(.+)$", text, re.M)
    try:
        return shlex.split(shlex.split(found[1])[0]) if found else None
    except (ValueError, IndexError):
        return [found[1]]


def entrypoint_block(*, root):
    """(env file block, label) for the entry point's environment; ("", "") if none."""
    command = _entrypoint(root=root)
    if not command:
        return "", ""
    script = (
        resolve_in_root(root=root, path=command[0]) if command[0][:1] == "/" else None
    )
    lines = (
        script.read_text(errors="replace").splitlines()
        if script and script.is_file()
        else []
    )
    body = [
        ln.strip() for ln in lines[1:] if ln.strip() and not ln.strip().startswith("#")
    ]
    plain = (
        len(command) == 1
        and lines[:1] in (["#!/bin/sh"], ["#!/bin/bash"])
        and body[-1:] == ['exec "$@"']
        and not any("$(" in ln for ln in body)
        and all(_LINE.fullmatch(ln) for ln in body[:-1])
        and subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode
        == 0
    )
    if not plain:
        logger.warning(
            "The base image's OCI entry point %s runs under `singularity run` "
            "only: it is not plain sh setting variables, so exec and the "
            "runscripts do not get its environment.",
            " ".join(command),
        )
        return "", f"not reproduced: {command[0]}"
    sets = {m[1] for ln in body for m in [re.match(r"(?:export )?(\w+)=", ln)] if m}
    reads = sorted({n for ln in body for n in _NAME.findall(ln)} - sets)
    logger.info(
        "Reproducing the environment of %s for exec (%s)",
        command[0],
        ", ".join(sorted(sets)),
    )
    code = [f"# The environment of the base image's OCI entry point {command[0]}."]
    code.append("_cl_ep=")
    for name in reads:  # the host's values are hidden from env scripts (unset after)
        read = read_host_value(name=name, into=name, default="")
        code.append(
            f'if [ -z "${{{name}+x}}" ]; then _cl_ep="$_cl_ep {name}"\n{read}\nfi'
        )
    code += [*body[:-1], 'for _cl_v in $_cl_ep; do unset "$_cl_v"; done']
    code.append("unset _cl_ep _cl_v _cl_env")
    return "\n".join(code), f"reproduced: {command[0]} ({','.join(sorted(sets))})"
