"""
The network layer of an image: RCCL's network plugin, libfabric, rccl-tests.

LUMI's image families keep these in different places (``systems.yaml``).
The stage makes RCCL load the plugin and records it all
(:data:`cotainr_lumi.imagelayout.RUNTIME_FILE`) for ``cotainr-lumi verify``.
"""

import json
import logging
import shlex

from ... import imagelayout
from ...engine import rcclplugin
from ...engine.elfinfo import DEFAULT_LOADER_DIRS, read_elf_info
from ...engine.rootfs import resolve_in_root, write_file_in_root
from .envfile import default_assignments, path_addition
from .mpiscan import LIBFABRIC, ImageFiles

logger = logging.getLogger(f"cotainr.{__name__}")

#: Where the ROCm base and EasyBuild images keep the plugin.
AWS_OFI_RCCL_DIRS = (
    "/opt/aws-ofi-rccl",
    "/opt/aws-ofi-rccl/lib",
    "/opt/aws-ofi-rccl/lib64",
)
#: Where the image families keep it: looked at when the profile's directories
#: have none, to say which family the base is.
KNOWN_PLUGIN_DIRS = AWS_OFI_RCCL_DIRS + (
    "/opt/aws-ofi-nccl/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib",
    "/usr/lib64",
)
#: The variable ``conda-python-distributed`` takes its NCCL_NET_GDR_LEVEL
#: default from (empty: set none); the env file sets it from the profile.
GDR_VARIABLE = "COTAINR_LUMI_NCCL_NET_GDR_LEVEL"
#: Where rccl-tests are in the image (for the acceptance job), when known.
RCCL_TESTS_VARIABLE = "COTAINR_LUMI_RCCL_TESTS"
#: Values NCCL/RCCL take for NCCL_NET_GDR_LEVEL (names, or the numbers 0-5).
GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
#: Where the plugin's libfabric comes from.
LIBFABRIC_SOURCES = {
    "host": "the host's Cray libfabric, host-libfabric-binds bound at run time",
    "image": "the image's own libfabric with CXI, no host /opt/cray or libcxi",
    "auto": "image when the plugin's libfabric.so.1 is in the image, else host",
}


def check_gdr_level(value):
    """Check an ``NCCL_NET_GDR_LEVEL`` value."""
    if isinstance(value, bool) or str(value) not in GDR_LEVELS + tuple("012345"):
        raise ValueError(
            f"must be one of {', '.join(GDR_LEVELS)} or a number 0-5, or null to "
            f"leave it to RCCL (got {value!r})"
        )


def check_libfabric(value):
    """Check the ``libfabric`` setting."""
    if value not in LIBFABRIC_SOURCES:
        each = " or ".join(f"{k!r} ({v})" for k, v in LIBFABRIC_SOURCES.items())
        raise ValueError(f"must be {each} (got {value!r})")


def decide_libfabric(*, settings, root, image_ld_path=str):
    """The setting, or for auto: image if the plugin finds libfabric in it, else host."""
    if settings.libfabric != "auto":
        return settings.libfabric
    plugin = _profile_plugin(settings=settings, root=root)
    for name in plugin["files"] if plugin else ():
        path = f"{plugin['dir']}/{name}"
        info = read_elf_info(path=resolve_in_root(root=root, path=path))
        if info is None or LIBFABRIC not in info.needed:
            continue
        ld_path = (image_ld_path() or "").split(":")
        found = ImageFiles(root).needed(LIBFABRIC, info, plugin["dir"], ld_path)
        where = f"the image's {found}" if found else "not in the image"
        logger.info("%s needs %s: %s", path, LIBFABRIC, where)
        return "image" if found else "host"
    return "host"


def _plugin_files(host_dir):
    """{plugin file name: link target or None} in a sandbox directory."""
    paths = [p for pattern in rcclplugin.PATTERNS for p in host_dir.glob(pattern)]
    return {
        p.name: str(p.readlink()) if p.is_symlink() else None for p in sorted(paths)
    }


def find_plugin(*, root, dirs, named=None):
    """The network plugin RCCL would load from the profile's directories."""
    candidates = {}
    for directory in dirs:
        files = _plugin_files(resolve_in_root(root=root, path=directory))
        if files:
            candidates.setdefault(directory, files)
    if not candidates:
        return None
    # In RCCL's order: each name it tries, in every directory.
    loads = rcclplugin.resolve(
        named=named, files=candidates, search_dirs=list(candidates)
    )
    if loads is not None:
        return _plugin(loads["dir"], loads["generation"], candidates, value=None)
    for directory, files in candidates.items():
        value = None if named else rcclplugin.default_name(files)
        if value is not None:
            name = f"{rcclplugin.PREFIX}-{value}.so"
            generation = rcclplugin.generation(name, target=files[name])
            return _plugin(directory, generation, candidates, value=value)
    directory, files = next(iter(candidates.items()))
    generation = rcclplugin.generation(next(iter(files)))
    return _plugin(directory, generation, candidates, value=None, loads=False)


def _plugin(directory, generation, candidates, *, value, loads=True):
    return {
        "generation": generation,
        "dir": directory,
        "files": list(candidates[directory]),
        "loads": loads,
        "nccl-net-plugin": value,
    }


