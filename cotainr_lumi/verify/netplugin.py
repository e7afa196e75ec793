"""
The network rows of ``cotainr-lumi verify``.

The plugin RCCL itself would load (:mod:`cotainr_lumi.engine.rcclplugin`),
its libraries, the libfabric it uses (the host's Cray one or the image's own,
as the runtime record or, without one, ``LD_LIBRARY_PATH`` says), rccl-tests.
"""

import os

from ..engine import rcclplugin
from ..engine.elfinfo import DEFAULT_LOADER_DIRS
from .status import FAIL, NA, PASS

#: Libraries the host provides at run time for a plugin using the host's
#: libfabric (``/opt/cray`` and ``/usr/lib64/libcxi.so.1`` are bound).
HOST_PROVIDED = ("libfabric.so", "libcxi.so", "libjansson.so", "libjson-c.so")
#: LD_LIBRARY_PATH entries of the host's Cray libraries.
CRAY_PREFIX = "/opt/cray/"
#: Where the LUMI base images expect the host's Cray libfabric (``/opt/cray``
#: is removed from the images and bound from the host).
CRAY_LIBFABRIC_PREFIX = "/opt/cray/libfabric/"


def path_entries(env, var):
    """The entries of a search path variable (PATH, LD_LIBRARY_PATH) of `env`."""
    return [p for p in (env.get(var) or "").split(":") if p]


def _lookup(net, ld_path):
    """What RCCL looks up; its search_dirs: where ``dlopen`` looks for a bare name."""
    dirs = [*ld_path, *(net.get("conf_dirs") or []), *DEFAULT_LOADER_DIRS]
    return {
        "named": net.get("named"),
        "files": net.get("plugin_files") or {},
        "search_dirs": list(dict.fromkeys(os.path.normpath(d) for d in dirs)),
    }


def loaded_plugin(net, env):
    """The plugin RCCL loads in the image, with its ``ldd``, or None."""
    plugin = rcclplugin.resolve(**_lookup(net, path_entries(env, "LD_LIBRARY_PATH")))
    if plugin is not None:
        plugin["ldd"] = (net.get("ldd") or {}).get(plugin["path"])
    return plugin


def _plugin_row(net, ld_path, plugin):
    """The ``net-plugin`` row: (status, evidence)."""
    if plugin is None:
        why = rcclplugin.advice(**_lookup(net, ld_path))
        searched = ", ".join(net.get("searched") or [])
        return FAIL, (
            f"{why} (looked in {searched}): RCCL falls back to TCP sockets "
            "between nodes"
        )
    where = "the loader's path"
    if plugin["dir"] in map(os.path.normpath, ld_path):
        where = "LD_LIBRARY_PATH"
    if net.get("named"):
        where += f", named by NCCL_NET_PLUGIN={net['named']}"
    return PASS, f"{plugin['generation']}: {plugin['path']} (on {where})"


#: By whose libfabric a plugin uses: the libraries the host provides at run
#: time, and where the others must be.
DEPS_BY_SOURCE = {
    "host": (HOST_PROVIDED, "the image or from the host"),
    "image": ((), "the image"),
}


def _ldd_problem(plugin):
    """Why the probe's ``ldd`` of the plugin tells nothing (None: it tells)."""
    ldd = plugin.get("ldd") or {}
    if not ldd:
        return f"the probe did not read {plugin['path']}'s libraries"
    if not ldd.get("deps") and ldd.get("rc") not in (0, None):
        return f"ldd {plugin['path']} failed: {ldd.get('err')}"
    return None


def _deps_row(plugin, *, source):
    """The ``net-plugin-deps`` row: (status, evidence)."""
    if plugin is None:
        return NA, "no network plugin in the image"
    problem = _ldd_problem(plugin)
    if problem:
        return FAIL, problem
    deps = plugin["ldd"].get("deps") or {}
    provided, where = DEPS_BY_SOURCE[source]
    unresolved = {name for name, path in deps.items() if path is None}
    host = {name for name in unresolved if name.startswith(provided)}
    missing = sorted(unresolved - host)
    if missing:
        return (
            FAIL,
            f"{plugin['path']} needs {', '.join(missing)}, not found in {where}",
        )
    if host:
        return PASS, (
            f"{len(deps) - len(host)} of {len(deps)} resolve in the image; "
            f"{', '.join(sorted(host))} come from the host at run time "
            "(/opt/cray and libcxi bound by the module)"
        )
    name = os.path.basename(plugin["path"])
    return PASS, f"all {len(deps)} libraries of {name} resolve"


