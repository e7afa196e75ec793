import copy
import hashlib
import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
from verifyprobe import run_probe

from cotainr_lumi.errors import InputError
from cotainr_lumi.verify import checks as verify
from cotainr_lumi.verify import netplugin
from cotainr_lumi.verify.expectedenv import expected_env

PROBE = Path(verify.__file__).with_name("probe.py")

GOOD = {
    "python": "/opt/env/bin/python",
    "prefix": "/opt/env",
    "target_env": {
        "prefix": "/opt/env",
        "python": "/opt/env/bin/python",
        "reason": "x",
    },
    "env": {
        "ROCM_PATH": "/opt/rocm",
        "PATH": "/runscripts:/opt/rocm/bin:/opt/rocm/llvm/bin:/usr/bin",
        "LD_LIBRARY_PATH": (
            "/opt/cray/libfabric/1.15.2.0/lib64:/opt/cray/pe/lib64:"
            "/opt/rocm/lib:/opt/aws-ofi-rccl"
        ),
        "WITH_CONDA": "true",
        **expected_env(system_name=None),
    },
    "labels": {
        "cotainr-lumi.version": "1",
        "cotainr-lumi.system": "not-a-profile-system",
        "cotainr-lumi.base-image": "/b.sif",
        "cotainr-lumi.base-image.resolved": "/real/b.sif",
        "cotainr-lumi.stages": "pip,prune,lumi-env,provenance",
        "cotainr-lumi.pip.packages": "/opt/cotainr-lumi/pip/packages.json",
    },
    "rocm": {
        "path": "/opt/rocm",
        "exists": True,
        "opt_rocm": {
            "name": "rocm",
            "link": "rocm-6.1.3",
            "kind": "dir",
            "target": "/opt/rocm-6.1.3",
        },
        "realpath": "/opt/rocm-6.1.3",
        "version_file": "6.1.3-122",
        "lib_names": ["librccl.so.1", "librocblas.so.4", "rocblas"],
    },
    "network": {
        "runtime": None,
        "searched": ["/opt/aws-ofi-rccl", "/usr/lib64"],
        "conf_dirs": [],
        "named": None,
        "plugin_files": {"/opt/aws-ofi-rccl": {"librccl-net.so": None}},
        "ldd": {
            "/opt/aws-ofi-rccl/librccl-net.so": {
                "rc": 0,
                "deps": {"libc.so.6": "/lib64/libc.so.6", "libfabric.so.1": None},
                "err": "",
            },
        },
        "image_libfabric": [],
        "rccl_tests": {"dir": "/opt/rccltests", "all_reduce_perf": True},
        "rccl_tests_dirs": ["/opt/rccltests", "/usr/libexec/rccl-tests"],
    },
    "env_libstdcxx": [],
    "files": {
        "/opt/cotainr-lumi/pip/packages.json": 120,
        "/opt/cotainr-lumi/prune-manifest.json": 50,
        "/opt/cotainr-lumi/provenance.json": 10,
    },
    "prune_manifest": {"entries": []},
    "torch": {
        "dir": "/opt/env/lib/python3.11/site-packages/torch",
        "hip": "6.1.40091",
        "lib": [
            {
                "name": "librccl.so.1",
                "link": "../../../../../../rocm-6.1.3/lib/librccl.so.1",
                "kind": "file",
                "target": "/opt/rocm-6.1.3/lib/librccl.so.1",
            },
            {"name": "libtorch_hip.so", "link": None, "kind": "file"},
        ],
        "rccl_realpath": "/opt/rocm-6.1.3/lib/librccl.so.1",
        "ldd_torch_hip": {
            "rc": 0,
            "deps": {"librccl.so.1": "/opt/rocm-6.1.3/lib/librccl.so.1"},
            "err": "",
        },
    },
    "runscripts": {
        "conda-python-simple": {"exists": True, "executable": True},
        "conda-python-distributed": {"exists": True, "executable": True},
        "get-master": {
            "exists": True,
            "executable": True,
            "run": {"rc": 0, "out": "nid005252\n", "err": ""},
        },
    },
    "runscripts_on_path": True,
    "with_conda": {"rc": 0, "out": "/opt/env\n", "err": ""},
}

# The first bytes of a real SIF file (launch line, then the magic).
SIF_HEADER = b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC\x0001\x00rest"


