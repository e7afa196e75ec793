"""
The one package that touches cotainr.

Everything cotainr-lumi needs from cotainr goes through here. The build hook
(``docs/upstream/seam-api.md``) is cotainr's own ``cotainr.plugins`` when it
has one, else :mod:`.shim`'s, installed when this package is imported.
"""

import argparse
import contextlib
import inspect
import json
import os
from pathlib import Path
import shlex
import subprocess

from ..errors import UnsupportedCotainrError
from ..imagelayout import LABEL_PAD, LABELS_FILE
from ..processes import CommandError, CommandTimeoutError, killed_after

try:
    import cotainr
    import cotainr.cli
    import cotainr.container
    import cotainr.tracing
    import cotainr.util
except ImportError as e:  # one message, not a traceback (cli.main says it)
    raise UnsupportedCotainrError(
        f"cotainr-lumi needs cotainr, which cannot be imported ({e}); install "
        "it: pip install 'cotainr>=2025.3.0'"
    ) from e

from . import shim

try:  # a cotainr with the build hook (docs/upstream/)
    from cotainr import plugins as _native
except ImportError:
    _native = None
NATIVE = getattr(_native, "HOOK_API_VERSION", None) == shim.HOOK_API_VERSION
_api = _native if NATIVE else shim
BuildContext, PluginError = _api.BuildContext, _api.PluginError
#: Where cotainr's conda step puts its env since 2025.7.0: a cotainr with the
#: hook says so in ``context.conda_prefix`` (checked when a build is planned).
CONDA_PREFIX = "/opt/cotainr/conda"
CONDA_ENV_NAME = "conda_container_env"


def _conda_prefix():
    """Where a stock cotainr's conda step puts its env (``CondaInstall``'s default)."""
    with contextlib.suppress(ImportError, KeyError, TypeError, ValueError):
        from cotainr import pack

        prefix = inspect.signature(pack.CondaInstall).parameters["prefix"].default
        if isinstance(prefix, str):
            return prefix
    return CONDA_PREFIX


#: The installed cotainr version.
COTAINR_VERSION = str(getattr(cotainr, "__version__", "unknown"))
#: Why the shim could not be installed (None: it was, or cotainr has the hook).
SHIM_PROBLEM = None
if not NATIVE:
    CONDA_PREFIX = _conda_prefix()
    SHIM_PROBLEM = shim.install(cotainr, version=COTAINR_VERSION)


def _go_json_size(labels):
    """The size of Apptainer's labels.json (Go: tabs, raw UTF-8, <>& escaped)."""
    text = json.dumps(labels, indent="\t", ensure_ascii=False)
    return len(text.encode()) + 5 * sum(text.count(c) for c in "<>&")


