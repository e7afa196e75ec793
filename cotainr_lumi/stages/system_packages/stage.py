"""
The system-packages stage: distribution packages installed without root.

Before the pip steps, the base image's own package manager (apt-get, zypper
or dnf) installs the packages into the sandbox under proot's fake root, as
SingularityCE's unprivileged builds on LUMI do (:mod:`.proot`). The record
lists the packages added and their versions (the dpkg or rpm database before
and after); the AI Factory images' ``/.sbom.json`` gets them in its ``apt``
list. Pruning and the runtime settings run after it as after the pip steps.
"""

from dataclasses import asdict, dataclass
import json
import os
import re

from ... import imagelayout
from ...engine.origins import FileOrigin
from ...engine.rootfs import write_file_in_root
from ...engine.settings import SettingError, StageSettings, each, load_settings, setting
from ...engine.stage import Stage, StageReport
from ...engine.yamlfile import LineDict, read_yaml
from ...errors import InputError
from .install import install_packages, update_aif_sbom
from .managers import REFUSED
from .proot import find_proot

#: A package name (a version may follow, as the package manager takes it).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._:=~<>-]*")
#: The key of a pip steps file that lists system packages.
STEPS_FILE_KEY = "system-packages"


def _check_name(name):
    if not _NAME_RE.fullmatch(name):
        raise SettingError(f"{name!r} is not a package name")


@dataclass(frozen=True)
class SystemPackagesSettings(StageSettings):
    """The settings of the system-packages stage."""

    packages: list[str] = setting(
        [],
        doc="distribution packages to install with the base's apt-get, zypper or dnf",
        check=each(_check_name),
    )
    proot: str = setting("proot", doc="the proot program (a name on PATH or a path)")


def packages_of_steps_file(path):
    """The ``system-packages`` of one pip steps file (as stage settings)."""
    path = os.path.abspath(os.path.expanduser(path))
    data = read_yaml(
        path=path, error=lambda m: InputError(f"The pip steps file {path} {m}.")
    )
    if not isinstance(data, dict) or STEPS_FILE_KEY not in data:
        return {}
    view = LineDict(packages=data[STEPS_FILE_KEY])
    view.lines["packages"] = data.lines.get(STEPS_FILE_KEY)
    origin = FileOrigin(
        file=path,
        data=view,
        what="pip steps file",
        describe=lambda _path: f"key '{STEPS_FILE_KEY}'",
    )
    return load_settings(
        schema=SystemPackagesSettings, raw=view, origin=origin, stage="system-packages"
    )


class SystemPackagesStage(Stage):
    """Distribution packages, installed under proot's fake root."""

    name = "system-packages"
    settings_class = SystemPackagesSettings

    def __init__(self, *, settings=None):
        super().__init__(settings=settings)
        self.proot = None
        if self.settings.packages:
            self.proot = find_proot(self.settings.proot)

    def enabled(self):
        """Only with packages to install."""
        return bool(self.settings.packages)

    def describe(self, *, build):
        """The packages, the package manager, proot and the records."""
        refused = ", ".join(
            f"{name}*" if name.endswith("-") else name for name in REFUSED
        )
        return [
            f"packages: {', '.join(self.settings.packages)} (and what they need, "
            "no recommended packages)",
            "with the base image's apt-get, zypper or dnf, under proot's fake root "
            f"({self.proot} -0 -r SANDBOX): nothing runs as root, the host is not changed",
            f"refused: packages whose scripts need real root ({refused})",
            f"records: {imagelayout.SYSTEM_PACKAGES_FILE} (packages added, versions), "
            f"the {imagelayout.AIF_SBOM_FILE} apt list if the base has one",
        ]

    def run(self, *, context):
        """Install the packages; write the record."""
        root = context.sandbox.root
        record = install_packages(
            root=root, packages=list(self.settings.packages), proot=self.proot
        )
        data = asdict(record)
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        write_file_in_root(
            root=root, path=imagelayout.SYSTEM_PACKAGES_FILE, content=text
        )
        aif = update_aif_sbom(root=root, record=record)
        added = ", ".join(f"{p.name} {p.version}" for p in record.added) or "nothing"
        summary = f"{record.manager}: added {added}"
        if aif:
            summary += f"; {imagelayout.AIF_SBOM_FILE} updated"
        return StageReport(
            name=self.name,
            summary=summary,
            record=data,
            labels={
                imagelayout.LABEL_SYSTEM_PACKAGES: imagelayout.SYSTEM_PACKAGES_FILE
            },
        )
