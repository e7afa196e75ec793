"""
What the backport of the build stage seam needs of a stock cotainr, checked.

On a cotainr without the seam (``docs/upstream/``), :mod:`.backport` runs
cotainr's own ``Build.execute`` and runs the stages when it adds its
metadata. Each assumption that makes is listed here with a check of
cotainr's *behaviour*: :func:`probe_stock_build` runs ``Build.execute`` with
recording stand-ins for the sandbox and the conda installer (no subprocess,
no file outside a temporary directory) and records what it does. When an
assumption fails, cotainr-lumi disables itself (stock ``cotainr`` keeps
working) and says once which one broke, instead of pinning cotainr's
version. A cotainr that merged part of the series (``--force``, the spinner,
systems files, plugin discovery) still meets every one.

Classes
-------
Assumption
    One assumption about cotainr.
StockBuildProbe
    What cotainr's ``Build.execute`` did with recording stand-ins.

Functions
---------
probe_stock_build()
    Run cotainr's ``Build.execute`` with recording stand-ins.
takes_several_conda_envs()
    Whether cotainr's ``--conda-env`` takes several files.
conda_prefix()
    Where cotainr installs conda in the image.
conda_env_name()
    The name cotainr gives the conda environment.
broken_assumptions()
    The assumptions the installed cotainr does not meet.

Attributes
----------
ASSUMPTIONS : tuple of Assumption
    All assumptions of the backport.
"""

import argparse
import contextlib
from dataclasses import dataclass, field
import functools
import inspect
import io
import logging
from pathlib import Path
import tempfile
from typing import Callable, Optional

from cotainr import cli as _cli
from cotainr import container as _container
from cotainr import pack as _pack
from cotainr import tracing as _tracing

logger = logging.getLogger(f"cotainr.{__name__}")


@dataclass(frozen=True)
class Assumption:
    """
    One assumption about cotainr.

    Attributes
    ----------
    name : str
        What it is about.
    why : str
        What cotainr-lumi uses it for.
    check : callable
        Returns None when the assumption holds, else the reason it does not.
    """

    name: str
    why: str
    check: Callable[[], "str | None"]


@dataclass
class StockBuildProbe:
    """
    What cotainr's ``Build.execute`` did with recording stand-ins.

    Attributes
    ----------
    calls : list of str
        The sandbox and conda calls, in order (``"enter"``, ``"conda"``,
        ``"add_to_env"``, ``"add_metadata"``, ``"build_image"``, ``"exit"``).
    base_image : str or None
        The base image the sandbox was created from.
    image_path : :class:`pathlib.Path` or None
        Where the image was built.
    conda_env_name : str or None
        The conda environment's name.
    conda_prefix : str or None
        The prefix given to the conda installer (None: its default).
    activation : list of str
        What was added to the image's environment.
    error : str or None
        Why the probe failed, if it did.
    """

    calls: list = field(default_factory=list)
    base_image: Optional[str] = None
    image_path: Optional[Path] = None
    conda_env_name: Optional[str] = None
    conda_prefix: Optional[str] = None
    activation: list = field(default_factory=list)
    error: Optional[str] = None


