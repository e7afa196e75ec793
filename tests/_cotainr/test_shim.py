"""The shim's build hook on stock cotainr: a plugin's sandbox and image (shim.py)."""

import argparse

from cotainr import cli
import pytest

from cotainr_lumi._cotainr import shim


class StubHook:
    """A plugin's build hook that records what cotainr asks of it."""

    api_version = 1

    def __init__(self, *, provides=True, writes=True):
        self.log = []
        self.provides = provides
        self.writes = writes

    def add_arguments(self, *, parser):
        pass

    def prepare(self, *, context):
        return []

    def sandbox(self, *, context, sandbox_dir):
        self.log.append("sandbox")
        if not self.provides:
            return None
        (sandbox_dir / ".singularity.d").mkdir()
        (sandbox_dir / ".singularity.d/labels.json").write_text("{}")
        return lambda: self.log.append("released")

    def customize(self, *, sandbox, context):
        self.log.append("customize")
        return {}

    def write_image(self, *, sandbox, context, path):
        self.log.append("write_image")
        if self.writes:
            path.write_bytes(b"written by the plugin")
        return self.writes

    def finalize(self, *, context, error):
        self.log.append(f"finalize {error is None}")


@pytest.fixture
def stub(monkeypatch):
    def install(**kwargs):
        hook = StubHook(**kwargs)
        monkeypatch.setattr(shim, "hooks", lambda: {"stub": hook})
        # The stub's options, recorded on the class; the recording is undone.
        for name in ("_shim_plugin_options", "_shim_own_options"):
            monkeypatch.setattr(cli.Build, name, None, raising=False)
        cli.Build.add_arguments(parser=argparse.ArgumentParser())
        return hook

    return install


def _build(tmp_path):
    image = tmp_path / "out.sif"
    cli.Build(image_path=str(image), base_image="docker://x").execute()
    return image


def test_a_plugins_sandbox_and_image_replace_cotainrs(tmp_path, fake_singularity, stub):
    hook = stub()
    image = _build(tmp_path)
    assert hook.log == [
        "sandbox",
        "customize",
        "write_image",
        "released",  # before cotainr removes the sandbox directory
        "finalize True",
    ]
    assert image.read_bytes() == b"written by the plugin"
    ran = [args for args in fake_singularity.commands if "build" in args]
    assert ran == []  # no unpack, no squash by cotainr


def test_without_them_cotainr_unpacks_and_builds(tmp_path, fake_singularity, stub):
    hook = stub(provides=False, writes=False)
    image = _build(tmp_path)
    assert hook.log == ["sandbox", "customize", "write_image", "finalize True"]
    assert image.read_bytes().startswith(b"FAKE-SIF")
    builds = [args for args in fake_singularity.commands if "build" in args]
    assert "--sandbox" in builds[0] and "--sandbox" not in builds[1]
