"""The ROCm versions LUMI's driver supports (engine/rocmwindow.py) and the profiles."""

import os

from planfakes import plan_text
import pytest

from cotainr_lumi import buildoptions
from cotainr_lumi.engine import rocmwindow
from cotainr_lumi.engine.rocmwindow import Window, major_minor, problems, torch_rocm
from cotainr_lumi.engine.targetenv import TargetEnv
from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.pipeline import describe
from cotainr_lumi.pipeline.plan import BuildRequest, make_plan
from cotainr_lumi.pipeline.profiles import PACKAGED_PROFILE, load_systems
from tests.hookcontext import hook_context

LUST = "https://lumi-supercomputer.github.io/LUMI-training-materials/User-Updates/Update-202601/"
WINDOW = Window.from_text("6.1-7.0", source=LUST)


def test_versions_and_ranges():
    assert major_minor("7.0.2-56") == (7, 0) and major_minor("6.1.40093-x") == (6, 1)
    assert major_minor("") is None and major_minor(None) is None
    assert (6, 0) not in WINDOW and (6, 1) in WINDOW and (7, 0) in WINDOW
    assert (7, 1) not in WINDOW and str(WINDOW) == "6.1-7.0"
    assert Window.from_text("nonsense") is None
    assert torch_rocm({"version": "2.10.0+rocm7.0", "hip": "7.0.5"}) == (7, 0)
    assert torch_rocm({"version": "2.5.1+rocm6.2.4"}) == (6, 2)
    assert torch_rocm({"version": "2.4.1+fixture", "hip": "6.1.40093"}) == (6, 1)
    assert torch_rocm({"version": "2.4.1+cpu", "hip": ""}) is None
    assert torch_rocm(None) is None


def test_problems_outside_the_window_and_disagreement():
    assert problems(window=WINDOW, base_rocm="6.2.4-1", torch=None) == []
    [outside] = problems(window=WINDOW, base_rocm="6.0.3-39", torch=None)
    assert "the base image's ROCm 6.0.3-39 is outside" in outside
    assert f"supports ROCm 6.1-7.0 ({LUST})" in outside
    found = problems(
        window=WINDOW, base_rocm="7.0.2", torch={"version": "2.11.0+rocm7.1"}
    )
    assert len(found) == 2
    assert "built for ROCm 7.1, outside" in found[0]
    assert "but the base image has ROCm 7.0.2" in found[1]
    assert problems(window=None, base_rocm="6.0.3", torch=None) == []


def test_every_shipped_profile_states_lusts_window():
    systems = load_systems(files=[PACKAGED_PROFILE], include_stock=False)
    for name, system in systems.items():
        window = rocmwindow.RocmSettings.complete(system.stage_settings("rocm")).window
        assert str(window) == "6.1-7.0" and window.source == LUST, name
        rocm = major_minor(system.rocm_version)
        # lumi-g-ext-rocm-6.0 was removed (systems.yaml `removed:`).
        assert rocm in window, name


def _systems(tmp_path):
    """The packaged systems and a ROCm 6.0 one (outside the window)."""
    extra = tmp_path / "old.yaml"
    extra.write_text(
        "systems:\n  lumi-g-ext-rocm-6.0:\n    extends: lumi-g-ext\n"
        "    base-image: /x/lumi-rocm-rocm-6.0.3.sif\n    rocm-version: '6.0'\n"
    )
    return load_systems(files=[PACKAGED_PROFILE, extra], include_stock=False)


def _plan(tmp_path, **kw):
    if kw.get("system", "").startswith("lumi-aif"):
        kw.setdefault("base_image_override", "/x/lumi-multitorch-torch.sif")
    return make_plan(
        request=BuildRequest(image_path=tmp_path / "x.sif", **kw),
        systems=_systems(tmp_path),
    )


def test_dry_run_says_it_from_the_profile_and_from_the_base(tmp_path):
    plan = _plan(tmp_path, system="lumi-g-ext-rocm-6.0")
    text = plan_text(plan)
    assert "rocm:       base image ROCm 6.0 (the profile's rocm-version" in text
    assert "WARNING: the base image's ROCm 6.0 is outside" in text
    plan = _plan(tmp_path, system="lumi-aif-torch")
    facts = {
        "image": {"rocm_version": "7.0.2-56"},
        "explicit": {"python": {"torch": {"version": "2.10.0+rocm7.0"}}},
    }
    answer = describe.BaseAnswer(facts=facts)
    text = describe.describe(plan, answer=answer, space=(None, 0))
    line = next(ln for ln in text.splitlines() if "rocm:" in ln)
    assert "base image ROCm 7.0.2-56, torch 2.10.0+rocm7.0; LUMI's GPU driver" in line
    assert "WARNING" not in text