def _stand_ins(probe, sandbox_dir):
    """Recording sandbox and conda installer classes for `probe`."""

    class RecordingSandbox:
        def __init__(self, *, base_image, log_settings=None):
            probe.base_image = base_image
            self.sandbox_dir = None

        def __enter__(self):
            probe.calls.append("enter")
            self.sandbox_dir = sandbox_dir
            return self

        def __exit__(self, *exc):
            probe.calls.append("exit")
            self.sandbox_dir = None

        def add_to_env(self, *, shell_script):
            probe.calls.append("add_to_env")
            probe.activation.append(shell_script)

        def add_metadata(self):
            probe.calls.append("add_metadata")

        def build_image(self, *, path):
            probe.calls.append("build_image")
            probe.image_path = Path(path)
            # As a real build does: a cotainr that builds under a temporary
            # name and moves it into place (upstream patch 0003) finds it;
            # never a file outside the probe's temporary directory.
            if probe.image_path.parent == sandbox_dir.parent:
                probe.image_path.touch()

        def run_command_in_container(self, *, cmd, custom_log_dispatcher=None):
            probe.calls.append("run")

    class RecordingConda:
        def __init__(self, *, sandbox, license_accepted=False, **kwargs):
            probe.calls.append("conda")
            probe.conda_prefix = kwargs.get("prefix")

        def add_environment(self, *, path, name):
            probe.conda_env_name = name

        def extend_environment(self, *, path, name):
            probe.calls.append("conda-extend")

        def cleanup_unused_files(self):
            pass

    return RecordingSandbox, RecordingConda


@functools.lru_cache(maxsize=1)
def takes_several_conda_envs():
    """
    Whether cotainr's ``--conda-env`` takes several files.

    cotainr 2025.7 takes one; its ``feature/enhance_conda_env_installation``
    branch takes several (``nargs="+"``), holds them as a list in
    ``Build.conda_env``, creates the env from the first and updates it with
    the others in order. Asked of cotainr's own ``build`` parser.

    Returns
    -------
    several : bool
        True when ``--conda-env a.yml b.yml`` parses to a list of both.
    """
    parser = argparse.ArgumentParser(prog="probe", add_help=False)
    try:
        _cli.Build.add_arguments(parser=parser)
        with contextlib.redirect_stderr(io.StringIO()):
            args, _ = parser.parse_known_args(
                ["probe.sif", "--base-image=probe", "--conda-env", "a.yml", "b.yml"]
            )
    except (Exception, SystemExit):  # noqa: BLE001 - any failure means "one"
        return False
    given = getattr(args, "conda_env", None)
    return isinstance(given, list) and [str(f) for f in given] == ["a.yml", "b.yml"]


@functools.lru_cache(maxsize=1)
def probe_stock_build():
    """
    Run cotainr's ``Build.execute`` with recording stand-ins.

    The build object has only the attributes the backport sets
    (``image_path``, ``base_image``, ``conda_env``, ``accept_licenses``,
    ``log_settings``, ``force``, ``dry_run``, ``system_name``); cotainr's
    log output is silenced.

    Returns
    -------
    probe : StockBuildProbe
        What happened (``probe.error`` says why if it failed).
    """
    probe = StockBuildProbe()
    with tempfile.TemporaryDirectory(prefix="cotainr-lumi-probe-") as tmp:
        sandbox_dir = Path(tmp) / "sandbox"
        sandbox_dir.mkdir()
        conda_env = Path(tmp) / "env.yml"
        conda_env.write_text("name: probe\n")
        sandbox_cls, conda_cls = _stand_ins(probe, sandbox_dir)
        build = object.__new__(_cli.Build)
        build.image_path = Path(tmp) / "probe.sif"
        build.base_image = "probe-base"
        build.conda_env = [conda_env] if takes_several_conda_envs() else conda_env
        build.accept_licenses = True
        build.log_settings = None
        build.force = False
        build.dry_run = False
        build.system_name = None
        cotainr_logger = logging.getLogger("cotainr")
        with contextlib.ExitStack() as stack:
            for owner, name, value in (
                (_container, "SingularitySandbox", sandbox_cls),
                (_pack, "CondaInstall", conda_cls),
                (_tracing, "ConsoleSpinner", contextlib.nullcontext),
                (cotainr_logger, "disabled", True),
            ):
                original = getattr(owner, name)
                setattr(owner, name, value)
                stack.callback(setattr, owner, name, original)
            try:
                _cli.Build.execute(build)
            except Exception as e:  # noqa: BLE001 - any failure means "broken"
                probe.error = f"{type(e).__name__}: {e}"
        if probe.image_path is not None and probe.image_path.parent == Path(tmp):
            probe.image_path = Path(probe.image_path.name)
    return probe


