"""
uv as the installer of pip steps (``installer: uv``).

The uv of the ``uv`` extra (``pip install 'cotainr-lumi[uv]'``: the pinned
wheel from PyPI, a prebuilt binary) is copied into the sandbox's work
directory for the steps and runs there, in the container, as
``uv pip install --python <target env's python>``, with the host uv cache
bind-mounted (no copy in and out, which a layered build would make of every
unpacked wheel): the image needs no uv and keeps none. A step uses uv only with what uv does as pip does; anything else
is refused when the plan is made, saying how to run that step with pip.
"""

import contextlib
import importlib.metadata
import logging
from pathlib import Path
import re
import shutil

from ... import apptainer, imagelayout
from ...engine.rootfs import resolve_in_root
from ...errors import InputError, StageError
from ...processes import CommandError
from .protect import Conflict

logger = logging.getLogger(f"cotainr.{__name__}")

#: The uv the ``uv`` extra pins (pyproject.toml).
UV_VERSION = "0.13.9"
#: Where uv and its cache are while the steps run (removed before the image).
UV_BIN = f"{imagelayout.PIP_WORK_DIR}/uv"
UV_CACHE_DIR = f"{imagelayout.PIP_WORK_DIR}/uv-cache"
#: pip install options uv takes under the same name, with pip's meaning
#: (uv's aliases: astral-sh/uv crates/uv-cli/src/lib.rs), and whether a value
#: follows.
UV_PIP_OPTIONS = {
    **dict.fromkeys(("--pre", "-U", "--upgrade", "--force-reinstall"), False),
    **dict.fromkeys(("--no-deps", "--no-index", "--require-hashes"), False),
    **dict.fromkeys(("--no-compile", "-v", "--verbose", "-q", "--quiet"), False),
    **dict.fromkeys(("--only-binary", "--no-binary", "-f", "--find-links"), True),
    **dict.fromkeys(("--trusted-host", "-C", "--config-settings"), True),
}
#: The option lines uv reads in requirement files as pip does
#: (crates/uv-requirements-txt/src/lib.rs); it ignores --pre, --trusted-host,
#: --prefer-binary and --use-feature there and refuses the rest.
UV_FILE_OPTIONS = (
    "-r --requirement -c --constraint -e --editable -i --index-url "
    "--extra-index-url --no-index --require-hashes -f --find-links --no-binary "
    "--only-binary --hash"
).split()
#: Host pip variables and the uv variable of the same meaning (uv ignores PIP_*).
PIP_TO_UV = {
    "PIP_INDEX_URL": ("UV_INDEX_URL", " "),
    "PIP_EXTRA_INDEX_URL": ("UV_EXTRA_INDEX_URL", " "),
    "PIP_FIND_LINKS": ("UV_FIND_LINKS", ","),
    "PIP_TRUSTED_HOST": ("UV_INSECURE_HOST", " "),
}
#: Host uv variables that would send packages elsewhere or read a config.
UNSET_UV_VARIABLES = (
    "UV_CONFIG_FILE UV_SYSTEM_PYTHON UV_BREAK_SYSTEM_PACKAGES UV_NO_CACHE"
)
_CHECK_RE = re.compile(r"The package `(?P<pkg>[^`]+)` (?P<problem>.+?)\.?$")
_REQ_NAME_RE = re.compile(r"requires `(?P<name>[A-Za-z0-9._-]+)")


def find_uv():
    """(the uv program of the ``uv`` extra, its version), or the InputError."""
    try:
        import uv

        program = uv.find_uv_bin()
        version = importlib.metadata.version("uv")
    except (ImportError, FileNotFoundError, importlib.metadata.PackageNotFoundError):
        raise InputError(
            "installer uv: uv is not installed beside cotainr-lumi. Install it with "
            f"pip install 'cotainr-lumi[uv]' (uv {UV_VERSION}), or use pip: "
            "--set pip.installer=pip."
        ) from None
    if version != UV_VERSION:
        logger.warning(
            "uv %s is installed; cotainr-lumi is tested with %s.", version, UV_VERSION
        )
    return program, version