def stock_cotainr_pad(*, labels):
    """
    A label that keeps stock cotainr's rewrite of this labels.json valid.

    cotainr <= 2025.7.1 rewrites labels.json in place without truncating it
    (patch 0003 of docs/upstream/series): a shorter rewrite leaves a broken file.
    Each "\u00b7" is 2 bytes in Apptainer's file and 6 in cotainr's rewrite.
    """
    labels = {k: v for k, v in labels.items() if k != LABEL_PAD}
    short = {k: "" if k == "cotainr.command" else v for k, v in labels.items()}
    # + 8 Apptainer labels (1 byte each in tabs and newlines) and a margin.
    excess = _go_json_size(labels) - len(json.dumps(short)) + 8 + 16
    return {LABEL_PAD: "\u00b7" * max(1, -(-excess // 4))}


def write_labels(*, sandbox, labels):
    """Add `labels` to the sandbox's labels.json (no link; cotainr adds its own)."""
    if not NATIVE:
        path = shim.host_path(sandbox.sandbox_dir, LABELS_FILE)
    else:
        try:
            path = sandbox.host_path(LABELS_FILE.lstrip("/"))
        except ValueError as e:  # cotainr's SandboxLinkError: one message
            raise PluginError(str(e)) from None
    metadata = {}
    with contextlib.suppress(ValueError):  # also an empty file
        text = path.read_text().strip() if path.is_file() else ""
        metadata = json.JSONDecoder().raw_decode(text)[0]
    if not isinstance(metadata, dict):
        metadata = {}
    kept = {k: v for k, v in metadata.items() if not k.startswith("cotainr.")}
    path.write_text(json.dumps({**kept, **labels}))


def plugin_error(error):
    """A :data:`PluginError` (cotainr's or the shim's) of a message or an error."""
    plugin = PluginError(str(error))
    plugin.exit_code = getattr(error, "exit_code", 1)
    return plugin


def check_cotainr_version():
    """Raise unless cotainr can run cotainr-lumi's build hook."""
    if SHIM_PROBLEM:
        raise UnsupportedCotainrError(SHIM_PROBLEM)


def cotainr_subcommand(*, args):
    """The subcommand cotainr's own CLI makes of `args`, with the hook active."""
    return cotainr.cli.CotainrCLI(args=args).subcommand


def build_command():
    """Cotainr's "build" subcommand class (with the hook active)."""
    return cotainr.cli.Build


def takes_several_conda_envs():
    """Whether cotainr's ``--conda-env`` takes several files."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    try:
        cotainr.cli.Build.add_arguments(parser=parser)
        args, _ = parser.parse_known_args(
            ["x", "--base-image=y", "--conda-env", "a", "b"]
        )
    except (argparse.ArgumentError, SystemExit, TypeError):
        return False
    return isinstance(getattr(args, "conda_env", None), list)


def stock_systems():
    """The systems cotainr itself defines (its ``systems.json``)."""
    try:
        systems = json.loads(stock_systems_file().read_text())
    except (OSError, ValueError):
        return {}
    return systems if isinstance(systems, dict) else {}


def stock_systems_file():
    """The path of cotainr's ``systems.json`` (which may not exist)."""
    return Path(getattr(cotainr.util, "systems_file", "systems.json"))


def site_systems_file():
    """LUST's systems.json: in $EBROOTCOTAINR, else cotainr's own (None: neither)."""
    root = os.environ.get("EBROOTCOTAINR", "").strip()
    candidates = [Path(root) / "systems.json"] if root else []
    return next((p for p in [*candidates, stock_systems_file()] if p.is_file()), None)


def command_error_from(error, *, cmd=None):
    """The :class:`CommandError` of a failed command (2025.7: its ``ValueError``)."""
    if isinstance(error, CommandError):
        return error
    cause = error.__cause__ if isinstance(error, ValueError) else error
    if not isinstance(cause, subprocess.CalledProcessError):
        return None
    if cmd is None:
        cmd = cause.cmd if isinstance(cause.cmd, (list, tuple)) else [str(cause.cmd)]
    return CommandError(
        cmd=[str(c) for c in cmd],
        returncode=cause.returncode,
        stdout=cause.stdout,
        stderr=cause.stderr,
    )


class Sandbox:
    """A cotainr ``SingularitySandbox`` with the helpers our stages use."""

    def __init__(self, *, stock):
        self.stock = stock
        self.root = Path(stock.sandbox_dir)

    def run(self, args, *, env=None, timeout=None):
        """Run a command in the container sandbox (writable, no home)."""
        cmd = [str(a) for a in args]
        if env:
            cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *cmd]
        with killed_after(timeout, marker=str(self.root)) as fired:
            try:
                return self.stock.run_command_in_container(cmd=shlex.join(cmd))
            except UnicodeDecodeError as e:
                raise CommandError(
                    cmd=cmd,
                    returncode=-1,
                    stderr=(
                        f"ERROR: the command printed bytes that are not UTF-8 "
                        f"({e.object[max(0, e.start - 20) : e.end + 20]!r}); check "
                        "the base image's /.singularity.d/env scripts"
                    ),
                ) from None
            except (ValueError, subprocess.CalledProcessError) as e:
                if fired:
                    raise CommandTimeoutError(cmd=cmd, timeout=timeout) from None
                command_error = command_error_from(e, cmd=cmd)
                if command_error is None:
                    raise
                raise command_error from e
