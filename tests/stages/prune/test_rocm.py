"""Tests of cotainr_lumi.stages.prune.rocm on a fake sandbox root with real ELF files."""

import os
from pathlib import Path
import shutil

import elfbuild
import pytest

from cotainr_lumi.engine.rocmwindow import base_rocm_version, version_py_fields
from cotainr_lumi.engine.rootfs import image_path_of
from cotainr_lumi.stages.prune.rocm import (
    BACKUP_PREFIX,
    apply_actions,
    commit,
    elf_objects_below,
    find_bundle_dirs,
    find_rocm_sdk_packages,
    link_stays_inside,
    major_minor,
    parse_verify_output,
    plan_dedup,
    rocm_dirs_of,
    rollback,
)

SITE = "/opt/cotainr/conda/envs/conda_container_env/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return elfbuild.Kit(tmp_path_factory.mktemp("kit"))


def make_rocm(root, kit, version="6.1.3"):
    lib = root / f"opt/rocm-{version}/lib"
    lib.mkdir(parents=True)
    for real, soname in (
        (kit.hsa, "libhsa-runtime64.so.1"),
        (kit.hip, "libamdhip64.so.6"),
        (kit.rccl, "librccl.so.1"),
    ):
        shutil.copy2(real, lib / real.name)
        (lib / soname).symlink_to(real.name)
    (lib / "rocblas/library").mkdir(parents=True)
    (lib / "rocblas/library/TensileLibrary_gfx90a.dat").write_text("rocm kernels")
    (lib / "README.txt").write_text("rocm readme")
    (root / f"opt/rocm-{version}/.info").mkdir()
    (root / f"opt/rocm-{version}/.info/version").write_text(f"{version}-122\n")
    (root / "opt/rocm").symlink_to(
        f"/opt/rocm-{version}"
    )  # absolute: means the image's
    return lib


@pytest.fixture
def root(tmp_path, kit):
    root = tmp_path / "sandbox"
    make_rocm(root, kit)
    torch = root / SITE.lstrip("/") / "torch"
    lib = torch / "lib"
    lib.mkdir(parents=True)
    shutil.copy2(kit.hip, lib / "libamdhip64.so.6")
    shutil.copy2(kit.rccl, lib / "librccl.so.1")
    shutil.copy2(kit.torch_hsa_other, lib / "libhsa-runtime64.so.1")  # SONAME differs
    shutil.copy2(kit.torch_hip_user, lib / "libtorch_hip.so")
    (lib / "rocblas/library").mkdir(parents=True)
    (lib / "rocblas/library/TensileLibrary_gfx90a.dat").write_text(
        "torch kernels" * 100
    )
    (lib / "README.txt").write_text("torch readme")
    (torch / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.4.1+rocm6.1'\n"
        "cuda: Optional[str] = None\nhip: Optional[str] = '6.1.40091-a8dbc0c19'\n"
    )
    return root


def torch_lib(root):
    return root / SITE.lstrip("/") / "torch/lib"


def test_versions(root, tmp_path):
    assert major_minor(version="6.1.40091-a8dbc0c19") == "6.1"
    assert major_minor(version="6.10.3-122") == "6.10"
    assert major_minor(version=None) is None and major_minor(version="rocm") is None
    assert base_rocm_version(root=root, rocm_path="/opt/rocm") == "6.1.3-122"
    assert base_rocm_version(root=root, rocm_path="/nowhere") is None
    version = image_path_of(root=root, host_path=torch_lib(root).parent / "version.py")
    fields = version_py_fields(root=root, path=str(version))
    assert fields["hip"] == "6.1.40091-a8dbc0c19"


def test_find_bundle_dirs_and_sdk_packages(root):
    rocm_dirs = rocm_dirs_of(root=root, rocm_path="/opt/rocm")
    assert [d.real_image_path for d in rocm_dirs] == ["/opt/rocm-6.1.3/lib"]
    (root / SITE.lstrip("/") / "_rocm_sdk_core/lib").mkdir(parents=True)
    (root / SITE.lstrip("/") / "numpy/lib").mkdir(parents=True)
    bundles = find_bundle_dirs(root=root, site_dirs=[SITE], rocm_dirs=rocm_dirs)
    assert [(b.package, b.image_path) for b in bundles] == [
        ("torch", f"{SITE}/torch/lib")
    ]
    assert bundles[0].overlap == [
        "README.txt",
        "libamdhip64.so.6",
        "libhsa-runtime64.so.1",
        "librccl.so.1",
        "rocblas",
    ]
    assert find_rocm_sdk_packages(root=root, site_dirs=[SITE]) == [
        f"{SITE}/_rocm_sdk_core"
    ]


def plan_for(root):
    rocm_dirs = rocm_dirs_of(root=root, rocm_path="/opt/rocm")
    (bundle,) = find_bundle_dirs(root=root, site_dirs=[SITE], rocm_dirs=rocm_dirs)
    return bundle, plan_dedup(root=root, bundle=bundle, rocm_dirs=rocm_dirs)