def run_with(mocker, tmp_path, facts):
    image = tmp_path / "x.sif"
    image.write_bytes(SIF_HEADER)
    mocker.patch(
        "cotainr_lumi.apptainer.exec_in_image",
        return_value=subprocess.CompletedProcess(
            [], 0, stdout="noise\n" + json.dumps(facts) + "\n", stderr=""
        ),
    )
    return verify.verify_image(image=image)


def test_good_image_passes_everything_checkable(mocker, tmp_path):
    report = run_with(mocker, tmp_path, GOOD)
    assert report.failed == []
    assert {r.check for r in report.results if r.status == "N/A"} == {
        "rccl-bandwidth",
        "rccl-net-plugin",
        "gpus-visible",
    }
    assert "3 N/A" in report.summary() and "0 FAIL" in report.summary()
    assert all("run:" in r.evidence for r in report.results if r.status == "N/A")


def mutate(path, value):
    facts = copy.deepcopy(GOOD)
    target = facts
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return facts


@pytest.mark.parametrize(
    "path, value, failing",
    [
        (("env_libstdcxx",), ["/opt/env/lib/libstdc++.so.6"], {"env-libstdcxx"}),
        (
            ("torch", "lib"),
            [{"name": "librccl.so.1", "link": None, "kind": "file"}],
            {"torch-rocm-duplicates"},
        ),
        (
            ("torch", "rccl_realpath"),
            "/opt/env/lib/python3.11/site-packages/torch/lib/librccl.so.1",
            {"torch-rccl"},
        ),
        (("env", "CXI_FORK_SAFE"), None, {"env:CXI_FORK_SAFE"}),
        (
            ("env", "LD_LIBRARY_PATH"),
            "/opt/cray/libfabric/1.22.0/lib64:/opt/rocm/lib",
            {"net-plugin"},
        ),
        (
            ("env", "LD_LIBRARY_PATH"),
            "/opt/rocm/lib:/opt/aws-ofi-rccl",
            {"cray-libfabric"},
        ),
        (("network", "plugin_files"), {}, {"net-plugin"}),
        (
            (
                "network",
                "ldd",
                "/opt/aws-ofi-rccl/librccl-net.so",
                "deps",
                "libcuda.so.1",
            ),
            None,
            {"net-plugin-deps"},
        ),
        (("network", "rccl_tests", "all_reduce_perf"), False, {"rccl-tests"}),
        (("runscripts", "get-master", "executable"), False, {"runscripts"}),
        (("with_conda",), None, {"with-conda"}),
        (("labels", "cotainr-lumi.stages"), "", {"provenance-labels"}),
        (("files", "/opt/cotainr-lumi/pip/packages.json"), None, {"package-list"}),
    ],
)
def test_broken_images_fail_exactly_the_expected_rows(
    mocker, tmp_path, path, value, failing
):
    report = run_with(mocker, tmp_path, mutate(path, value))
    assert set(report.failed) == failing


def test_cray_libfabric_row_names_the_entry_or_the_way_out(mocker, tmp_path):
    report = run_with(mocker, tmp_path, GOOD)
    row = next(r for r in report.results if r.check == "cray-libfabric")
    assert row.status == "PASS"
    assert "/opt/cray/libfabric/1.15.2.0/lib64" in row.evidence
    facts = mutate(("env", "LD_LIBRARY_PATH"), "/opt/rocm/lib:/opt/aws-ofi-rccl")
    row = next(
        r
        for r in run_with(mocker, tmp_path, facts).results
        if r.check == "cray-libfabric"
    )
    assert "falls back to TCP" in row.evidence and "ld-library-path" in row.evidence
    no_plugin = run_with(mocker, tmp_path, mutate(("network", "plugin_files"), {}))
    assert no_plugin.status_of("cray-libfabric") == "N/A"


def test_libstdcxx_kept_with_reason_passes(mocker, tmp_path):
    facts = mutate(("env_libstdcxx",), ["/opt/env/lib/libstdc++.so.6"])
    facts["prune_manifest"] = {
        "entries": [],
        "skipped": [
            {
                "group": "libstdcxx",
                "what": "/opt/env/lib",
                "reason": "kept on request (libstdcxx: false)",
            }
        ],
    }
    report = run_with(mocker, tmp_path, facts)
    assert report.status_of("env-libstdcxx") == "PASS"


