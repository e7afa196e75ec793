"""
The one probe of the image, run in the container once per build.

:data:`PROBE_SCRIPT` asks the image what a user's job would see (a clean
environment, its ``/.singularity.d/env`` scripts, then ``eval "$WITH_CONDA"``);
its facts feed :func:`cotainr_lumi.engine.targetenv.choose` and carry what
other stages need (``CONDA_EXE``, ``ROCM_PATH``, the loader cache's
``libstdc++``). A dry run runs it in a local base image.
"""

from dataclasses import dataclass, field
import json
import logging
import os
import re
from typing import Any, Optional

from .. import apptainer, imagelayout
from ..errors import StageError
from ..processes import CommandError, CommandTimeoutError
from .rootfs import write_file_in_root
from .targetenv import (
    CONDA_ENV,
    SETTINGS_NAME,
    TargetEnv,
    TargetEnvNotFoundError,
    choose,
    timeout_message,
)

logger = logging.getLogger(f"cotainr.{__name__}")

#: One fact of the probe's output: where, key, value.
_FACT = re.compile("COTAINR_LUMI_TARGET_ENV ([^ ]*) ?([^ ]*) ?(.*)")

#: Each fact is one line "MARK <where> <key> <value>" ("ldcache" once per
#: entry); $1: an explicit prefix to check (may be empty).
PROBE_SCRIPT = r"""
for f in /.singularity.d/env/*.sh; do
    [ -r "$f" ] && . "$f" >/dev/null 2>&1
done
M='COTAINR_LUMI_TARGET_ENV'
fact() { # one line: \ and newline escaped as \\ and \n (parse_probe decodes)
    local v=${3//\\/\\\\}
    printf '%s %s %s %s\n' "$M" "$1" "$2" "${v//$'\n'/\\n}"
}
pyinfo() { # pyinfo WHERE PREFIX: facts of PREFIX's own interpreter
    for py in "$2/bin/python" "$2/bin/python3"; do
        if [ -x "$py" ]; then
            fact "$1" python "$("$py" -c 'import json, os, re, sys, sysconfig
paths = sysconfig.get_paths()
site = [paths["purelib"], paths["platlib"]]
site += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))
         and not p.startswith("/usr/")]
site = list(dict.fromkeys(site))
here = lambda *p: os.path.join(sys.prefix, *p)
torch = None
for d in site:
    try:
        with open(os.path.join(d, "torch", "version.py")) as f:
            text = f.read(20000)
    except OSError:
        continue
    found = dict(re.findall(r"^(__version__|hip)\s*(?::[^=]*)?=\s*[\x27\x22]([^\x27\x22]*)", text, re.M))
    torch = {"dir": os.path.join(d, "torch"), "version": found.get("__version__", ""),
             "hip": found.get("hip", "")}
    break
print(json.dumps({"prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "executable": sys.executable, "version": sys.version.split()[0], "site": site,
    "venv": sys.prefix != sys.base_prefix or os.path.isfile(here("pyvenv.cfg")),
    "conda_meta": os.path.isdir(here("conda-meta")),
    "conda_base": os.path.isdir(here("condabin")) or os.path.isdir(here("envs")),
    "torch": torch}))' 2>/dev/null)"
            return
        fi
    done
}
pythonpath_env() { # the env whose <prefix>/lib/pythonX.Y/site-packages is first on PYTHONPATH
    local IFS=: entry
    for entry in ${PYTHONPATH:-}; do
        case "${entry%/}" in
        /*/lib/python*/site-packages) printf '%s\n' "${entry%%/lib/python*}"; return ;;
        esac
    done
}
state() { # state WHERE: the environment as it is now
    fact "$1" virtual_env "${VIRTUAL_ENV:-}"
    fact "$1" conda_prefix "${CONDA_PREFIX:-}"
    fact "$1" path "${PATH:-}"
    [ -n "${VIRTUAL_ENV:-}" ] && pyinfo "$1.virtual_env" "$VIRTUAL_ENV"
    [ -n "${CONDA_PREFIX:-}" ] && pyinfo "$1.conda_prefix" "$CONDA_PREFIX"
    py="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
    fact "$1" path_python "$py"
    [ -n "$py" ] && pyinfo "$1.path_python" "$(dirname "$(dirname "$py")")"
    pp="$(pythonpath_env)"
    [ -n "$pp" ] && fact "$1" pythonpath_prefix "$pp" && pyinfo "$1.pythonpath_env" "$pp"
}
fact image with_conda_set "${WITH_CONDA+set}"
fact image with_conda "${WITH_CONDA:-}"
state image
fact image conda_exe "${CONDA_EXE:-}"
fact image rocm_path "${ROCM_PATH:-}"
fact image ld_library_path "${LD_LIBRARY_PATH:-}"
fact image rocm_version "$(head -n 1 "${ROCM_PATH:-/opt/rocm}/.info/version" 2>/dev/null || true)"
{ ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } | grep -F 'libstdc++' |
    while IFS= read -r line; do fact image ldcache "$line"; done
[ -n "${1:-}" ] && pyinfo explicit "$1"
if [ -n "${WITH_CONDA:-}" ]; then
    (
        eval "$WITH_CONDA" >/dev/null 2>&1
        fact with_conda rc "$?"
        state with_conda
    )
fi
exit 0
"""