def test_plan_apply_commit(root):
    bundle, plan = plan_for(root)
    by_name = {Path(a.image_path).name: a for a in plan.actions}
    assert sorted(by_name) == [
        "README.txt",
        "libamdhip64.so.6",
        "librccl.so.1",
        "rocblas",
    ]
    assert dict(plan.left_alone)[f"{SITE}/torch/lib/libhsa-runtime64.so.1"].startswith(
        "SONAME libhsa-runtime64.so.1.torch differs"
    )
    assert by_name["rocblas"].kind == "dir" and by_name["rocblas"].size == len(
        "torch kernels" * 100
    )
    assert by_name["librccl.so.1"].target == "../" * 9 + "rocm-6.1.3/lib/librccl.so.1"
    assert (
        by_name["librccl.so.1"].reason
        == "same SONAME librccl.so.1 as /opt/rocm-6.1.3/lib/librccl.so.1"
    )
    lib = torch_lib(root)
    original = (lib / "librccl.so.1").read_bytes()
    apply_actions(actions=plan.actions)
    for action in plan.actions:
        assert os.path.islink(action.host_path) and not os.path.isabs(
            os.readlink(action.host_path)
        )
        assert link_stays_inside(root=root, action=action)
    # The kernel follows the relative link to the same file as resolve_in_root does.
    assert (lib / "librccl.so.1").resolve() == (
        root / "opt/rocm-6.1.3/lib/librccl.so.1.0.60103"
    )
    assert (
        lib / "rocblas/library/TensileLibrary_gfx90a.dat"
    ).read_text() == "rocm kernels"
    objects = elf_objects_below(root=root, bundle=bundle, actions=plan.actions)
    assert objects == sorted(
        f"{SITE}/torch/lib/{n}"
        for n in (
            "libamdhip64.so.6",
            "libhsa-runtime64.so.1",
            "librccl.so.1",
            "libtorch_hip.so",
        )
    )
    commit(actions=plan.actions)
    assert not [n for n in os.listdir(lib) if n.startswith(BACKUP_PREFIX)]
    assert (root / "opt/rocm-6.1.3/lib/librccl.so.1.0.60103").read_bytes() == original


def test_rollback_restores_originals(root):
    _bundle, plan = plan_for(root)
    lib = torch_lib(root)
    before = {p.name: (p.is_dir(), p.is_dir() or p.read_bytes()) for p in lib.iterdir()}
    apply_actions(actions=plan.actions)
    rollback(actions=plan.actions)
    after = {p.name: (p.is_dir(), p.is_dir() or p.read_bytes()) for p in lib.iterdir()}
    assert before == after
    assert not any(p.is_symlink() for p in lib.iterdir())
    assert (
        (lib / "rocblas/library/TensileLibrary_gfx90a.dat")
        .read_text()
        .startswith("torch kernels")
    )


def test_hostile_rocm_links_are_resolved_inside_the_root(root, kit, tmp_path):
    """ROCm entries that link to host paths (absolute, ..) are never used or touched."""
    host = tmp_path / "host-rocm"
    host.mkdir()
    shutil.copy2(kit.rccl, host / "librccl.so.1")
    rocm_lib = root / "opt/rocm-6.1.3/lib"
    (rocm_lib / "librccl.so.1").unlink()
    (rocm_lib / "librccl.so.1").symlink_to(host / "librccl.so.1")
    (rocm_lib / "libamdhip64.so.6").unlink()
    (rocm_lib / "libamdhip64.so.6").symlink_to(
        "../" * 15 + str(host / "librccl.so.1").lstrip("/")
    )
    _bundle, plan = plan_for(root)
    names = {Path(a.image_path).name for a in plan.actions}
    assert "librccl.so.1" not in names and "libamdhip64.so.6" not in names
    reasons = dict(plan.left_alone)
    assert "is not an ELF file" in reasons[f"{SITE}/torch/lib/librccl.so.1"]
    apply_actions(actions=plan.actions)
    commit(actions=plan.actions)
    assert (host / "librccl.so.1").read_bytes() == kit.rccl.read_bytes()
    assert (torch_lib(root) / "librccl.so.1").is_file() and not (
        torch_lib(root) / "librccl.so.1"
    ).is_symlink()


def test_hostile_rocm_path_and_symlinked_torch_lib(root, tmp_path):
    # /opt/rocm pointing at a host directory by ../ chain lands inside the root.
    (root / "opt/rocm").unlink()
    (root / "opt/rocm").symlink_to(
        "../../../../../../../../" + str(tmp_path).lstrip("/")
    )
    assert rocm_dirs_of(root=root, rocm_path="/opt/rocm") == []
    assert base_rocm_version(root=root, rocm_path="/opt/rocm") is None
    # A loop.
    (root / "opt/rocm").unlink()
    (root / "opt/rocm").symlink_to("rocm")
    assert rocm_dirs_of(root=root, rocm_path="/opt/rocm") == []
    # A symlinked torch/lib is not a bundle directory (its target is not the package's).
    (root / "opt/rocm").unlink()
    (root / "opt/rocm").symlink_to("rocm-6.1.3")
    lib = torch_lib(root)
    shutil.rmtree(lib)
    lib.symlink_to("/opt/rocm-6.1.3/lib")
    rocm_dirs = rocm_dirs_of(root=root, rocm_path="/opt/rocm")
    assert find_bundle_dirs(root=root, site_dirs=[SITE], rocm_dirs=rocm_dirs) == []


def test_parse_verify_output():
    out = (
        "COTAINR_LUMI_NOTFOUND\t/a/libx.so\t\tlibrccl.so.1 => not found\n"
        "noise\nCOTAINR_LUMI_VERIFY_DONE\n"
    )
    assert parse_verify_output(text=out) == {("/a/libx.so", "librccl.so.1")}
    assert parse_verify_output(text="COTAINR_LUMI_VERIFY_DONE\n") == set()
    with pytest.raises(RuntimeError):
        parse_verify_output(text="")
