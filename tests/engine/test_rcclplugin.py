"""Which network plugin RCCL loads (engine/rcclplugin.py), as plugin_open.cc decides."""

import pytest

from cotainr_lumi.engine import rcclplugin

LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.mark.parametrize(
    "named, names",
    [
        (None, ["librccl-net.so"]),
        ("", ["librccl-net.so"]),
        ("ofi", ["ofi", "librccl-net-ofi.so"]),
        # A lib*.so name or a path is taken as it is.
        ("libnccl-net.so", ["libnccl-net.so"]),
        ("/opt/p/librccl-net.so", ["/opt/p/librccl-net.so"]),
        # Neither: tried as it is, then with RCCL's prefix.
        ("libfoo", ["libfoo", "librccl-net-libfoo.so"]),
        ("foo.so", ["foo.so", "librccl-net-foo.so.so"]),
    ],
)
def test_load_names_follow_rccls_plugin_loader(named, names):
    assert rcclplugin.load_names(named) == names


@pytest.mark.parametrize(
    "name, target, generation",
    [
        ("librccl-net.so", None, "aws-ofi-rccl"),
        ("librccl-net.so.0.0.0", None, "aws-ofi-rccl"),
        ("librccl-net-ofi.so", None, "aws-ofi-nccl"),
        ("librccl-net.so", "librccl-net-ofi.so", "aws-ofi-nccl"),
        ("libnccl-net.so", None, "nccl"),
        ("libnccl-net-ofi.so", None, "nccl"),
        ("librccl-net-cxi.so", None, "rccl-plugin"),
    ],
)
def test_generation_by_file_name(name, target, generation):
    assert rcclplugin.generation(name, target=target) == generation


def test_resolve_searches_the_directories_in_order():
    files = {
        "/first": {"librccl-net.so": None},
        "/second": {"librccl-net.so": None},
    }
    found = rcclplugin.resolve(
        named=None, files=files, search_dirs=["/second", "/first"]
    )
    assert found == {
        "path": "/second/librccl-net.so",
        "dir": "/second",
        "name": "librccl-net.so",
        "generation": "aws-ofi-rccl",
    }
    # A directory dlopen does not search loads nothing.
    assert rcclplugin.resolve(named=None, files=files, search_dirs=["/third"]) is None


def test_resolve_a_named_path_needs_that_file():
    files = {"/opt/p": {"librccl-net-ofi.so": None}}
    named = "/opt/p/librccl-net-ofi.so"
    assert rcclplugin.resolve(named=named, files=files, search_dirs=[])["path"] == named
    assert (
        rcclplugin.resolve(named="/opt/p/other.so", files=files, search_dirs=[]) is None
    )


@pytest.mark.parametrize(
    "names, value",
    [
        (["librccl-net.so", "librccl-net-ofi.so"], None),
        (["librccl-net-ofi.so", "libnccl-net.so"], "ofi"),
        (["librccl-net-cxi.so", "librccl-net-ofi.so"], "ofi"),
        (["librccl-net-cxi.so"], "cxi"),
        (["libnccl-net.so", "librccl-net-ofi.so.1"], None),
        ([], None),
    ],
)
def test_default_name(names, value):
    assert rcclplugin.default_name(names) == value


def test_advice_names_the_fix():
    ofi = {LIB: {"librccl-net-ofi.so": None}}
    assert "loads with NCCL_NET_PLUGIN=ofi" in rcclplugin.advice(
        named=None, files=ofi, search_dirs=[LIB]
    )
    assert "is not on LD_LIBRARY_PATH" in rcclplugin.advice(
        named=None, files={"/opt/x": {"librccl-net.so": None}}, search_dirs=[LIB]
    )
    nccl = rcclplugin.advice(
        named=None, files={LIB: {"libnccl-net.so": None}}, search_dirs=[LIB]
    )
    assert "never NCCL's names" in nccl and "--with-rocm" in nccl
    assert rcclplugin.advice(named="x", files={}, search_dirs=[LIB]) == (
        "RCCL tries x then librccl-net-x.so; the image has no RCCL network plugin"
    )
