"""
proot's fake root: a program of the image run on the sandbox, as the user.

SingularityCE's unprivileged builds on LUMI run ``proot -0`` for ``%post``
(sylabs/singularity ``internal/pkg/build/stage.go``, ec043315). Here proot
itself makes the sandbox the root file system (``-r``), so the image's own
``/etc/passwd`` and ``/etc/group`` are used (a script that adds a user works)
and any proot build runs, whatever the image's C library. Only a few device
files, ``/proc`` and the host's name resolution are shared; ``/tmp`` is a
scratch directory of the stage.
"""

import os
import shutil
import subprocess
import tempfile

from ...errors import InputError

#: Where proot comes from on LUMI (LUMI-training-materials
#: docs/2day-20260422/205-Containers.md L301-303 and L1422-1432, d64bc58c).
LUMI_PROOT = (
    "on LUMI `module load LUMI PRoot` or `module load CrayEnv PRoot` (the "
    "systools module has it too); elsewhere install your distribution's proot "
    "package (Debian, Ubuntu: apt-get install proot)"
)
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
HOST_FILES = ("/etc/resolv.conf", "/etc/hosts")
#: Host variables the package manager gets (proxies); nothing else passes.
PROXY_VARIABLES = tuple(
    name
    for base in ("http_proxy", "https_proxy", "ftp_proxy", "no_proxy")
    for name in (base, base.upper())
)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_proot(command):
    """The proot program `command` names, or the InputError saying what to load."""
    found = shutil.which(command)
    if found is None:
        raise InputError(
            f"system-packages needs proot ({command!r} is not on PATH): "
            f"{LUMI_PROOT}; or name it with --set system-packages.proot=PATH."
        )
    return found


def run_in_root(*, proot, root, tmp, command, timeout):
    """Run `command` (a program of the image) as fake root on `root`."""
    binds = [f"{tmp}:/tmp", *filter(os.path.exists, DEV_FILES + HOST_FILES), "/proc"]
    argv = [proot, "-0", "-r", str(root), "-w", "/"]
    for bind in binds:
        argv += ["-b", bind]
    env = {name: os.environ[name] for name in PROXY_VARIABLES if name in os.environ}
    env.update(PATH=PATH, HOME="/root", LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    env["PROOT_TMP_DIR"] = tempfile.gettempdir()
    return subprocess.run(
        [*argv, *command],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
    )
