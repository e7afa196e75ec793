"""Fixtures for cotainr-lumi's end-to-end tests (real Apptainer, real images).

Session-scoped fixtures:

``apptainer_path`` -> pathlib.Path
    Runs ``scripts/provision-apptainer.sh`` once (a native apptainer/singularity
    when present, else the cached Debian-unstable apptainer behind wrapper
    scripts), prepends the printed directory to ``os.environ["PATH"]`` so that
    cotainr subprocesses find ``singularity``, and returns that directory.
    Also defaults ``APPTAINER_MKSQUASHFS_ARGS`` to ``-comp lz4`` (set it
    yourself, e.g. to ``-comp gzip``, to override) for Apptainer's own SIF
    builds (the base images, stock cotainr's builds): ~3x faster. cotainr-lumi
    squashes its images itself with ``build.compression`` (zstd:3, the default
    the tests check), which ignores that variable.
``lumi_like_base_image`` -> pathlib.Path
    The cached LUMI-like base image with a stub ROCm 6.1.3
    (``tests/e2e/base_image/build-base-image.sh``).
``lumi_like_base_image_rocm60`` -> pathlib.Path
    The same with a stub ROCm 6.0.3.
``apptainer_exec`` -> callable ``(sif, *cmd, env=None, timeout=600)``
    Runs ``apptainer exec --no-home SIF CMD...`` and returns the
    ``subprocess.CompletedProcess`` (text output captured, ``check=False``).
``rocm_torch_base_image`` -> pathlib.Path
    The 6.1.3 base plus prune fixture content (see ``prune_fixtures.py``),
    a ``derived_base``.
``derived_base`` -> callable ``(name, *, cases, setup="", python="python")``
    ``prune_fixtures.derive_base_image`` on the 6.1.3 base, made once per test
    run: the two pytest-xdist workers share it (the first makes it under a
    lock, the other waits and takes it). Returns the ``.sif`` (in pytest's
    temporary directory, which only root can enter: copy it for a build by
    another user). `name` names it; the image's directory also carries a hash
    of the recipe, so two recipes under one name never share an image.
``write_systems`` -> callable ``(path, systems)``
    Adds test systems (name -> entry) to the profile file `path` (made when
    missing) and returns `path`. An entry without ``extends`` extends
    ``lumi-g-ext-rocm-6.2`` with ROCm 6.1 (the LUMI-like base's); every entry gets
    ``provenance.hash-base-image: false`` unless it says otherwise, and its
    ``base-image`` as a string.
``cotainr_build`` -> callable ``(work, *args, systems=None, systems_file=None,
env=None, cwd=None, timeout=1800, ok=True, name=None)``
    Runs the stock ``cotainr build ARGS`` (in `cwd`, default `work`) with
    ``COTAINR_LUMI_SYSTEMS`` naming `systems_file` (default
    ``WORK/systems.yaml``) when that file exists, after `systems` (when
    given) were added to it with ``write_systems``, and ``XDG_CACHE_HOME`` in
    `work` (its own pip cache); `env` is merged over that. Returns the
    ``subprocess.CompletedProcess`` (text output; ``.output`` is stdout +
    stderr); asserts exit 0 with the output's tail when `ok`; records the
    build time under `name` in ``build_times`` when given.
``verify_image`` -> callable ``(sif, env=None)``
    Runs ``cotainr-lumi verify SIF --json``; returns (exit code,
    ``{check: status}``, the JSON report).
``build_times`` -> dict
    Build times (name -> seconds) that tests record; printed in the terminal
    summary (``pytest_terminal_summary``), not by a test.
``image_runtime`` -> callable ``(name, sif)``
    An image's labels, env and runtime record, also recorded as facts.
``e2e_facts`` -> dict
    What the tests saw in the images (name -> text: the MPI library before
    and after the swap, verify's rows ...); printed in the terminal summary,
    so a CI log has them.

When the infrastructure cannot be set up, the fixtures fail the test if
``CI=true`` (never skip in CI) and skip it otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
import fcntl
import hashlib
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import time
from typing import Callable

from hosttools import unavailable
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
PROVISION_SCRIPT = REPO_ROOT / "scripts" / "provision-apptainer.sh"
BUILD_BASE_IMAGE_SCRIPT = (
    REPO_ROOT / "tests" / "e2e" / "base_image" / "build-base-image.sh"
)

#: Where ``build_times`` keeps its dict (read by the terminal summary).
BUILD_TIMES = pytest.StashKey[dict]()
#: Where ``e2e_facts`` keeps its dict (read by the terminal summary).
E2E_FACTS = pytest.StashKey[dict]()

# First provisioning ~1 min, first base image ~2 min; generous limits.
_SETUP_TIMEOUT_S = 1800

ApptainerExec = Callable[..., "subprocess.CompletedProcess[str]"]


def _run_setup_script(what: str, argv: list[str]) -> str:
    """Run a setup script; return its single stdout line or fail/skip."""
    try:
        proc = subprocess.run(
            ["bash", *argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_SETUP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"{what}: {exc}")
        raise AssertionError("unreachable") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        unavailable(
            f"{what} failed (exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}"
        )
    return lines[-1].strip()


@pytest.fixture(scope="session")
def apptainer_path() -> Path:
    """Directory with working ``apptainer`` and ``singularity``; put on PATH."""
    out = _run_setup_script("scripts/provision-apptainer.sh", [str(PROVISION_SCRIPT)])
    bin_dir = Path(out)
    for name in ("apptainer", "singularity"):
        if not os.access(bin_dir / name, os.X_OK):
            unavailable(
                f"provision-apptainer.sh printed {bin_dir}, which has no {name}"
            )
    path_entries = os.environ.get("PATH", "").split(os.pathsep)
    if not path_entries or path_entries[0] != str(bin_dir):
        os.environ["PATH"] = os.pathsep.join([str(bin_dir), *path_entries])
    os.environ.setdefault("APPTAINER_MKSQUASHFS_ARGS", "-comp lz4")
    return bin_dir


def _base_image(rocm_version: str) -> Path:
    out = _run_setup_script(
        f"build-base-image.sh --rocm {rocm_version}",
        [str(BUILD_BASE_IMAGE_SCRIPT), "--rocm", rocm_version],
    )
    sif = Path(out)
    if not sif.is_file():
        unavailable(f"build-base-image.sh printed {sif}, which is not a file")
    return sif


@pytest.fixture(scope="session")
def lumi_like_base_image(apptainer_path: Path) -> Path:
    """LUMI-like base image (Debian 12, stub ROCm 6.1.3, venv as conda env)."""
    return _base_image("6.1.3")


@pytest.fixture(scope="session")
def lumi_like_base_image_rocm60(apptainer_path: Path) -> Path:
    """LUMI-like base image with a stub ROCm 6.0.3."""
    return _base_image("6.0.3")


@pytest.fixture(scope="session")
def apptainer_exec(apptainer_path: Path) -> ApptainerExec:
    """Return ``run(sif, *cmd, env=None, timeout=600)``.

    Runs ``apptainer exec --no-home SIF CMD...``. ``env`` (a mapping) is merged
    over ``os.environ`` for the apptainer process; Apptainer passes the host
    environment into the container (use ``APPTAINERENV_FOO`` to force one).
    """
    apptainer = str(apptainer_path / "apptainer")

    def run(
        sif: str | os.PathLike,
        *cmd: str | os.PathLike,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 600,
    ) -> subprocess.CompletedProcess[str]:
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        return subprocess.run(
            [apptainer, "exec", "--no-home", str(sif), *map(str, cmd)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture(scope="session")
def derived_base(tmp_path_factory, lumi_like_base_image, apptainer_path):
    """Return ``derive(name, *, cases, setup, python)`` (see the module docstring)."""
    from prune_fixtures import derive_base_image

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    shared = root / "derived-bases"
    shared.mkdir(exist_ok=True)

    def derive(name, *, cases, setup="", python="python"):
        recipe = json.dumps([list(cases), setup, python]).encode()
        key = f"{name}-{hashlib.sha256(recipe).hexdigest()[:12]}"
        work = shared / key
        image = work / "derived-base.sif"
        with open(shared / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not image.is_file():
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                derive_base_image(
                    apptainer=str(apptainer_path / "apptainer"),
                    base_image=lumi_like_base_image,
                    work=work,
                    cases=cases,
                    setup=setup,
                    python=python,
                )
        return image

    return derive


@pytest.fixture(scope="session")
def rocm_torch_base_image(derived_base):
    """The LUMI-like base plus a removable libstdc++ and a matching ROCm torch fixture.

    See ``prune_fixtures.py``: the env gets a copy of the base's libstdc++ and
    a C++ library needing it, and ``torch/lib`` holds copies of the base's
    ROCm 6.1 libraries with ``torch.version.hip`` matching.
    """
    return derived_base("rocm-torch", cases=("libstdcxx-safe", "torch"))


def _write_systems(path, systems):
    """Add the test `systems` to the profile file `path`; return `path`."""
    path = Path(path)
    data = yaml.safe_load(path.read_text()) if path.exists() else {"systems": {}}
    for name, entry in systems.items():
        if "extends" not in entry:
            entry = {"extends": "lumi-g-ext-rocm-6.2", "rocm-version": "6.1", **entry}
        settings = entry.get("settings", {})
        provenance = {"hash-base-image": False, **settings.get("provenance", {})}
        data["systems"][name] = {
            **entry,
            "base-image": str(entry["base-image"]),
            "settings": {**settings, "provenance": provenance},
        }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="session")
def write_systems():
    """Return ``write(path, systems) -> path`` (see the module docstring)."""
    return _write_systems


class BuildRun(subprocess.CompletedProcess):
    """A finished ``cotainr build``; ``output`` is its stdout + stderr."""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture(scope="session")
def cotainr_build(apptainer_path, build_times):
    """Return ``build(work, *args, ...)``: the stock ``cotainr build``.

    See the module docstring for the keywords.
    """
    command = str(Path(sys.executable).with_name("cotainr"))

    def build(
        work: Path,
        *args: str | os.PathLike,
        systems: Mapping[str, dict] | None = None,
        systems_file: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 1800,
        ok: bool = True,
        name: str | None = None,
    ) -> BuildRun:
        full_env = {**os.environ, "XDG_CACHE_HOME": str(work / "xdg-cache")}
        systems_file = Path(systems_file or work / "systems.yaml")
        if systems is not None:
            _write_systems(systems_file, systems)
        if systems_file.exists():
            full_env["COTAINR_LUMI_SYSTEMS"] = str(systems_file)
        t0 = time.time()
        proc = subprocess.run(
            [command, "build", *map(str, args)],
            cwd=cwd or work,
            env={**full_env, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if name is not None:
            build_times[name] = time.time() - t0
        run = BuildRun(proc.args, proc.returncode, proc.stdout, proc.stderr)
        assert run.returncode == 0 or not ok, run.output[-6000:]
        return run

    return build


@pytest.fixture(scope="session")
def verify_image(apptainer_path):
    """Return ``run(image, env=None) -> (exit code, {check: status}, report)``.

    Runs ``cotainr-lumi verify IMAGE --json`` (the installed command); ``env``
    is merged into the environment (e.g. ``COTAINR_LUMI_SYSTEMS`` so the
    image's test system gives the expected LUMI values).
    """
    command = Path(sys.executable).with_name("cotainr-lumi")

    def run(image, env=None):
        proc = subprocess.run(
            [str(command), "verify", str(image), "--json"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            timeout=600,
            check=False,
        )
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
        report = json.loads(proc.stdout)
        rows = {row["check"]: row["status"] for row in report["results"]}
        return proc.returncode, rows, report

    return run


@pytest.fixture(scope="session")
def build_times(request) -> dict[str, float]:
    """Build times (name -> seconds), printed at the end of the run."""
    return request.config.stash.setdefault(BUILD_TIMES, {})


@pytest.fixture
def e2e_facts(request) -> dict[str, str]:
    """What the tests saw in the images (name -> text), printed at the end."""
    return request.config.stash.setdefault(E2E_FACTS, {})


#: The variables of an image's network and MPI runtime that go to the facts.
RUNTIME_ENV_NAMES = (
    "FI_MR_CACHE_MONITOR",
    "NCCL_NET_PLUGIN",
    "NCCL_NET_GDR_LEVEL",
    "COTAINR_LUMI_NCCL_NET_GDR_LEVEL",
    "COTAINR_LUMI_MPI_ACTIVE",
    "LD_LIBRARY_PATH",
)


@pytest.fixture
def image_runtime(apptainer_exec, e2e_facts):
    """Return ``read(name, sif)`` -> (labels, env, runtime record).

    The image's labels, its environment in the container and its
    ``/opt/cotainr-lumi/runtime.json``; the binds label, the
    :data:`RUNTIME_ENV_NAMES` and the record go to ``e2e_facts`` under
    `name`, so the CI log shows each family's runtime settings.
    """

    def read(name, sif):
        labels = json.loads(
            apptainer_exec(sif, "cat", "/.singularity.d/labels.json").stdout
        )
        env = dict(
            line.split("=", 1)
            for line in apptainer_exec(sif, "env").stdout.splitlines()
            if "=" in line
        )
        proc = apptainer_exec(sif, "cat", "/opt/cotainr-lumi/runtime.json")
        assert proc.returncode == 0, proc.stderr
        runtime = json.loads(proc.stdout)
        e2e_facts[f"{name}, binds label"] = labels.get("cotainr-lumi.binds", "")
        e2e_facts[f"{name}, runtime env"] = " ".join(
            f"{n}={env.get(n, '<unset>')}" for n in RUNTIME_ENV_NAMES
        )
        e2e_facts[f"{name}, runtime.json"] = json.dumps(runtime, sort_keys=True)
        return labels, env, runtime

    return read


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the build times and facts the e2e tests recorded (if any ran)."""
    times = config.stash.get(BUILD_TIMES, {})
    if times:
        terminalreporter.section("cotainr-lumi build times")
        for name, seconds in times.items():
            terminalreporter.write_line(f"{name}: {seconds:.1f} s")
    facts = config.stash.get(E2E_FACTS, {})
    if facts:
        terminalreporter.section("cotainr-lumi e2e facts")
        for name, text in facts.items():
            terminalreporter.write_line(f"{name}: {text}")
