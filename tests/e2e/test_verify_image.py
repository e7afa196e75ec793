"""End-to-end: images built with lumi-g-ext-rocm-6.2 pass `cotainr-lumi verify`;
a deliberately broken one (pruning skipped) fails exactly the expected rows;
odd images (issue 29: malformed labels and records, a hanging python, env
scripts that never finish or print 2 MB) give FAIL rows or one message, never
a traceback, and leave no container running."""

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

from errorlines import error_lines
from pkgfixtures import make_wheel
import pytest

pytestmark = pytest.mark.e2e

HARDWARE_ROWS = {"rccl-bandwidth", "rccl-net-plugin", "gpus-visible"}
#: The LUMI-like test base has no rccl-tests (LUMI's base images do).
NOT_IN_TEST_BASE = {"rccl-tests"}


@pytest.fixture(scope="module")
def images(tmp_path_factory, rocm_torch_base_image, cotainr_build, write_systems):
    work = tmp_path_factory.mktemp("verify-e2e")
    profile = write_systems(
        work / "systems.yaml", {"verify-e2e": {"base-image": rocm_torch_base_image}}
    )
    make_wheel(work, "tinypkg", "1.0")
    (work / "requirements.txt").write_text("./tinypkg-1.0-py3-none-any.whl\n")
    built = {}
    for name, extra in (("full", []), ("broken", ["--skip-stage=prune"])):
        image = work / f"{name}.sif"
        proc = cotainr_build(
            work,
            image,
            "--system=verify-e2e",
            "--force",
            "--pip-requirements=requirements.txt",
            *extra,
            systems_file=profile,
            timeout=900,
        )
        built[name] = (image, proc.output)
    return built


def test_full_lumi_g_ext_image_passes_verify(images, verify_image, e2e_facts):
    code, rows, report = verify_image(images["full"][0])
    e2e_facts["lumi-g-ext-rocm-6.2 (ROCm base + env), verify"] = ", ".join(
        f"{c} {s}" for c, s in rows.items()
    )
    assert code == 0, json.dumps(report, indent=1)
    assert report["failed"] == []
    assert {
        c for c, s in rows.items() if s == "N/A"
    } == HARDWARE_ROWS | NOT_IN_TEST_BASE
    for check in (
        "torch-rocm-duplicates",
        "torch-rccl",
        "env-libstdcxx",
        "runscripts",
        "with-conda",
        "package-list",
        "net-plugin",
        "net-plugin-deps",
        "cray-libfabric",
        "rocm-driver",
    ):
        assert rows[check] == "PASS", check
    assert "module load" in images["full"][1] or "singularity exec" in images["full"][1]


def test_broken_image_fails_exactly_the_expected_rows(images, verify_image):
    code, _, report = verify_image(images["broken"][0])
    assert code == 1
    assert set(report["failed"]) == {"env-libstdcxx", "torch-rocm-duplicates"}