def plugin_name_blocks(*, plugin):
    """Env file blocks for the plugin's name: ``NCCL_NET_PLUGIN`` when needed."""
    value = plugin["nccl-net-plugin"]
    directory = plugin["dir"]
    if not plugin["loads"]:
        files = {directory: dict.fromkeys(plugin["files"])}
        advice = rcclplugin.advice(named=None, files=files, search_dirs=[directory])
        logger.warning(
            "RCCL will load no network plugin from %s: %s.", directory, advice
        )
        return []
    if value is None:
        return []
    logger.info(
        "RCCL loads %s only when named: NCCL_NET_PLUGIN=%s is set in the image "
        "(a value you set at run time wins).",
        f"{directory}/{rcclplugin.PREFIX}-{value}.so",
        value,
    )
    return [
        "# RCCL loads this image's network plugin only when named "
        "(engine/rcclplugin.py).\n" + default_assignments({"NCCL_NET_PLUGIN": value})
    ]


def plugin_blocks(*, settings, root, found):
    """Env file blocks for the plugin: its directory, its name; `found` gets it."""
    plugin = _profile_plugin(settings=settings, root=root)
    if plugin is None:
        other = find_plugin(root=root, dirs=KNOWN_PLUGIN_DIRS)
        if other is not None:
            fits = (
                "lumi-g-ext-rocm-6.2 or lumi-g-ext-pytorch"
                if other["dir"] in AWS_OFI_RCCL_DIRS
                else "lumi-aif-torch or lumi-aif-full"
            )
            logger.warning(
                "The system may not fit this base image: the profile looks for "
                "RCCL's network plugin in %s, but the image has %s in %s: build "
                "with --system=%s (or set lumi-env.net-plugin-dirs, libfabric and "
                "binds), else the image gets another family's runtime settings.",
                ", ".join(settings.net_plugin_dirs) or "no directory",
                *(other["generation"], other["dir"], fits),
            )
        return []
    found[plugin["generation"]] = plugin["dir"]
    blocks = []
    if plugin["dir"].rstrip("/") not in DEFAULT_LOADER_DIRS:
        blocks.append(path_addition(name="LD_LIBRARY_PATH", entries=[plugin["dir"]]))
    return blocks + plugin_name_blocks(plugin=plugin)


def _profile_plugin(*, settings, root):
    """RCCL's network plugin in the profile's directories (None: none)."""
    named = settings.env.get("NCCL_NET_PLUGIN")
    return find_plugin(root=root, dirs=settings.net_plugin_dirs, named=named)


#: The host family's libfabric when the image's LD_LIBRARY_PATH names none
#: that is there (LUMI's January 2026 update replaced libfabric 1.15.2.0, which
#: the 2024 images name): the newest installed, /opt/cray being the host's.
HOST_LIBFABRIC = """\
if ! (IFS=:; for d in ${LD_LIBRARY_PATH-}; do [ -e "$d/libfabric.so.1" ] && exit 0; done; exit 1); then
    _cl_new=$(ls -d DIRS 2>/dev/null | sort -V | tail -n 1)
    _cl_new=${_cl_new%/libfabric.so.1}
    [ -n "$_cl_new" ] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$_cl_new && export LD_LIBRARY_PATH
    unset _cl_new
fi"""


def env_blocks(*, settings, libfabric, cray="/opt/cray"):
    """Env file blocks: the host's libfabric, the runscript's GDR default, rccl-tests."""
    gdr = settings.nccl_net_gdr_level
    dirs = shlex.quote(cray) + "/libfabric/*/lib64/libfabric.so.1"
    blocks = [HOST_LIBFABRIC.replace("DIRS", dirs)] * (libfabric == "host")
    blocks += [
        "# NCCL_NET_GDR_LEVEL for conda-python-distributed when you set none "
        "(empty: leave it to RCCL).\n"
        + default_assignments({GDR_VARIABLE: "" if gdr is None else str(gdr)})
    ]
    if settings.rccl_tests:
        blocks.append(default_assignments({RCCL_TESTS_VARIABLE: settings.rccl_tests}))
    return blocks


def write_runtime_record(*, settings, root, binds, libfabric):
    """Record the network layer for verify; return the record."""
    tests = settings.rccl_tests
    found = bool(tests and resolve_in_root(root=root, path=tests).is_dir())
    if tests and not found:
        logger.warning(
            "The profile says rccl-tests are in %s, but the image has no such "
            "directory.",
            tests,
        )
    gdr = settings.nccl_net_gdr_level
    record = {
        "libfabric": libfabric,
        "net-plugin-dirs": list(settings.net_plugin_dirs),
        "net-plugin": _profile_plugin(settings=settings, root=root),
        "nccl-net-gdr-level": None if gdr is None else str(gdr),
        "rccl-tests": tests,
        "rccl-tests-found": found,
        "binds": list(binds),
    }
    write_file_in_root(
        root=root,
        path=imagelayout.RUNTIME_FILE,
        content=json.dumps(record, indent=2, sort_keys=True) + "\n",
    )
    return record


def describe_lines(*, settings):
    """What the plan says about the network layer."""
    gdr = settings.nccl_net_gdr_level
    lines = [
        "RCCL network plugin (librccl-net.so, librccl-net-NAME.so) looked for in "
        + ", ".join(settings.net_plugin_dirs or ["(nowhere)"])
        + "; added to LD_LIBRARY_PATH unless the loader searches it anyway",
        f"libfabric: {LIBFABRIC_SOURCES[settings.libfabric]}",
        "conda-python-distributed: "
        + (
            f"NCCL_NET_GDR_LEVEL={shlex.quote(str(gdr))} unless you set it"
            if gdr is not None
            else "leaves NCCL_NET_GDR_LEVEL to RCCL unless you set it"
        ),
    ]
    if settings.rccl_tests:
        lines.append(
            f"rccl-tests: {settings.rccl_tests} (${RCCL_TESTS_VARIABLE} in the image)"
        )
    return lines