def _cray_shadowing(ld_path, libfabric):
    """The host's Cray entries of LD_LIBRARY_PATH before the image's libfabric."""
    own = os.path.dirname(libfabric or "")
    before = ld_path[: ld_path.index(own)] if own in ld_path else ld_path
    return [p for p in before if p.startswith(CRAY_PREFIX)]


def _resolved_libfabric(plugin):
    """Where the plugin's libfabric.so resolves (None: nowhere, or no plugin)."""
    deps = ((plugin or {}).get("ldd") or {}).get("deps") or {}
    return next((p for n, p in deps.items() if n.startswith("libfabric.so")), None)


def _image_libfabric_row(net, plugin, ld_path):
    """The ``image-libfabric`` row: (status, evidence)."""
    resolved = _resolved_libfabric(plugin)
    cray = _cray_shadowing(ld_path, resolved)
    if cray:
        return FAIL, (
            f"LD_LIBRARY_PATH has the host's {cray[0]}: bound at run time it would "
            "shadow the image's own libfabric/CXI; drop it (and the /opt/cray bind)"
        )
    if resolved and resolved.startswith(CRAY_PREFIX):
        return FAIL, f"the plugin resolves libfabric to {resolved}"
    if resolved:
        return PASS, f"the plugin uses the image's {resolved}; no host /opt/cray needed"
    if net.get("image_libfabric"):
        image = net["image_libfabric"][0]
        return PASS, f"the image has {image}; no host /opt/cray needed"
    return FAIL, (
        "the profile says the image brings its libfabric, but there is no "
        "libfabric.so.1 on the loader's path"
    )


def _cray_libfabric_row(plugin, ld_path):
    """The ``cray-libfabric`` row: (status, evidence)."""
    if plugin is None:
        return NA, "no aws-ofi-rccl plugin in the image"
    for entry in ld_path:
        if os.path.normpath(entry).startswith(CRAY_LIBFABRIC_PREFIX):
            return PASS, (
                f"LD_LIBRARY_PATH has {entry} (the host's, bound with /opt/cray at "
                "run time; check the version exists on LUMI: ls /opt/cray/libfabric)"
            )
    return FAIL, (
        f"no {CRAY_LIBFABRIC_PREFIX}<version>/lib64 on LD_LIBRARY_PATH: "
        "aws-ofi-rccl cannot load the host's libfabric and RCCL falls back "
        "to TCP sockets; build on a LUMI ROCm base image (they set it) or "
        "add it with the lumi-env `ld-library-path` setting"
    )


def _rccl_tests_row(net):
    """The ``rccl-tests`` row: (status, evidence)."""
    tests = net.get("rccl_tests")
    if tests is None:
        where = ", ".join(net.get("rccl_tests_dirs") or [])
        return NA, (
            f"no rccl-tests in the image ({where}); the acceptance job "
            "(examples/slurm/acceptance.sbatch) needs all_reduce_perf"
        )
    if tests.get("all_reduce_perf"):
        return PASS, f"{tests['dir']}/all_reduce_perf"
    return FAIL, f"{tests['dir']} has no executable all_reduce_perf"


def check_network(report, facts):
    """Add the network rows."""
    net = facts.get("network") or {}
    ld_path = path_entries(facts["env"], "LD_LIBRARY_PATH")
    runtime = net.get("runtime") or {}  # whose libfabric: the image's record says
    source = runtime.get("libfabric")
    if source not in ("host", "image"):  # the image's own when it has one and no Cray's
        cray = any(p.startswith(CRAY_PREFIX) for p in ld_path)
        source = "image" if net.get("image_libfabric") and not cray else "host"
    plugin = loaded_plugin(net, facts["env"])
    report.add("net-plugin", *_plugin_row(net, ld_path, plugin))
    report.add("net-plugin-deps", *_deps_row(plugin, source=source))
    if source == "host":
        report.add("cray-libfabric", *_cray_libfabric_row(plugin, ld_path))
    else:
        report.add("image-libfabric", *_image_libfabric_row(net, plugin, ld_path))
    report.add("rccl-tests", *_rccl_tests_row(net))