def test_verify_text_output_and_missing_image(images, tmp_path):
    cmd = str(Path(sys.executable).with_name("cotainr-lumi"))
    proc = subprocess.run(
        [cmd, "verify", str(images["full"][0])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0
    assert (
        proc.stdout.splitlines()[0].startswith("STATUS")
        and "0 FAIL" in proc.stdout.splitlines()[-1]
    )
    proc = subprocess.run(
        [cmd, "verify", str(tmp_path / "none.sif")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_the_lumi_g_ext_familys_runtime_settings(images, image_runtime):
    # The 2024 family (LUMI ROCm base images): the host's Cray libfabric and
    # libcxi bound, aws-ofi-rccl, GDR level 3 only in the distributed runscript.
    labels, env, runtime = image_runtime("lumi-g-ext-rocm-6.2 image", images["full"][0])
    binds = labels["cotainr-lumi.binds"].split(",")
    assert {"/opt/cray", "/usr/lib64/libcxi.so.1", "/var/spool/slurmd"} <= set(binds)
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert env["CXI_FORK_SAFE"] == "1" and env["CXI_FORK_SAFE_HP"] == "1"
    assert "NCCL_NET_GDR_LEVEL" not in env
    assert env["COTAINR_LUMI_NCCL_NET_GDR_LEVEL"] == "3"
    assert "/opt/cray/libfabric/" in env["LD_LIBRARY_PATH"]
    assert runtime["libfabric"] == "host"
    assert runtime["net-plugin"]["generation"] == "aws-ofi-rccl"


# -- Odd images (issue 29) ----------------------------------------------------

COMMAND = str(Path(sys.executable).with_name("cotainr-lumi"))
#: The hanging `python` of the "hang" image (found by its exact command line).
HANG = b"sleep\x00987654\x00"
NESTED = "[" * 100_000 + "]" * 100_000
#: A 2 MB line from the "noisy" image's env script (shell built-ins only:
#: Apptainer runs env scripts in its own interpreter).
NOISE = f'x=x\nfor i in {" ".join(map(str, range(21)))}; do x=$x$x; done\necho "$x"\n'


def odd_layouts(labels):
    """{image name: {path in the image: content}}, from the base's `labels`."""
    required = {
        "cotainr-lumi.version": "1",
        "cotainr-lumi.system": "odd-e2e",
        "cotainr-lumi.base-image": "/b.sif",
        "cotainr-lumi.base-image.resolved": "/b.sif",
        "cotainr-lumi.stages": "provenance",
    }
    return {
        # A valid 300 KB labels.json (Apptainer builds only string labels:
        # the malformed ones are bound over it); a record nested 100,000
        # deep; odd types in others; a ROCM_PATH that is not UTF-8.
        "odd": {
            ".singularity.d/labels.json": json.dumps(
                {**labels, **required, "org.example.big": "x" * 300_000}
            ),
            "opt/cotainr-lumi/prune-manifest.json": NESTED,
            "opt/cotainr-lumi/runtime.json": '{"net-plugin-dirs": [1, 2]}',
            "opt/cotainr-lumi/mpi.json": "[1]",
            ".singularity.d/env/95-odd.sh": 'export ROCM_PATH=$(printf "/opt/r\\377")\n',
        },
        # The active env's python hangs (verify and the dry run's probe run it).
        "hang": {
            "hang/bin/python": "#!/bin/sh\nexec sleep 987654\n",
            ".singularity.d/env/99-zz-hang.sh": (
                "export PATH=/hang/bin:$PATH CONDA_PREFIX=/hang\n"
            ),
        },
        "exit": {".singularity.d/env/50-exit.sh": "exit 3\n"},
        "spin": {".singularity.d/env/50-spin.sh": "while :; do :; done\n"},
        "noisy": {".singularity.d/env/50-noisy.sh": NOISE},
    }


@pytest.fixture(scope="module")
def odd(
    tmp_path_factory, lumi_like_base_image, apptainer_path, build_times, write_systems
):
    """The odd images (name -> .sif) and a profile with a system on each."""
    work = tmp_path_factory.mktemp("verify-odd")
    apptainer = str(apptainer_path / "apptainer")
    opts = dict(capture_output=True, text=True, cwd=work, timeout=900)
    sandbox = work / "sandbox"
    t_start = time.time()
    proc = subprocess.run(
        [apptainer, "build", "--sandbox", sandbox, lumi_like_base_image], **opts
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for big in ("usr/lib/gcc", "usr/include", "usr/share/doc", "usr/share/locale"):
        subprocess.run(["rm", "-rf", sandbox / big], check=True)
    labels = json.loads((sandbox / ".singularity.d/labels.json").read_text())
    images = {}
    for name, files in odd_layouts(labels).items():
        saved = {}
        for path, content in files.items():
            target = sandbox / path
            saved[target] = target.read_bytes() if target.exists() else None
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(0o755)
        images[name] = work / f"{name}.sif"
        proc = subprocess.run([apptainer, "build", images[name], sandbox], **opts)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for target, content in saved.items():
            if content is None:
                target.unlink()
            else:
                target.write_bytes(content)
    subprocess.run(["rm", "-rf", sandbox], check=True)
    build_times["odd images (sandbox + 5 SIFs)"] = time.time() - t_start
    profile = write_systems(
        work / "systems.yaml",
        {f"{name}-e2e": {"base-image": image} for name, image in images.items()},
    )
    return images, profile


def hanging():
    """The pids of the hang image's `python` still running."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == HANG:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def run(*args, env=None, timeout=600, command=COMMAND, **kwargs):
    """Run `cotainr-lumi ARGS`; the finished process (text output)."""
    return subprocess.run(
        [command, *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "LC_ALL": "C.UTF-8", **(env or {})},
        timeout=timeout,
        **kwargs,
    )


@pytest.mark.parametrize("labels", [None, {"org.example.n": 5}, []])
def test_malformed_labels_and_records_are_fail_rows(odd, tmp_path, labels, e2e_facts):
    images, _ = odd
    env = {}
    if labels is not None:  # a labels.json Apptainer would not build, bound over
        bound = tmp_path / "labels.json"
        bound.write_text(json.dumps(labels))
        env["APPTAINER_BIND"] = f"{bound}:/.singularity.d/labels.json"
    text = run("verify", images["odd"], env=env)
    report = run("verify", images["odd"], "--json", env=env)
    for proc in (text, report):
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.stderr == ""
    assert text.stdout.splitlines()[-1].startswith(f"verify {images['odd']}: ")
    rows = {r["check"]: r for r in json.loads(report.stdout)["results"]}
    records = rows["records"]["evidence"]
    e2e_facts[f"verify odd image, labels {labels}, records row"] = records
    assert rows["records"]["status"] == "FAIL"
    assert "prune-manifest.json: RecursionError" in records
    assert "mpi.json: ValueError: a JSON array, not an object" in records
    assert "network: TypeError" in records
    assert "\\udcff" in rows["rocm-layout"]["evidence"]
    if labels is None:  # 300 KB of labels read whole: the required ones found
        assert rows["provenance-labels"]["status"] == "PASS"
    elif labels:
        assert "labels that are not strings: org.example.n" in records
    else:
        assert "labels.json: ValueError: a JSON array, not an object" in records
        assert rows["provenance-labels"]["status"] == "FAIL"


def test_a_hanging_python_is_one_timeout_message(odd):
    images, _ = odd
    t_start = time.time()
    proc = run("verify", images["hang"], "--timeout", "15", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 600, proc.stderr
    assert "did not finish within 15 s" in proc.stderr
    assert time.time() - t_start < 60
    assert hanging() == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_on_verify_stops_the_container(odd, signum):
    images, _ = odd
    proc = subprocess.Popen(
        [COMMAND, "verify", str(images["hang"])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not hanging():
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signum
        assert err.splitlines() == [
            f"cotainr-lumi: error: verify was interrupted by {signal.Signals(signum).name}; "
            "the container it started was stopped"
        ]
        deadline = time.time() + 20
        while hanging() and time.time() < deadline:
            time.sleep(0.1)
        assert hanging() == []
    finally:
        proc.kill()
        for pid in hanging():  # the test's own container, on failure
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "name, words",
    [
        ("hang", "did not finish within 10 s"),
        ("exit", "the probe of the base image failed (exit status 3, no message)"),
    ],
)
@pytest.mark.parametrize("command", ["cotainr-lumi", "cotainr"])
def test_a_dry_run_whose_probe_failed_exits_non_zero(
    odd, tmp_path, name, words, command
):
    images, profile = odd
    proc = run(
        "build",
        tmp_path / "x.sif",
        f"--system={name}-e2e",
        "--dry-run",
        "--set",
        "target-env.probe-timeout=10",
        env={"COTAINR_LUMI_SYSTEMS": str(profile)},
        timeout=300,
        command=str(Path(COMMAND).with_name(command)),
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cotainr-lumi build plan (dry run" in proc.stdout and words in proc.stdout
    assert len(error_lines(proc.stderr)) == 1 and words in proc.stderr
    assert "Traceback" not in proc.stderr and hanging() == []


def test_env_scripts_that_never_finish_are_one_clear_build_error(
    odd, tmp_path, build_times
):
    # Apptainer gives env scripts 60 s: the mount check of the layered build
    # fails then, and the build stops (unpacked, the base would run them again).
    images, profile = odd
    t_start = time.time()
    proc = run(
        "build",
        tmp_path / "x.sif",
        "--system=spin-e2e",
        env={"COTAINR_LUMI_SYSTEMS": str(profile)},
    )
    build_times["env script that never finishes (Apptainer's 60 s)"] = (
        time.time() - t_start
    )
    # exit 2: the base image given is what is wrong (an input error)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "context deadline exceeded" in errors[0]
    assert (
        f"The /.singularity.d/env scripts of the base image {images['spin']} did not "
        "finish within Apptainer's limit (60 s)" in errors[0]
    )
    assert not (tmp_path / "x.sif").exists()


def test_an_env_scripts_2_mb_line_makes_a_short_build_error(odd, tmp_path):
    images, profile = odd
    (tmp_path / "broken-1.0-py3-none-any.whl").write_text("not a wheel")
    (tmp_path / "req.txt").write_text("./broken-1.0-py3-none-any.whl\n")
    proc = run(
        "build",
        tmp_path / "x.sif",
        "--system=noisy-e2e",
        "--pip-requirements=req.txt",
        env={"COTAINR_LUMI_SYSTEMS": str(profile)},
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    error = proc.stderr[proc.stderr.index(error_lines(proc.stderr)[0]) :]
    assert "pip install failed in step 1 (req.txt)" in error
    assert "... (2097152 bytes)" in error and "Wheel 'broken'" in error
    assert len(error.encode()) < 6000