@contextlib.contextmanager
def uv_in_sandbox(*, root, uv, cache, run):
    """Copy uv into the sandbox, check it runs there, mount the host `cache`.

    The cache is mounted at :data:`UV_CACHE_DIR` meanwhile (uv locks it).
    """
    if uv is None:
        yield
        return
    host = resolve_in_root(root=root, path=UV_BIN)
    shutil.copy(uv[0], host)
    host.chmod(0o755)
    try:
        run([UV_BIN, "--version"])
    except CommandError as e:
        raise StageError(
            f"uv {uv[1]} does not run in this image; install these steps with "
            "pip: --set pip.installer=pip (or 'installer: pip' in a step).",
            stage="pip",
            details=e.error_lines(),
        ) from e
    binds = []
    if cache is not None:
        Path(cache).mkdir(parents=True, exist_ok=True)
        resolve_in_root(root=root, path=UV_CACHE_DIR).mkdir(parents=True, exist_ok=True)
        binds.append(f"{cache}:{UV_CACHE_DIR}")
    with apptainer.bind_mounts(binds):
        yield


def uv_problems(*, step, scan):
    """What `step` asks that uv does not do as pip does (option, where)."""
    problems = []
    expect_value = False
    for arg in step.pip_args:
        option = arg.partition("=")[0]
        if expect_value or not arg.startswith("-"):
            expect_value = False
        elif option in UV_PIP_OPTIONS:
            expect_value = UV_PIP_OPTIONS[option] and "=" not in arg
        else:
            problems.append((option, "pip-args"))
    problems += [(o, where) for o, where in scan.options if o not in UV_FILE_OPTIONS]
    return problems


def check_uv_step(*, step, scan):
    """Refuse a uv step with an option uv lacks (one message, the pip way out)."""
    problems = uv_problems(step=step, scan=scan)
    if problems:
        text = ", ".join(f"{option} ({where})" for option, where in problems)
        raise InputError(
            f"{step.title}: uv does not do {text} as pip does. Run this step with "
            "pip: add 'installer: pip' to the step (or --set pip.installer=pip "
            "for every step)."
        )


def uv_command(*, cache_dir, python):
    """The ``uv pip install`` command line (in the container), before a step's arguments."""
    cmd = [UV_BIN, "--color", "never", "--no-config", "--no-progress"]
    cmd += ["--cache-dir", cache_dir] if cache_dir else ["--no-cache"]
    cmd += ["pip", "install", "--python", python, "--link-mode", "copy"]
    # pip's: .pyc files written at install (an image is read-only at run time),
    # the best version over all indexes.
    return cmd + ["--compile-bytecode", "--index-strategy", "unsafe-best-match"]


def uv_env(*, environ, overrides):
    """The uv variables for the host pip variables (after `overrides`)."""
    env = {}
    for pip_name, (uv_name, separator) in PIP_TO_UV.items():
        value = overrides.get(pip_name, environ.get(pip_name, ""))
        if value.split():
            env[uv_name] = separator.join(value.split())
    return env


def parse_uv_check(*, text):
    """(package, problem, packages involved) of each line ``uv pip check`` complains in."""
    found = []
    for line in map(str.strip, text.splitlines()):
        if m := _CHECK_RE.fullmatch(line):
            required = _REQ_NAME_RE.search(m["problem"])
            involved = [m["pkg"], *([required["name"]] if required else [])]
            found.append((m["pkg"], m["problem"], involved))
    return found


def explain_uv_conflicts(*, output, installed, allowed):
    """The protected distributions uv's resolver error is about (as Conflicts)."""
    causes = [
        line.strip().removeprefix("cause:").strip()
        for line in output.splitlines()
        if "Because" in line or "because" in line
    ]
    conflicts = []
    for key, (name, version) in sorted(installed.items()):
        pin = re.compile(
            rf"(?<![\w.-]){re.escape(name)}=={re.escape(version)}(?![\w.+])", re.I
        )
        if key not in allowed and any(pin.search(c) for c in causes):
            conflicts.append(Conflict(name, version, wanted=causes))
    return conflicts