#: A clean start (no host variables), like ``apptainer exec --cleanenv``.
CLEAN_ENV = (
    "env",
    "-i",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/",
    "LANG=C",
)


def _json(text):
    """The value of JSON text (None: not JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_probe(*, text):
    """Parse the output of :data:`PROBE_SCRIPT`."""
    facts: dict[str, dict[str, Any]] = {}
    for match in filter(None, map(_FACT.match, text.splitlines())):
        where, key, value = match.groups()
        value = re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], value)
        state = facts.setdefault(where, {})
        if key == "ldcache":
            state.setdefault(key, []).append(value)
        elif key == "python":
            state[key] = _json(value)
        else:
            state[key] = value
    return facts


def probe_command(*, explicit=None):
    """The command that probes an image (run inside the container)."""
    shell = ("bash", "--noprofile", "--norc", "-c", PROBE_SCRIPT, "probe")
    return [*CLEAN_ENV, *shell, explicit or ""]


@dataclass(frozen=True)
class TargetAnswer:
    """
    The build's answer on its target Python environment.

    Attributes
    ----------
    env : TargetEnv or None
        The target env (None: there is none).
    problem : str
        Why there is none.
    labels : dict of str to str
        The label naming it.
    """

    env: Optional[TargetEnv] = None
    problem: str = ""
    labels: dict = field(default_factory=dict)


def probe_build(*, sandbox, build):
    """The build's one probe, before the stages; recorded in the image and a label."""
    settings = build.target_settings
    explicit = settings.prefix
    conda_env = bool(build.conda_envs) and CONDA_ENV
    try:
        command = probe_command(explicit=explicit or conda_env)
        output = sandbox.run(command, timeout=settings.probe_timeout).stdout or ""
    except CommandTimeoutError:
        raise StageError(
            timeout_message(settings.probe_timeout), stage=SETTINGS_NAME
        ) from None
    except CommandError as e:
        raise StageError(
            "could not start the container to find its Python environment",
            stage=SETTINGS_NAME,
            details=e.error_lines(),
        ) from e
    try:
        target = choose(
            facts=parse_probe(text=output), explicit=explicit, conda_env=conda_env
        )
    except TargetEnvNotFoundError as e:
        logger.info("No target Python environment: %s", e)
        return TargetAnswer(problem=str(e))
    logger.info("Target Python environment: %s", target.describe())
    for decoy in target.decoys.values():
        logger.info("Not the target: %s", decoy)
    write_file_in_root(
        root=sandbox.root,
        path=imagelayout.TARGET_ENV_FILE,
        content=json.dumps(target.to_dict(), indent=2, sort_keys=True) + "\n",
    )
    return TargetAnswer(
        env=target, labels={imagelayout.LABEL_TARGET_ENV: target.prefix}
    )


def probe_image_facts(*, image, explicit=None, timeout=120):
    """The probe's facts of an image file (dry runs)."""
    if apptainer.find_runtime() is None or not (
        os.path.isdir(image) or apptainer.is_sif(image)
    ):
        return None
    proc = apptainer.exec_in_image(
        image=os.fspath(image), args=probe_command(explicit=explicit), timeout=timeout
    )
    proc.check_returncode()  # a CalledProcessError with the output
    return parse_probe(text=proc.stdout)