def test_cpu_torch_and_no_torch_are_not_applicable(mocker, tmp_path):
    assert (
        run_with(mocker, tmp_path, mutate(("torch", "hip"), None)).status_of(
            "torch-rccl"
        )
        == "N/A"
    )
    assert (
        run_with(mocker, tmp_path, mutate(("torch",), None)).status_of(
            "torch-rocm-duplicates"
        )
        == "N/A"
    )


def test_json_output(mocker, tmp_path):
    data = json.loads(
        run_with(
            mocker, tmp_path, mutate(("env", "PYTORCH_ROCM_ARCH"), "gfx942")
        ).as_json()
    )
    assert data["failed"] == ["env:PYTORCH_ROCM_ARCH"]
    assert any(
        r["check"] == "env:PYTORCH_ROCM_ARCH" and "gfx942" in r["evidence"]
        for r in data["results"]
    )


@pytest.mark.parametrize("kind", ["dir", "text", "empty"])
def test_not_an_image_is_said_before_apptainer_is_looked_for(tmp_path, mocker, kind):
    image = tmp_path / "x.sif"
    if kind == "dir":
        image.mkdir()
    else:
        image.write_bytes(b"hello\n" if kind == "text" else b"")
    runner = mocker.patch("cotainr_lumi.apptainer.exec_in_image")
    with pytest.raises(InputError, match="is not an image"):
        verify.verify_image(image=image)
    runner.assert_not_called()


def test_missing_image_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        verify.verify_image(image=tmp_path / "nope.sif")


def test_probe_runs_with_a_real_python_and_prints_facts():
    site_value = "a'b\nline2 $(x)"
    source = PROBE.read_text()
    inputs = json.dumps(verify.probe_inputs())
    out = subprocess.run(
        [sys.executable, "-c", source, source, inputs],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SITE_ADDED_VARIABLE": site_value},
    )
    facts = json.loads(out.stdout)
    assert facts["prefix"] == sys.prefix
    # Every variable, not a fixed list: profiles add their own.
    assert facts["env"]["SITE_ADDED_VARIABLE"] == site_value
    assert set(facts) >= {
        "env",
        "labels",
        "rocm",
        "torch",
        "runscripts",
        "env_libstdcxx",
    }


