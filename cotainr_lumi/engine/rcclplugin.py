"""
Which network plugin RCCL loads, decided as RCCL's own plugin loader does.

RCCL (``src/plugin/plugin_open.cc``) dlopens, without ``NCCL_NET_PLUGIN``,
``librccl-net.so``; with ``NCCL_NET_PLUGIN=NAME``, ``NAME``, then (for a
``NAME`` without ``/`` that is no ``lib*.so`` name) ``librccl-net-NAME.so``;
never ``libnccl-net*.so`` unless named. On LUMI: aws-ofi-rccl is
``librccl-net.so``; aws-ofi-nccl built ``--with-rocm`` (ROCm 7 images) is
``librccl-net-ofi.so`` (``NCCL_NET_PLUGIN=ofi`` or a ``librccl-net.so`` link);
``libnccl-net*.so`` is its CUDA build. Names without ``/`` are looked up in
``LD_LIBRARY_PATH``, then the loader's directories. The functions take what is
there and do no I/O, so the lumi-env stage and ``verify`` decide alike.
"""

import fnmatch
import posixpath

#: RCCL's prefix for its network plugin's file names.
PREFIX = "librccl-net"
#: The name RCCL loads without NCCL_NET_PLUGIN.
DEFAULT = f"{PREFIX}.so"
#: File name patterns of network plugins (RCCL's, then NCCL's).
PATTERNS = (f"{PREFIX}*.so*", "libnccl-net*.so*")


def load_names(named):
    """The names RCCL tries for its network plugin, in order."""
    if not named:
        return [DEFAULT]
    names = [named]
    lib_name = named.startswith("lib") and named.endswith(".so")
    if "/" not in named and not lib_name:
        names.append(f"{PREFIX}-{named}.so")
    return names


def generation(name, *, target=None):
    """The plugin generation a file name belongs to."""
    for candidate in (posixpath.basename(target or ""), name):
        if candidate.startswith(f"{PREFIX}-ofi.so"):
            return "aws-ofi-nccl"
    if name.startswith("libnccl-net"):
        return "nccl"
    if name.startswith(DEFAULT):
        return "aws-ofi-rccl"
    return "rccl-plugin"


def resolve(*, named, files, search_dirs):
    """The plugin file RCCL loads, or None."""
    for name in load_names(named):
        places = [(d, name) for d in search_dirs]
        if "/" in name:
            places = [posixpath.split(posixpath.normpath(name))]
        for directory, base in places:
            if base in files.get(directory, {}):
                return {
                    "path": posixpath.join(directory, base),
                    "dir": directory,
                    "name": base,
                    "generation": generation(base, target=files[directory][base]),
                }
    return None


def default_name(names):
    """The ``NCCL_NET_PLUGIN`` value a directory's plugin needs, if any."""
    if DEFAULT in names:
        return None
    own = sorted(
        n[len(PREFIX) + 1 : -len(".so")]
        for n in names
        if fnmatch.fnmatchcase(n, f"{PREFIX}-?*.so")
    )
    if "ofi" in own:
        return "ofi"
    return own[0] if own else None


def _nccl_plugins(*, files, search_dirs):
    """The NCCL plugins (never loaded by RCCL) on the search path."""
    return [
        posixpath.join(d, n)
        for d in search_dirs
        for n in sorted(files.get(d, {}))
        if generation(n) == "nccl"
    ]


def advice(*, named, files, search_dirs):
    """Why RCCL loads no plugin, and how to fix it."""
    tried = " then ".join(load_names(named))
    for directory in search_dirs:
        value = default_name(files.get(directory, {}))
        if value is not None:
            return (
                f"RCCL tries {tried}; {directory} has {PREFIX}-{value}.so, which "
                f"RCCL loads with NCCL_NET_PLUGIN={value}"
            )
    elsewhere = [d for d in files if files[d] and d not in search_dirs]
    if elsewhere:
        return (
            f"RCCL tries {tried}; the plugin in {elsewhere[0]} is not on "
            "LD_LIBRARY_PATH or the loader's path"
        )
    nccl = _nccl_plugins(files=files, search_dirs=search_dirs)
    if nccl:
        return (
            f"RCCL tries {tried} and never NCCL's names: {nccl[0]} is a plugin "
            "for NCCL (aws-ofi-nccl's CUDA build names itself so); an image for "
            "LUMI needs aws-ofi-nccl built --with-rocm (librccl-net-ofi.so) or "
            "aws-ofi-rccl (librccl-net.so)"
        )
    return f"RCCL tries {tried}; the image has no RCCL network plugin"
