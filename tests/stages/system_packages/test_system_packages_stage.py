"""Unit tests of the system-packages stage with a fake sandbox and a fake proot."""

import json
from pathlib import Path
import re
import subprocess

from planfakes import stage_context
import pytest

from cotainr_lumi import buildoptions
from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.stages.system_packages import install
from cotainr_lumi.stages.system_packages.stage import SystemPackagesStage

STATUS = "/var/lib/dpkg/status"
BASE = "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9\n"


def paragraph(name, version, state="installed"):
    return f"Package: {name}\nStatus: install ok {state}\nArchitecture: amd64\nVersion: {version}\n"


class FakeApt:
    """proot running apt-get: answers each run, writes dpkg's database."""

    def __init__(self, root, **outputs):
        self.root, self.outputs, self.runs = Path(root), outputs, []
        self.status = self.root / STATUS.lstrip("/")
        self.status.parent.mkdir(parents=True)
        self.status.write_text(BASE)
        (self.root / "usr/bin").mkdir(parents=True)
        (self.root / "usr/sbin").mkdir(parents=True)
        (self.root / "usr/bin/apt-get").write_text("")
        (self.root / "usr/bin/apt-get").chmod(0o755)
        (self.root / "etc").mkdir()
        (self.root / "etc/os-release").write_text('ID="debian"\n')

    def __call__(self, *, proot, root, tmp, command, timeout):
        what = command[-2] if command[-1] != "update" else "update"
        what = {"--no-install-recommends": "install"}.get(what, what)
        if "--simulate" in command:
            what = "check"
        self.runs.append((what, command))
        assert (self.root / "usr/sbin/policy-rc.d").read_text().endswith("exit 101\n")
        code, out = self.outputs.get(what, (0, ""))
        if what == "install" and code == 0:
            self.status.write_text(BASE + "\n" + paragraph("jq", "1.6-2.1"))
        return subprocess.CompletedProcess(command, code, stdout=out, stderr="")


def test_packages_come_from_set_and_steps_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "steps.yml").write_text("system-packages: [jq, libaio-dev]\n")
    options = {"pip_inputs": [("steps", "steps.yml")]}
    settings = buildoptions.option_settings(options)
    assert settings["system-packages"] == {"packages": ["jq", "libaio-dev"]}
    assert settings["pip"]["steps"] == []
    (tmp_path / "steps.yml").write_text("steps: [a.txt]\nsystem-packages:\n  - -rf\n")
    with pytest.raises(InputError, match=r"steps.yml, line 3, key 'system-packages'"):
        buildoptions.option_settings(options)


def test_proot_missing_is_one_error_saying_what_to_load():
    with pytest.raises(InputError) as e:
        SystemPackagesStage(settings={"packages": ["jq"], "proot": "no-such-proot"})
    assert "module load LUMI PRoot" in str(e.value) and "apt-get install proot" in str(
        e.value
    )
    assert not SystemPackagesStage(settings={}).enabled()


def test_install_records_the_delta_and_leaves_no_scratch(tmp_path, monkeypatch):
    root = tmp_path / "sb"
    apt = FakeApt(root)
    monkeypatch.setattr(install, "run_in_root", apt)
    (root / ".sbom.json").write_text(
        json.dumps({"apt": [{"name": "libc6", "version": "2.36-9"}], "pip": []})
    )
    stage = SystemPackagesStage(settings={"packages": ["jq"], "proot": "true"})
    sandbox = type("Sandbox", (), {"root": root})
    report = stage.run(context=stage_context(sandbox, probe=False))
    assert [w for w, _ in apt.runs] == ["update", "check", "install"]
    assert (
        apt.runs[-1][1][-1] == "jq" and "-oAPT::Sandbox::User=root" in apt.runs[-1][1]
    )
    record = json.loads((root / "opt/cotainr-lumi/system-packages.json").read_text())
    assert record["added"] == [{"name": "jq", "version": "1.6-2.1", "arch": "amd64"}]
    assert record["distro"] == "debian" and report.labels
    sbom = json.loads((root / ".sbom.json").read_text())
    assert sbom["apt"][-1] == {"name": "jq", "version": "1.6-2.1"}
    assert not (root / "usr/sbin/policy-rc.d").exists()
    assert not (root / "opt/cotainr-lumi/.system-packages-work").exists()


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (
            {"check": (100, "E: Unable to locate package nosuch\n")},
            "knows no package nosuch",
        ),
        (
            {"update": (0, "Err:1 http://deb.debian.org/debian bookworm InRelease\n")},
            "could not reach",
        ),
        (
            {"check": (0, "Inst systemd (252 Debian)\n")},
            "systemd (pulled in by the packages) cannot",
        ),
        (
            {
                "install": (
                    100,
                    "E: Sub-process /usr/bin/dpkg returned an error code (1)\n",
                )
            },
            "jq could not be set up",
        ),
        (
            {"install": (1, "E: something else\n")},
            "apt-get install failed (exit status 1)",
        ),
    ],
)
def test_each_failure_is_one_error(tmp_path, monkeypatch, outputs, message):
    root = tmp_path / "sb"
    apt = FakeApt(root, **outputs)
    if "dpkg" in str(outputs):
        apt.status.write_text(
            BASE + "\n" + paragraph("jq", "1.6-2.1", "half-configured")
        )
    monkeypatch.setattr(install, "run_in_root", apt)
    with pytest.raises(StageError, match=re.escape(message)):
        install.install_packages(root=root, packages=["jq"], proot="true")
    assert not (root / "usr/sbin/policy-rc.d").exists()


def test_a_base_without_a_package_manager(tmp_path):
    with pytest.raises(StageError, match="the base image has no package manager"):
        install.install_packages(root=tmp_path, packages=["jq"], proot="true")