def test_strict_from_set_or_the_profile(tmp_path):
    request = buildoptions.request_from_options(
        context=hook_context(
            image_path=tmp_path / "x.sif",
            system="lumi-g-ext-rocm-6.0",
            options={"set_settings": ["rocm.strict=true"]},
        ),
        conda_env=None,
    )
    plan = make_plan(request=request, systems=_systems(tmp_path))
    assert plan.rocm_settings.strict
    text = plan_text(plan)
    assert "ERROR (strict): the base image's ROCm 6.0" in text
    assert "the build would stop here (strict)" in text
    with pytest.raises(InputError, match="rocm.supported: must be a range"):
        _plan(tmp_path, system="lumi-g-ext", settings={"rocm": {"supported": "7"}})


def _root(tmp_path, rocm="6.0.3-39", torch_version=None):
    root = tmp_path / "root"
    (root / "opt/rocm/.info").mkdir(parents=True)
    (root / "opt/rocm/.info/version").write_text(rocm + "\n")
    site = "/opt/venv/lib/python3.12/site-packages"
    if torch_version:
        (root / site.lstrip("/") / "torch").mkdir(parents=True)
        (root / site.lstrip("/") / "torch/version.py").write_text(
            f"__version__ = '{torch_version}'\nhip = '7.0.1'\n"
        )
    return root, site


def _check(tmp_path, plan, **kw):
    """The build's checks at start and end: (start, end) of rocmwindow."""
    root, site = _root(tmp_path, **kw)
    target = TargetEnv(prefix="/opt/venv", python="/x", site=[site])
    given = dict(root=root, target=target, settings=plan.rocm_settings)
    return (
        lambda: rocmwindow.check_start(**given),
        lambda: rocmwindow.check_end(**given),
    )


def test_a_build_warns_and_labels(tmp_path, caplog):
    plan = _plan(tmp_path, system="lumi-g-ext-rocm-6.0")
    start, end = _check(tmp_path, plan, torch_version="2.10.0+rocm7.0")
    start()
    assert "ROCm: the base image's ROCm 6.0.3-39 is outside" in caplog.text
    caplog.clear()
    labels = end()
    # The base's problem is said once; torch disagreeing with it is new.
    assert "is outside" not in caplog.text and "but the base image has" in caplog.text
    assert labels == {
        "cotainr-lumi.rocm.version": "6.0.3-39",
        "cotainr-lumi.rocm.supported": "6.1-7.0",
        "cotainr-lumi.rocm.torch": "7.0",
    }


def test_a_strict_build_stops_with_one_error(tmp_path):
    plan = _plan(
        tmp_path, system="lumi-g-ext-rocm-6.0", settings={"rocm": {"strict": True}}
    )
    start, _end = _check(tmp_path, plan)
    with pytest.raises(StageError, match="outside what LUMI's GPU driver") as e:
        start()
    assert e.value.stage == "rocm" and "rocm.strict=false" in str(e.value)
    # Inside the window: nothing to say.
    plan = _plan(tmp_path, system="lumi-aif-torch", settings={"rocm": {"strict": True}})
    start, end = _check(
        tmp_path / "b", plan, rocm="7.0.2", torch_version="2.10.0+rocm7.0"
    )
    start()
    end()


def test_version_py_fields_read_as_text_never_imported(tmp_path):
    root = tmp_path / "root"
    (root / "pkg").mkdir(parents=True)
    version = root / "pkg/version.py"

    def fields():
        return rocmwindow.version_py_fields(root=root, path="/pkg/version.py")

    version.write_text("__version__ = '2.7.1+rocm6.2.4'\nhip: str = '6.2.41134'\n")
    assert fields() == {"__version__": "2.7.1+rocm6.2.4", "hip": "6.2.41134"}
    for text in ("hip = None\n", "cuda = '12.1'\n", "hip = (\n'6.1'\n)\n"):
        version.write_text(text)
        assert "hip" not in fields()
    version.unlink()
    assert fields() is None


def test_version_py_fields_stay_in_the_image_and_never_block(tmp_path):
    """A base's link to a host file is read inside the image; a FIFO is not opened."""
    root = tmp_path / "root"
    (root / "pkg").mkdir(parents=True)
    host = tmp_path / "host_version.py"
    host.write_text("hip = '6.1.1'\n")
    (root / "pkg/version.py").symlink_to(host)
    assert rocmwindow.version_py_fields(root=root, path="/pkg/version.py") is None
    os.mkfifo(root / "pkg/fifo.py")
    assert rocmwindow.version_py_fields(root=root, path="/pkg/fifo.py") is None