def test_probe_reads_the_paths_it_is_given_and_keeps_them_when_it_reexecs(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    target = tmp_path / "target-env.json"
    target.write_text(json.dumps({"prefix": str(venv), "python": f"{venv}/bin/python"}))
    labels = tmp_path / "labels.json"
    labels.write_text('{"cotainr-lumi.system": "s"}')
    record = tmp_path / "record.json"
    record.write_text("12345")
    inputs = {
        **verify.probe_inputs(),
        "target_env_file": str(target),
        "labels_file": str(labels),
        "records": {str(record): None, str(tmp_path / "absent.json"): "object"},
    }
    source = PROBE.read_text()
    env = {k: v for k, v in os.environ.items() if k != "COTAINR_LUMI_VERIFY_REEXEC"}
    out = subprocess.run(
        [sys.executable, "-c", source, source, json.dumps(inputs)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    facts = json.loads(out.stdout)
    assert facts["prefix"] == str(venv)  # run again by the target env's python
    assert facts["labels"] == {"cotainr-lumi.system": "s"}
    assert facts["files"] == {str(record): 5, str(tmp_path / "absent.json"): None}


# -- Today's LUMI images: both plugin generations, the image's libfabric,
# -- the ROCm window (issue 19) ----------------------------------------------

MULTIARCH = "/usr/lib/x86_64-linux-gnu"


def aif_facts():
    """What the probe sees in a LUMI AI Factory image built by cotainr-lumi."""
    facts = copy.deepcopy(GOOD)
    facts["env"]["LD_LIBRARY_PATH"] = "/opt/rocm/lib"
    facts["rocm"]["version_file"] = "7.0.2-56"
    facts["rocm"]["realpath"] = "/opt/rocm-7.0.2"
    facts["torch"]["hip"] = "7.0.51831"
    facts["torch"]["version"] = "2.10.0+rocm7.0"
    facts["torch"]["rccl_realpath"] = "/opt/rocm-7.0.2/lib/librccl.so.1"
    facts["torch"]["lib"][0]["target"] = "/opt/rocm-7.0.2/lib/librccl.so.1"
    facts["labels"]["cotainr-lumi.system"] = "lumi-aif-torch"
    facts["labels"]["cotainr-lumi.rocm.supported"] = "6.1-7.0"
    facts["env"]["NCCL_NET_PLUGIN"] = "ofi"
    facts["network"] = {
        "runtime": {"libfabric": "image", "net-plugin-dirs": [MULTIARCH]},
        "searched": [MULTIARCH],
        "conf_dirs": ["/opt/rocm/lib"],
        "named": "ofi",
        # aws-ofi-nccl's ROCm build, and NCCL's name as a decoy RCCL never loads.
        "plugin_files": {
            MULTIARCH: {"libnccl-net.so": None, "librccl-net-ofi.so": None}
        },
        "ldd": {
            f"{MULTIARCH}/librccl-net-ofi.so": {
                "rc": 0,
                "deps": {
                    "libfabric.so.1": f"{MULTIARCH}/libfabric.so.1",
                    "libcxi.so.1": f"{MULTIARCH}/libcxi.so.1",
                },
                "err": "",
            },
        },
        "image_libfabric": [f"{MULTIARCH}/libfabric.so.1.26.0"],
        "rccl_tests": {"dir": "/usr/libexec/rccl-tests", "all_reduce_perf": True},
        "rccl_tests_dirs": ["/usr/libexec/rccl-tests"],
    }
    return facts


def test_a_correct_ai_factory_image_has_no_fail(mocker, tmp_path):
    expected = {"FI_MR_CACHE_MONITOR": "userfaultfd"}
    facts = aif_facts()
    facts["env"].update(expected)
    image = tmp_path / "x.sif"
    image.write_bytes(SIF_HEADER)
    mocker.patch(
        "cotainr_lumi.apptainer.exec_in_image",
        return_value=subprocess.CompletedProcess(
            [], 0, stdout=json.dumps(facts) + "\n", stderr=""
        ),
    )
    report = verify.verify_image(image=image)
    assert report.failed == []
    rows = {r.check: r for r in report.results}
    assert rows["net-plugin"].evidence.startswith(
        f"aws-ofi-nccl: {MULTIARCH}/librccl-net-ofi.so (on the loader's path, "
        "named by NCCL_NET_PLUGIN=ofi)"
    )
    assert (
        rows["net-plugin-deps"].evidence
        == "all 2 libraries of librccl-net-ofi.so resolve"
    )
    assert rows["image-libfabric"].status == "PASS"
    assert "cray-libfabric" not in rows
    assert rows["rccl-tests"].status == "PASS"
    assert rows["rocm-driver"].status == "PASS"
    assert "base ROCm 7.0.2-56, torch for ROCm 7.0" in rows["rocm-driver"].evidence


@pytest.mark.parametrize(
    "path, value, failing",
    [
        # The host's Cray libfabric must not shadow the image's.
        (
            ("env", "LD_LIBRARY_PATH"),
            "/opt/cray/libfabric/1.15.2.0/lib64:/opt/rocm/lib",
            {"image-libfabric"},
        ),
        # Every library of the plugin must resolve in the image.
        (
            (
                "network",
                "ldd",
                f"{MULTIARCH}/librccl-net-ofi.so",
                "deps",
                "libfabric.so.1",
            ),
            None,
            {"net-plugin-deps"},
        ),
        (("network", "plugin_files"), {}, {"net-plugin"}),
        (("network", "image_libfabric"), [], set()),
    ],
)
def test_ai_factory_images_fail_the_network_rows(
    mocker, tmp_path, path, value, failing
):
    facts = aif_facts()
    target = facts
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    report = run_with(mocker, tmp_path, facts)
    assert set(report.failed) == failing


def test_an_image_without_the_record_uses_its_own_libfabric_when_it_has_one(
    mocker, tmp_path
):
    # A LUMI AI Factory image as shipped: no runtime.json, libfabric inside.
    facts = aif_facts()
    facts["network"]["runtime"] = None
    rows = {r.check: r.status for r in run_with(mocker, tmp_path, facts).results}
    assert rows["image-libfabric"] == "PASS" and "cray-libfabric" not in rows
    # A 2024 image: Cray's libfabric on LD_LIBRARY_PATH, none of its own.
    rows = {r.check: r.status for r in run_with(mocker, tmp_path, GOOD).results}
    assert rows["cray-libfabric"] == "PASS" and "image-libfabric" not in rows


def _net_plugin_row(report):
    return next(r for r in report.results if r.check == "net-plugin")


def test_the_plugin_rccl_loads_only_when_named(mocker, tmp_path):
    # Without NCCL_NET_PLUGIN RCCL tries librccl-net.so only; the row says so.
    facts = aif_facts()
    facts["network"]["named"] = None
    del facts["env"]["NCCL_NET_PLUGIN"]
    row = _net_plugin_row(run_with(mocker, tmp_path, facts))
    assert row.status == "FAIL"
    assert "RCCL tries librccl-net.so;" in row.evidence
    assert "which RCCL loads with NCCL_NET_PLUGIN=ofi" in row.evidence
    # A librccl-net.so link to it is loaded by default.
    facts["network"]["plugin_files"][MULTIARCH]["librccl-net.so"] = "librccl-net-ofi.so"
    facts["network"]["ldd"][f"{MULTIARCH}/librccl-net.so"] = facts["network"]["ldd"][
        f"{MULTIARCH}/librccl-net-ofi.so"
    ]
    row = _net_plugin_row(run_with(mocker, tmp_path, facts))
    assert row.status == "PASS"
    assert row.evidence.startswith(f"aws-ofi-nccl: {MULTIARCH}/librccl-net.so")


def test_nccls_plugin_name_is_never_taken_for_rccls(mocker, tmp_path):
    facts = aif_facts()
    facts["network"]["plugin_files"][MULTIARCH] = {"libnccl-net.so": None}
    row = _net_plugin_row(run_with(mocker, tmp_path, facts))
    assert row.status == "FAIL"
    assert f"never NCCL's names: {MULTIARCH}/libnccl-net.so" in row.evidence
    assert "--with-rocm (librccl-net-ofi.so)" in row.evidence


def test_a_name_that_loads_nothing_fails(mocker, tmp_path):
    facts = aif_facts()
    facts["network"]["named"] = facts["env"]["NCCL_NET_PLUGIN"] = "cxi"
    row = _net_plugin_row(run_with(mocker, tmp_path, facts))
    assert row.status == "FAIL"
    assert "RCCL tries cxi then librccl-net-cxi.so" in row.evidence


def test_a_plugin_off_the_loaders_path_fails(mocker, tmp_path):
    facts = mutate(("env", "LD_LIBRARY_PATH"), "/opt/rocm/lib")
    row = _net_plugin_row(run_with(mocker, tmp_path, facts))
    assert row.status == "FAIL"
    assert "the plugin in /opt/aws-ofi-rccl is not on LD_LIBRARY_PATH" in row.evidence


def test_a_rocm_outside_the_driver_window_warns_or_fails_when_strict(mocker, tmp_path):
    facts = aif_facts()
    facts["rocm"]["version_file"] = "6.0.3-39"
    report = run_with(mocker, tmp_path, facts)
    assert report.status_of("rocm-driver") == "WARN" and report.failed == []
    assert report.summary().endswith("1 WARN")
    evidence = next(r.evidence for r in report.results if r.check == "rocm-driver")
    assert "ROCm 6.0.3-39 is outside" in evidence and "Update-202601" in evidence
    assert "but the base image has ROCm 6.0.3-39" in evidence
    image = tmp_path / "x.sif"
    assert verify.verify_image(image=image, strict=True).failed == ["rocm-driver"]


def test_probe_finds_the_plugin_and_rccl_tests_it_is_told_about(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("librccl-net-ofi.so", "libnccl-net.so"):  # the second: a decoy
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(lib / name), "-x", "c", "-"],
            input="#include <string.h>\nint net_stub(const char *s) { return strlen(s); }\n",
            text=True,
            check=True,
        )
    tests = tmp_path / "rccl-tests"
    tests.mkdir()
    (tests / "all_reduce_perf").write_text("#!/bin/sh\n")
    (tests / "all_reduce_perf").chmod(0o755)
    runtime = tmp_path / "runtime.json"
    runtime.write_text(
        json.dumps(
            {
                "libfabric": "image",
                "net-plugin-dirs": [str(lib)],
                "rccl-tests": str(tests),
            }
        )
    )
    inputs = {**verify.probe_inputs(), "runtime_file": str(runtime)}
    source = PROBE.read_text()
    env = {
        **{k: v for k, v in os.environ.items() if k != "NCCL_NET_PLUGIN"},
        "LD_LIBRARY_PATH": str(lib),
    }
    out = subprocess.run(
        [sys.executable, "-c", source, source, json.dumps(inputs)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    net = json.loads(out.stdout)["network"]
    assert net["plugin_files"][str(lib)] == {
        "libnccl-net.so": None,
        "librccl-net-ofi.so": None,
    }
    assert "libc.so.6" in net["ldd"][str(lib / "librccl-net-ofi.so")]["deps"]
    # A name RCCL never opens (unless NCCL_NET_PLUGIN names it) is not read.
    assert str(lib / "libnccl-net.so") not in net["ldd"]
    assert net["rccl_tests"] == {"dir": str(tests), "all_reduce_perf": True}
    assert net["runtime"]["libfabric"] == "image"
    # RCCL loads nothing without the name, aws-ofi-nccl's ROCm build with it.
    assert netplugin.loaded_plugin(net, env) is None
    plugin = netplugin.loaded_plugin({**net, "named": "ofi"}, env)
    assert plugin["path"] == str(lib / "librccl-net-ofi.so")
    assert plugin["generation"] == "aws-ofi-nccl"
    assert "libc.so.6" in plugin["ldd"]["deps"]


# -- Odd images never end in a traceback (issue 29) ---------------------------


NESTED = "[" * 100000 + "]" * 100000


@pytest.mark.parametrize(
    "files, where, reason",
    [
        ({"labels": "[]"}, "labels", "a JSON array, not an object"),
        (
            {"labels": '{"cotainr-lumi.system": 5, "ok": "x", "n": null}'},
            "labels",
            "labels that are not strings: cotainr-lumi.system, n",
        ),
        ({"manifest": NESTED}, "manifest", "RecursionError"),
        ({"target": NESTED}, "target", "RecursionError"),
        ({"manifest": "[" * 80 + "]" * 80}, "manifest", "nested deeper than 64"),
        ({"packages": '{"a": 1}'}, "packages", "a JSON object, not an array"),
        ({"manifest": '{"a": '}, "manifest", "Expecting value"),
        (
            {"runtime": '{"net-plugin-dirs": [1, 2], "rccl-tests": ["x"]}'},
            "network",
            "TypeError",
        ),
        ({"target": '{"python": ["x"], "prefix": 1}'}, None, None),
    ],
)
def test_malformed_records_are_fail_rows_with_the_reason(
    tmp_path, mocker, files, where, reason
):
    facts, paths = run_probe(tmp_path, **files)
    key = str(paths[where]) if where in paths else where
    assert facts["problems"] == ({key: mocker.ANY} if where else {})
    if where:
        assert reason in facts["problems"][key]
        report = run_with(mocker, tmp_path, {**GOOD, "problems": facts["problems"]})
        assert report.status_of("records") == "FAIL"
        row = next(r for r in report.results if r.check == "records")
        assert reason in row.evidence
    assert isinstance(facts["labels"], dict)
    assert all(isinstance(v, str) for v in facts["labels"].values())


def test_a_large_label_is_read_whole_and_a_huge_one_is_a_fail_row(tmp_path, mocker):
    # A base image's 300 KB label (the probe used to read 200,000 characters).
    labels = {**GOOD["labels"], "org.example.big": "x" * 300_000}
    facts, _ = run_probe(tmp_path, labels=json.dumps(labels))
    assert facts["labels"] == labels and facts["problems"] == {}
    report = run_with(mocker, tmp_path, {**GOOD, "labels": facts["labels"]})
    assert report.status_of("provenance-labels") == "PASS"
    assert report.status_of("records") == "PASS"
    mocker.patch.object(verify, "MAX_RECORD_BYTES", 100_000)
    facts, paths = run_probe(tmp_path, labels=json.dumps(labels))
    assert "larger than 100000 bytes" in facts["problems"][str(paths["labels"])]


@pytest.mark.parametrize(
    "path, value, failing",
    [
        (("labels",), ["a"], {"provenance-labels", "env", "rocm-driver"}),
        (
            ("labels",),
            {"cotainr-lumi.system": 5, "cotainr-lumi.stages": {"a": 1}},
            {"provenance-labels", "package-list"},
        ),
        (("env",), "PATH=/bin", {"rocm-layout", "net-plugin", "env", "runscripts"}),
        (("rocm",), None, {"rocm-layout", "torch-rocm-duplicates"}),
        (("torch", "lib"), "not a list", {"torch-rocm-duplicates"}),
        (("runscripts",), {}, {"runscripts"}),
        (("problems",), ["x"], {"records"}),
        (("network", "runtime"), {"libfabric": ["x"], "net-plugin-dirs": 3}, set()),
        (("prune_manifest",), {"skipped": "x"}, set()),
    ],
)
def test_facts_of_any_shape_give_fail_rows_not_exceptions(
    mocker, tmp_path, path, value, failing
):
    # What a hostile `python` in the image could print as facts.
    report = run_with(mocker, tmp_path, mutate(path, value))
    assert set(report.failed) == failing
    assert all(
        "malformed" in r.evidence or r.check in ("provenance-labels", "package-list")
        for r in report.results
        if r.status == "FAIL"
    )


def test_evidence_is_bounded_and_printable(mocker, tmp_path):
    facts = mutate(("env", "ROCM_PATH"), "/opt/rocm\udcff" + "y" * 100_000)
    report = run_with(mocker, tmp_path, facts)
    text = report.as_text()
    text.encode("utf-8")  # a non-UTF-8 value from the image prints
    assert max(len(r.evidence) for r in report.results) <= verify.MAX_EVIDENCE
    assert "\\udcff" in text


@pytest.mark.parametrize("stdout", ["", "not json\n", "[1, 2]\n", NESTED + "\n"])
def test_a_python_that_prints_no_facts_is_one_input_error(tmp_path, mocker, stdout):
    image = tmp_path / "x.sif"
    image.write_bytes(SIF_HEADER)
    mocker.patch(
        "cotainr_lumi.apptainer.exec_in_image",
        return_value=subprocess.CompletedProcess([], 0, stdout=stdout, stderr=""),
    )
    with pytest.raises(InputError, match="no facts printed"):
        verify.verify_image(image=image)


def test_one_run_in_the_image_with_one_timeout_and_one_message(tmp_path, mocker):
    image = tmp_path / "x.sif"
    image.write_bytes(SIF_HEADER)
    timeouts = []

    def run(*, image, args, timeout, **kwargs):
        timeouts.append(timeout)
        raise subprocess.TimeoutExpired(cmd=["apptainer", *args], timeout=timeout)

    mocker.patch("cotainr_lumi.apptainer.exec_in_image", side_effect=run)
    with pytest.raises(InputError) as info:
        verify.verify_image(image=image, timeout=30)
    message = str(info.value)
    assert "did not finish within 30 s" in message and "--timeout" in message
    assert len(message) < 400 and info.value.__cause__ is None
    assert timeouts == [30]  # the MPI facts come from the same, one run
    mocker.patch(
        "cotainr_lumi.apptainer.exec_in_image",
        side_effect=lambda **kw: (
            timeouts.append(kw["timeout"])
            or subprocess.CompletedProcess([], 0, stdout=json.dumps(GOOD), stderr="")
        ),
    )
    verify.verify_image(image=image, timeout=30)
    assert timeouts == [30, 30]


def test_host_entries_after_the_images_own_libfabric_do_not_shadow_it(mocker, tmp_path):
    # The 2025 AMD PyTorch images: /opt/libfabric/lib first, the removed
    # /opt/cray entries of the 2024 recipe after it (sfantao/LUMI-containers
    # Dockerfile.libfabric L77, Dockerfile.header L35).
    facts = aif_facts()
    plugin = f"{MULTIARCH}/librccl-net-ofi.so"
    facts["network"]["ldd"][plugin]["deps"]["libfabric.so.1"] = (
        "/opt/libfabric/lib/libfabric.so.1"
    )
    facts["env"]["LD_LIBRARY_PATH"] = (
        "/opt/libfabric/lib:/opt/shs-libcxi/lib:/opt/cray/libfabric/1.15.2.0/lib64"
    )
    rows = {r.check: r.status for r in run_with(mocker, tmp_path, facts).results}
    assert rows["image-libfabric"] == "PASS"
    facts["env"]["LD_LIBRARY_PATH"] = "/opt/cray/pe/lib64:/opt/libfabric/lib"
    rows = {r.check: r.status for r in run_with(mocker, tmp_path, facts).results}
    assert rows["image-libfabric"] == "FAIL"


def test_a_layer_only_image_is_verified_on_the_base_its_labels_name(tmp_path, mocker):
    from hosttools import need_tool
    from siffile import PARTITION, SQUASHFS, SYSTEM, write_sif

    need_tool("mksquashfs", install="apt-get install -y squashfs-tools")
    base = tmp_path / "base.sif"
    write_sif(base, [(PARTITION, b"system", SQUASHFS, SYSTEM, "")])
    upper = tmp_path / "upper/.singularity.d"
    upper.mkdir(parents=True)
    labels = {"cotainr-lumi.base-image.resolved": str(base)}
    (upper / "labels.json").write_text(json.dumps(labels) + "  pad")
    layer = tmp_path / "layer.sif"
    subprocess.run(["mksquashfs", upper.parent, layer, "-quiet"], check=True)
    probe = mocker.patch.object(verify, "_probe", side_effect=InputError("stop"))
    with pytest.raises(InputError, match="stop"):
        verify.verify_image(image=layer)
    probe.assert_called_once_with(
        base, timeout=verify.VERIFY_TIMEOUT, overlay=f"{layer}:ro"
    )
    base.unlink()  # moved away: one error that says what a layer needs
    with pytest.raises(InputError, match="nor a layer .* whose base SIF is where"):
        verify.verify_image(image=layer)


def layer_naming(tmp_path, labels, *pseudo):
    """A --layer-only image (squashfs) whose labels.json is `labels` (or `pseudo`)."""
    from hosttools import need_tool

    need_tool("mksquashfs", install="apt-get install -y squashfs-tools")
    upper = tmp_path / "upper/.singularity.d"
    upper.mkdir(parents=True)
    if labels is not None:
        (upper / "labels.json").write_text(json.dumps(labels))
    layer = tmp_path / "layer.sqfs"
    args = [a for p in pseudo for a in ("-p", p)]
    subprocess.run(["mksquashfs", upper.parent, layer, "-quiet", *args], check=True)
    return layer


def test_verify_layer_compares_the_bases_sha256_with_its_label(tmp_path, mocker):
    """A base swapped for another file: FAIL, not the same rows (issue 38, 4)."""
    from siffile import PARTITION, SQUASHFS, SYSTEM, write_sif

    mocker.patch.dict(os.environ, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
    base = tmp_path / "base.sif"
    write_sif(base, [(PARTITION, b"system", SQUASHFS, SYSTEM, "")])
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    labels = {
        "cotainr-lumi.base-image.resolved": str(base),
        "cotainr-lumi.base-image.sha256": digest,
    }
    layer = layer_naming(tmp_path, labels)
    for content, status in ((b"system", "PASS"), (b"others", "FAIL")):
        write_sif(base, [(PARTITION, content, SQUASHFS, SYSTEM, "")])
        report = verify.VerifyReport(image=str(layer))
        verify._check_layer_base(report, *verify._base_of_layer(layer))
        assert report.results[0][:2] == ("layer-base", status), report.results
    assert "not the base this layer was built on" in report.results[0].evidence


@pytest.mark.parametrize("kind", ["fifo", "device", "huge label"])
def test_verify_layer_never_blocks_on_or_reads_whole_what_its_label_names(
    tmp_path, kind
):
    """A FIFO or device named as base, a 400 MB label: one error, at once."""
    base, pseudo = tmp_path / "base.sif", []
    labels = {"cotainr-lumi.base-image.resolved": str(base)}
    if kind == "fifo":
        os.mkfifo(base)
    elif kind == "device":
        labels["cotainr-lumi.base-image.resolved"] = "/dev/zero"
    else:
        labels = None
        big = "head -c 400000000 /dev/zero"
        pseudo = ["/.singularity.d/labels.json f 644 0 0 " + big]
    layer = layer_naming(tmp_path, labels, *pseudo)
    # VmHWM: the peak of this process's own memory (ru_maxrss would include
    # the forking pytest's, which Linux carries over the exec)
    script = (
        "import re, sys; from cotainr_lumi.verify import checks\n"
        "try:\n    checks.verify_image(image=sys.argv[1])\n"
        "except checks.InputError as e:\n    print(e)\n"
        "status = open('/proc/self/status').read()\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, layer],
        capture_output=True,
        text=True,
        timeout=60,
    )
    message, rss_kib = proc.stdout.splitlines()
    assert "is not an image" in message, proc.stderr
    assert int(rss_kib) < 300 * 1024  # not 1.2 GB
