"""Shared fixtures for the unit tests.

The unit tests never run Apptainer. Like cotainr's own tests, they patch
``SingularitySandbox._subprocess_runner`` (the one place cotainr starts
subprocesses) with :class:`FakeSingularity`, which records every command and
emulates just enough of ``singularity`` for a build to complete: the sandbox
directory gets a ``.singularity.d`` skeleton, ``touch`` creates files, and
``build IMAGE SANDBOX`` writes a small file at IMAGE (the image step of
engine/sifimage.py is patched out: cotainr's own build, the fake's).
"""

import json
import logging
from pathlib import Path
import subprocess
import sys

import artefacts
import pytest

from cotainr_lumi._cotainr import CONDA_PREFIX


class FakeSingularity:
    """Record and emulate the singularity commands cotainr runs."""

    def __init__(self):
        self.commands = []
        self.handlers = []  # (predicate(argv) -> bool, handler(argv) -> CompletedProcess)

    def add_handler(self, predicate, handler):
        """Answer exec commands for which predicate(argv) is true."""
        self.handlers.insert(0, (predicate, handler))

    @property
    def exec_commands(self):
        """The argv (after the sandbox path) of every `singularity exec`."""
        result = []
        for args in self.commands:
            if "exec" in args:
                i = args.index("exec")
                # exec --writable --no-home --no-umask SANDBOX cmd...
                result.append(args[i + 5 :])
        return result

    def __call__(self, *, args, custom_log_dispatcher=None, **kwargs):
        args = [str(a) for a in args]
        self.commands.append(args)
        if "build" in args and "--sandbox" in args:
            sandbox = Path(args[-2])
            (sandbox / ".singularity.d/env").mkdir(parents=True, exist_ok=True)
            (sandbox / ".singularity.d/labels.json").write_text("{}")
            return subprocess.CompletedProcess(args, 0, stdout="", stderr="")
        if "build" in args:
            image, sandbox = Path(args[-2]), Path(args[-1])
            image.write_bytes(
                b"FAKE-SIF\n" + (sandbox / ".singularity.d/labels.json").read_bytes()
            )
            return subprocess.CompletedProcess(args, 0, stdout="", stderr="")
        if "exec" in args:
            argv = args[args.index("exec") + 5 :]
            for predicate, handler in self.handlers:
                if predicate(argv):
                    return handler(argv)
            if argv[:3] == ["conda", "info", "--base"]:
                # Where the installed cotainr puts conda (it checks the answer).
                return subprocess.CompletedProcess(
                    args, 0, stdout=f"{CONDA_PREFIX}\n", stderr=""
                )
            if argv[:2] == ["uname", "-m"]:
                return subprocess.CompletedProcess(
                    args, 0, stdout="x86_64\n", stderr=""
                )
            if argv[:1] == ["touch"]:
                Path(argv[1]).touch()
            return subprocess.CompletedProcess(args, 0, stdout="", stderr="")
        return subprocess.CompletedProcess(args, 0, stdout="", stderr="")


@pytest.fixture(autouse=True)
def isolated_config(tmp_path_factory, monkeypatch):
    """Keep a developer's own profile files, caches and bind variables out of the tests."""
    config_home = tmp_path_factory.mktemp("xdg-config")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.delenv("COTAINR_LUMI_SYSTEMS", raising=False)
    monkeypatch.delenv("EBROOTCOTAINR", raising=False)  # LUST's cotainr module
    for name in (
        "SINGULARITY_BIND",
        "APPTAINER_BIND",
        "SINGULARITY_BINDPATH",
        "APPTAINER_BINDPATH",
    ):
        monkeypatch.delenv(name, raising=False)
    # A cotainr with plugin discovery (upstream patch 0005) asks the plugins
    # for their systems once per process, as a command does; each test here
    # has profiles of its own, so each starts without that answer.
    plugins = sys.modules.get("cotainr.plugins")
    if plugins is not None and hasattr(plugins, "_plugin_systems"):
        monkeypatch.setattr(plugins, "_plugin_systems", None)
    # It also loads the plugins and their hooks once per process; the tests
    # switch plugins on and off (COTAINR_LUMI_DISABLE).
    for module in (plugins, sys.modules.get("cotainr.cli")):
        for cached in vars(module or object).values():
            if callable(getattr(cached, "cache_clear", None)):
                cached.cache_clear()
    # cotainr's CLI attaches handlers to the "cotainr" logger that write to
    # that test's (captured, later closed) streams: each test starts without.
    monkeypatch.setattr(logging.getLogger("cotainr"), "handlers", [])
    return config_home


@pytest.fixture
def fake_singularity(mocker):
    """Patch cotainr's subprocess runner with a recording fake singularity."""
    fake = FakeSingularity()
    mocker.patch(
        "cotainr.container.SingularitySandbox._subprocess_runner",
        side_effect=fake,
        autospec=False,
    )
    # cotainr's own `singularity build IMAGE SANDBOX` (the fake's), not a SIF
    # squashed by engine/sifimage.py (tests/engine/test_sifimage.py).
    mocker.patch("cotainr_lumi.engine.sifimage.write_sif", return_value=None)
    return fake


@pytest.fixture
def no_miniforge_download(mocker):
    """Let cotainr's conda step run without downloading Miniforge."""

    def fake_download(self, *, installer_path):
        Path(installer_path).write_text("#!/bin/sh\n")

    mocker.patch(
        "cotainr.pack.CondaInstall._download_miniforge_installer", fake_download
    )


@pytest.fixture
def base_image(tmp_path):
    """A local file standing in for a base image (with a symlink to it)."""
    real = tmp_path / "images" / "lumi-rocm-6.1.3.sif"
    real.parent.mkdir()
    real.write_bytes(b"not really a sif, but a file with content\n")
    link = tmp_path / "images" / "lumi-rocm.sif"
    link.symlink_to(real.name)
    return link


@pytest.fixture
def test_profile(tmp_path, base_image, monkeypatch):
    """A profile file adding 'lumi-test' (extends lumi-g-ext) on the fake base."""
    path = tmp_path / "test-systems.yaml"
    path.write_text(
        "systems:\n"
        "  lumi-test:\n"
        "    extends: lumi-g-ext-rocm-6.2\n"
        f"    base-image: {base_image}\n"
        '    rocm-version: "6.1"\n'
        "    stages: [provenance]\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    return path


@pytest.fixture
def lust_cotainr_module(tmp_path, monkeypatch):
    """Load "LUST's cotainr module": ``(slug) -> its systems.json``.

    Writes the systems of the artefact `slug` (tests/artefacts/) as the
    module's ``systems.json`` in its install directory, $EBROOTCOTAINR.
    """

    def load(slug):
        root = tmp_path / f"EBROOTCOTAINR-{slug}"
        root.mkdir()
        path = root / artefacts.load(slug).facts["systems-file"]
        path.write_text(json.dumps(artefacts.load(slug).facts["systems"], indent=2))
        monkeypatch.setenv("EBROOTCOTAINR", str(root))
        return path

    return load


def read_labels(image):
    """The labels a FakeSingularity image carries."""
    data = Path(image).read_bytes()
    return json.loads(data.split(b"\n", 1)[1])


@pytest.fixture
def labels_of():
    """Read the labels of an image built with the fake singularity."""
    return read_labels
