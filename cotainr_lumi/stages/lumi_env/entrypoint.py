"""
The environment of the base image's OCI entry point, for ``exec`` too.

Apptainer keeps an OCI ``ENTRYPOINT`` as ``OCI_ENTRYPOINT=`` in the runscript,
which ``exec`` and the runscripts skip (the AI Factory images set
``FI_HMEM_DISABLE_P2P`` there). A plain sh script (``sh -n``) of tests and
assignments before its final ``exec "$@"`` goes into the env file.
"""

import logging
import re
import shlex
import subprocess

from ...engine.rootfs import resolve_in_root
from ...imagelayout import RUNSCRIPT_FILE
from .envfile import read_host_value

logger = logging.getLogger(f"cotainr.{__name__}")

_TEST = r"\[ [^]`]* \]"
_LINE = re.compile(
    rf"(?:if|elif) {_TEST}(?: (?:&&|\|\|) {_TEST})*; then|else|fi"
    r"|(?:export )?[A-Za-z_]\w*=(?:\"[^\"`]*\"|'[^']*'|[^\s;&|<>`'\"]*)"
)


def entrypoint_block(*, root):
    """(env file block, label) of the entry point's environment; ("", "") if none."""
    runscript = resolve_in_root(root=root, path=RUNSCRIPT_FILE)
    text = runscript.read_text(errors="replace") if runscript.is_file() else ""
    found = re.search(r"^OCI_ENTRYPOINT='(.+)'$", text, re.M)
    if not found:
        return "", ""
    try:
        command = shlex.split(found[1])
    except ValueError:
        command = [found[1]]
    script = resolve_in_root(root=root, path="/" + command[0].lstrip("/"))
    lines = script.read_text(errors="replace").splitlines() if script.is_file() else []
    body = [ln.strip() for ln in lines[1:] if ln.strip()[:1] not in ("", "#")]
    if not (
        len(command) == 1
        and lines[:1] in (["#!/bin/sh"], ["#!/bin/bash"])
        and body[-1:] == ['exec "$@"']
        and all(_LINE.fullmatch(ln) and "$(" not in ln for ln in body[:-1])
        and subprocess.run(["sh", "-n", script], capture_output=True).returncode == 0
    ):
        logger.warning(
            "The base image's OCI entry point %s is not plain sh setting variables: "
            "exec and the runscripts do not get its environment.",
            " ".join(command),
        )
        return "", f"not reproduced: {command[0]}"
    sets = sorted({m[1] for ln in body if (m := re.match(r"(?:export )?(\w+)=", ln))})
    reads = {n for ln in body for n in re.findall(r"\$\{?([A-Za-z_]\w*)", ln)}
    logger.info("Reproducing the environment of %s for exec: %s", *command, sets)
    code = [f"# The environment of the base image's OCI entry point {command[0]}."]
    code.append("_cl_ep=")  # the host's values, hidden from env scripts, read
    for name in sorted(reads - set(sets)):
        read = read_host_value(name=name, into=name, default="")
        code.append(
            f'if [ -z "${{{name}+x}}" ]; then _cl_ep="$_cl_ep {name}"\n{read}\nfi'
        )
    code += [*body[:-1], 'for _cl_v in $_cl_ep; do unset "$_cl_v"; done']
    code.append("unset _cl_ep _cl_v _cl_env")
    return "\n".join(code), f"reproduced: {command[0]} ({','.join(sets)})"