def _order_holds():
    """Check that execute adds metadata after conda and before the image."""
    probe = probe_stock_build()
    if probe.error:
        return f"Build.execute failed with stand-ins: {probe.error}"
    wanted = ["enter", "conda", "add_metadata", "build_image", "exit"]
    seen = [call for call in probe.calls if call in wanted]
    if seen != wanted:
        return f"calls were {probe.calls}, expected the order {wanted}"
    if probe.base_image != "probe-base":
        return f"the sandbox was made from {probe.base_image!r}, not base_image"
    return None


def _image_path_holds():
    """Check that execute builds to ``image_path`` (or a name next to it)."""
    probe = probe_stock_build()
    if probe.image_path is None:
        return "no image was built"
    if "probe.sif" not in probe.image_path.name:
        return f"the image went to {probe.image_path}, not next to image_path"
    return None


def _conda_holds():
    """Check that the conda env is named and activated."""
    probe = probe_stock_build()
    name = probe.conda_env_name
    if not name:
        return "no conda environment name was recorded"
    if not any(name in script for script in probe.activation):
        return f"the environment {name!r} is not activated in the image's env"
    return None


def conda_prefix():
    """
    Where cotainr installs conda in the image.

    Returns
    -------
    prefix : str
        ``/opt/cotainr/conda`` from 2025.7.0, ``/opt/conda`` before.
    """
    probe = probe_stock_build()
    if probe.conda_prefix:
        return str(probe.conda_prefix)
    param = inspect.signature(_pack.CondaInstall.__init__).parameters.get("prefix")
    return None if param is None else str(param.default)


def conda_env_name():
    """
    The name cotainr gives the conda environment.

    Returns
    -------
    name : str or None
        ``conda_container_env`` in every release so far.
    """
    return probe_stock_build().conda_env_name


def _has(owner, attr):
    """Check that `owner` has `attr`."""
    return None if hasattr(owner, attr) else f"{attr} is missing"


ASSUMPTIONS = (
    Assumption(
        "cotainr.cli.Build.execute: sandbox, conda, metadata, image, in this order",
        "the stages run when cotainr adds its metadata, after its conda step",
        _order_holds,
    ),
    Assumption(
        "cotainr.cli.Build.execute builds the image at image_path",
        "the image is built under a temporary name and moved into place",
        _image_path_holds,
    ),
    Assumption(
        "cotainr.cli.Build.execute names and activates the conda environment",
        "stages are told the conda environment's name and prefix",
        _conda_holds,
    ),
    Assumption(
        "cotainr.pack.CondaInstall has a prefix",
        "stages are told where conda is in the image",
        lambda: None if conda_prefix() else "no prefix parameter",
    ),
    Assumption(
        "cotainr.cli.CotainrCLI._subcommands",
        "the start-up hook puts the backport's Build in this list",
        lambda: _has(_cli.CotainrCLI, "_subcommands"),
    ),
    Assumption(
        "cotainr.container.SingularitySandbox.run_command_in_container(cmd=, custom_log_dispatcher=)",
        "stages run commands in the sandbox",
        lambda: (
            None
            if {"cmd", "custom_log_dispatcher"}
            <= set(
                inspect.signature(
                    _container.SingularitySandbox.run_command_in_container
                ).parameters
            )
            else "other keyword arguments"
        ),
    ),
)


def broken_assumptions():
    """
    The assumptions the installed cotainr does not meet.

    Returns
    -------
    broken : list of (Assumption, str)
        Each broken assumption with the reason.
    """
    broken = []
    for assumption in ASSUMPTIONS:
        try:
            reason = assumption.check()
        except Exception as e:  # noqa: BLE001 - any failure means "broken"
            reason = f"{type(e).__name__}: {e}"
        if reason:
            broken.append((assumption, reason))
    return broken
