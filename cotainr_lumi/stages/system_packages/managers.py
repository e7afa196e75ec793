"""
The base image's package manager (apt-get, zypper or dnf) and its database.

apt-get keeps its package lists and downloads in the stage's work directory,
so none of them stays in the image; zypper and dnf clean their caches after.
"""

from dataclasses import dataclass
import os
import re

from ...engine.rootfs import resolve_in_root
from ...imagelayout import SYSTEM_PACKAGES_WORK_DIR as WORK

DPKG_STATUS = "/var/lib/dpkg/status"
#: dpkg states of a package whose installation did not finish.
DPKG_UNFINISHED = ("half-installed", "unpacked", "half-configured", "triggers-awaited")
#: Packages whose scripts need real root, which proot's fake root cannot give.
REFUSED = {
    "systemd": "its scripts set up the init system (proot aborts in them)",
    "systemd-sysv": "its scripts set up the init system (proot aborts in them)",
    "udev": "it manages the device nodes of the machine",
    "makedev": "it creates device nodes",
    "dkms": "it builds kernel modules, but a container runs on the host's kernel",
    "linux-image-": "it is a kernel, but a container runs on the host's kernel",
}
_RPM_QUERY = r"%{NAME}\t%{VERSION}-%{RELEASE}\t%{ARCH}\n"


@dataclass(frozen=True)
class Package:
    """An installed distribution package."""

    name: str
    version: str
    arch: str


@dataclass(frozen=True)
class Manager:
    """One package manager: its program, its runs, what it prints, its database."""

    name: str
    program: str
    #: The purl type of its packages (``deb``, ``rpm``).
    kind: str
    #: (what, arguments, whether the package names follow) of each run.
    steps: tuple
    #: What it prints about a package name it does not know.
    unknown: re.Pattern
    #: The options before the arguments of each run.
    options: tuple = ()

    def commands(self, *, packages):
        """(what, argv) of the runs that install `packages`, in order."""
        return [
            (what, [self.program, *self.options, *args, *(packages if named else [])])
            for what, args, named in self.steps
        ]

    def installed(self, *, root, run):
        """The installed packages by name (the dpkg or rpm database)."""
        if self.kind == "deb":
            return {
                p.name: p for state, p in _dpkg_states(root) if state == "installed"
            }
        proc = run(command=["rpm", "-qa", "--qf", _RPM_QUERY])
        lines = [line.split("\t") for line in proc.stdout.splitlines()]
        return {f[0]: Package(*f) for f in lines if len(f) == 3}

    def unfinished(self, *, root):
        """The packages dpkg left half installed or configured (rpm: none)."""
        if self.kind != "deb":
            return []
        states = _dpkg_states(root)
        return sorted(p.name for state, p in states if state in DPKG_UNFINISHED)


MANAGERS = (
    Manager(
        name="apt",
        program="/usr/bin/apt-get",
        kind="deb",
        steps=(
            ("update", ("update",), False),
            ("check", ("install", "--simulate", "--no-install-recommends"), True),
            ("install", ("install", "-y", "--no-install-recommends"), True),
        ),
        unknown=re.compile(
            r"Unable to locate package (\S+)|Package '([^']+)' has no installation"
        ),
        # Lists and downloads in the stage's work directory, no privilege drop.
        options=(
            "-q",
            f"-oDir::State::Lists={WORK}/lists",
            f"-oDir::Cache={WORK}/cache",
            f"-oDir::Cache::Archives={WORK}/archives",
            "-oAPT::Sandbox::User=root",
            "-oAcquire::Languages=none",
            "-oDpkg::Use-Pty=0",
        ),
    ),
    Manager(
        name="zypper",
        program="/usr/bin/zypper",
        kind="rpm",
        steps=(
            (
                "install",
                ("-n", "--gpg-auto-import-keys", "in", "--no-recommends"),
                True,
            ),
            ("clean", ("-n", "clean", "--all"), False),
        ),
        unknown=re.compile(
            r"No provider of '([^']+)' found|Package '([^']+)' not found"
        ),
    ),
    Manager(
        name="dnf",
        program="/usr/bin/dnf",
        kind="rpm",
        steps=(
            ("install", ("-y", "--setopt=install_weak_deps=False", "install"), True),
            ("clean", ("clean", "all"), False),
        ),
        unknown=re.compile(r"No match for argument: (\S+)"),
    ),
)


def find_manager(*, root):
    """The first package manager the image has, or None."""
    for manager in MANAGERS:
        if os.access(resolve_in_root(root=root, path=manager.program), os.X_OK):
            return manager
    return None


def refusal(name):
    """Why `name` cannot be installed under fake root (None: it may)."""
    for refused, reason in REFUSED.items():
        if name == refused or (refused.endswith("-") and name.startswith(refused)):
            return reason
    return None


def _dpkg_states(root):
    """(state, package) of each package in dpkg's database."""
    path = resolve_in_root(root=root, path=DPKG_STATUS)
    text = path.read_text(errors="replace") if path.is_file() else ""
    found = []
    for paragraph in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", paragraph, re.MULTILINE))
        if "Package" in fields:
            package = Package(
                fields["Package"],
                fields.get("Version", ""),
                fields.get("Architecture", ""),
            )
            found.append((fields.get("Status", "").split(" ")[-1], package))
    return found
