"""Tests of the lumi-env stage (unit level: a fake sandbox directory).

The real Apptainer behaviour is covered by tests/e2e/test_lumi_env.py.
"""

import os
from pathlib import Path
import shlex
import subprocess
from types import SimpleNamespace

from planfakes import build_facts, plan_text, stage_context
import pytest
from targetenv_fakes import is_probe, probe_stdout

import cotainr_lumi
from cotainr_lumi.engine.stage import BaseImage
from cotainr_lumi.engine.targetenv import TargetEnv
from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.imagelayout import LUMI_ENV_FILE as ENV_FILE
from cotainr_lumi.imagelayout import WITH_CONDA_FILE
from cotainr_lumi.pipeline.plan import BuildRequest, make_plan
from cotainr_lumi.processes import CommandError
from cotainr_lumi.stages import PIPELINE
from cotainr_lumi.stages.lumi_env import imagefiles
from cotainr_lumi.stages.lumi_env.imagefiles import BASE_WITH_CONDA_MARK, RUNSCRIPTS
from cotainr_lumi.stages.lumi_env.modulefile import HOST_COMMANDS, MARKER
from cotainr_lumi.stages.lumi_env.stage import LumiEnvStage

LUMI_SETTINGS = {
    "env": {
        "CXI_FORK_SAFE": "1",
        "FI_CXI_DEFAULT_CQ_SIZE": 131072,
        "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
        "NCCL_NET_GDR_LEVEL": None,
    },
    "binds": ["/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1", "/pfs"],
}


class FakeSandbox:
    """A sandbox directory; run() answers the stage's two commands."""

    def __init__(self, root, *, probe="", fail_check=False):
        self.root = root
        self.probe = probe
        self.fail_check = fail_check
        self.calls = []

    def run(self, args, *, env=None, timeout=None):
        self.calls.append(list(args))
        script = args[-1]
        if is_probe(args):
            # The build's one probe of the image: the env, the conda variables.
            found = dict(
                line.split("=", 1) for line in self.probe.splitlines() if "=" in line
            )
            prefix = found.get("prefix") or None
            out = probe_stdout(
                prefix,
                var="CONDA_PREFIX"
                if found.get("conda_prefix") == prefix
                else "VIRTUAL_ENV",
                conda_exe=found.get("conda_exe", ""),
            )
            return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")
        assert "CONDA_EXE" not in script, "a second probe of the image"
        if self.fail_check:
            raise CommandError(
                cmd=args, returncode=255, stdout="", stderr="FATAL: bad env"
            )
        return subprocess.CompletedProcess(args, 0, stdout="ok\n", stderr="")


def make_root(tmp_path, *, rocm=True, ofi=True, venv=True):
    root = tmp_path / "sandbox"
    (root / ".singularity.d/env").mkdir(parents=True)
    if rocm:
        for sub in ("bin", "lib"):
            (root / "opt/rocm-6.1.3" / sub).mkdir(parents=True)
        (root / "opt/rocm").symlink_to(
            "/opt/rocm-6.1.3"
        )  # absolute: resolved in the root
    if ofi:
        (root / "opt/aws-ofi-rccl").mkdir(parents=True)
        (root / "opt/aws-ofi-rccl/librccl-net.so").write_bytes(b"")
    if venv:
        (root / "opt/env/bin").mkdir(parents=True)
        (root / "opt/env/bin/activate").write_text("")
    return root


def run_stage(tmp_path, settings, build=None, **root_kw):
    root = make_root(tmp_path, **root_kw)
    sandbox = FakeSandbox(root, probe="prefix=/opt/env\nconda_prefix=\nconda_exe=\n")
    stage = LumiEnvStage(settings=settings)
    assert LumiEnvStage(settings=stage.settings.to_dict()).settings == stage.settings
    build = build or build_facts(image_path=tmp_path / "out" / "torch.sif")
    report = stage.run(context=stage_context(sandbox, build=build))
    return root, report, sandbox


def source_env(root, env_file=ENV_FILE, env=None):
    proc = subprocess.run(
        ["bash", "-c", '. "$1" && env -0', "bash", str(root / env_file.lstrip("/"))],
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        check=True,
    )
    return dict(e.decode().partition("=")[::2] for e in proc.stdout.split(b"\0") if e)


def test_stage_writes_env_file_runscripts_and_reports_outputs(tmp_path):
    root, report, sandbox = run_stage(tmp_path, LUMI_SETTINGS)
    env = source_env(
        root, env={"USER": "alice", "SLURM_NODEID": "3", "LD_LIBRARY_PATH": "/base"}
    )
    assert env["CXI_FORK_SAFE"] == "1"
    assert env["FI_CXI_DEFAULT_CQ_SIZE"] == "131072"
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert "NCCL_NET_GDR_LEVEL" not in env
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert env["MIOPEN_USER_DB_PATH"] == f"/tmp/{user}-miopen-cache"
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == f"/tmp/{user}-miopen-cache"
    assert env["ROCM_PATH"] == "/opt/rocm"
    assert env["LD_LIBRARY_PATH"] == "/base:/opt/rocm/lib:/opt/aws-ofi-rccl"
    # The target env (/opt/env, not yet on PATH here) is active from the start.
    assert env["PATH"] == "/opt/env/bin:/usr/bin:/bin:/opt/rocm/bin:/runscripts"
    assert env["WITH_CONDA"] == f". {WITH_CONDA_FILE}"
    for name in RUNSCRIPTS:
        path = root / "runscripts" / name
        assert path.is_file() and os.access(path, os.X_OK)
    assert "/opt/env/bin/activate" in (root / WITH_CONDA_FILE.lstrip("/")).read_text()
    assert (
        report.labels["cotainr-lumi.binds"]
        == "/var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1,/pfs"
    )
    assert report.labels["cotainr-lumi.runscripts"] == "/runscripts"
    assert (
        report.labels["cotainr-lumi.env"]
        == "CXI_FORK_SAFE,FI_CXI_DEFAULT_CQ_SIZE,NCCL_SOCKET_IFNAME"
    )
    outputs = report.host_files.files
    croot = tmp_path / "out/torch.root"
    assert sorted(map(str, outputs)) == sorted(
        [
            str(tmp_path / "out/torch.lua"),
            str(tmp_path / "out/torch.sh"),
            *(str(croot / "bin" / n) for n in HOST_COMMANDS),
            *(str(croot / "runscripts" / n) for n in RUNSCRIPTS),
            str(croot / "user-software/README.cotainr-lumi"),
        ]
    )
    assert report.record["container-root"] == str(croot)
    assert report.record["user-venv"] == "/user-software/venv/torch"
    for name in HOST_COMMANDS:
        text = outputs[croot / "bin" / name]
        assert text.startswith("#!/bin/bash\n") and MARKER in text
        assert f"default_sif={tmp_path / 'out/torch.sif'}" in text
    lua = outputs[tmp_path / "out/torch.lua"]
    assert 'setenv("SIFTORCH", ' in lua
    assert f'setenv("EBROOTTORCH", "{croot}")' in lua
    env_file = (root / ENV_FILE.lstrip("/")).read_text()
    assert "COTAINR_LUMI_USER_VENV" in env_file
    assert str(tmp_path / "out/torch.sif") in outputs[tmp_path / "out/torch.lua"]
    assert "module load torch" in report.host_files.run_hint
    assert (
        "-B /var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1,/pfs"
        in report.host_files.run_hint
    )
    assert report.record["search-paths"] == {
        "rocm": "/opt/rocm",
        "aws-ofi-rccl": "/opt/aws-ofi-rccl",
    }
    # The build's one probe of the image, then the check.
    assert [is_probe(c) for c in sandbox.calls] == [True, False]


def test_runtime_values_win_over_every_default(tmp_path):
    root, _, _ = run_stage(tmp_path, LUMI_SETTINGS)
    env = source_env(
        root,
        env={
            "CXI_FORK_SAFE": "0",
            "NCCL_SOCKET_IFNAME": "",
            "MIOPEN_USER_DB_PATH": "/x",
            "ROCM_PATH": "/opt/rocm-6.2.4",
            "LD_LIBRARY_PATH": "/opt/aws-ofi-rccl:/opt/rocm/lib",
        },
    )
    assert env["CXI_FORK_SAFE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == ""
    assert env["MIOPEN_USER_DB_PATH"] == "/x"
    assert env["ROCM_PATH"] == "/opt/rocm-6.2.4"
    assert env["LD_LIBRARY_PATH"] == "/opt/aws-ofi-rccl:/opt/rocm/lib"


def test_hostile_user_values_are_inert_in_the_env_file(tmp_path):
    marker = tmp_path / "PWNED"
    value = f"$(touch {marker})`touch {marker}`'\"\n;touch {marker}"
    root, _, _ = run_stage(tmp_path, {"env": {"EVIL": value}})
    env = source_env(root)
    assert env["EVIL"] == value
    assert not marker.exists()


def test_jit_caches_are_private_per_job_on_node_local_tmp(tmp_path):
    root, report, _ = run_stage(tmp_path, LUMI_SETTINGS)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    job = f"9{os.getpid()}"
    names = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR")
    made = []
    try:
        env = source_env(root, env={"SLURM_JOB_ID": job, "TRITON_CACHE_DIR": "/x"})
        assert env["TRITON_CACHE_DIR"] == "/x"  # a value already set wins
        for name, what in zip(names[1:], ("torchinductor", "torch-extensions")):
            made.append(Path(f"/tmp/{user}-job{job}-{what}-cache"))
            assert env[name] == str(made[-1])
            assert made[-1].is_dir() and made[-1].stat().st_mode & 0o777 == 0o700
        # Apptainer hides the host's variables from env scripts in
        # $__exported_env__; a job number that is not one is not used.
        hidden = {"__exported_env__": f"A=1\nSLURM_JOB_ID={job}\nB=2"}
        for given, expect in ((hidden, job), ({"SLURM_JOB_ID": "1/../x"}, "none")):
            made.append(Path(f"/tmp/{user}-job{expect}-torchinductor-cache"))
            assert source_env(root, env=given)["TORCHINDUCTOR_CACHE_DIR"] == str(
                made[-1]
            )
    finally:
        for path in Path("/tmp").glob(f"{user}-job{job}-*-cache"):
            path.rmdir()
    off, _, _ = run_stage(tmp_path / "off", {**LUMI_SETTINGS, "jit-caches": False})
    assert not set(names) & set(source_env(off, env={"SLURM_JOB_ID": job}))


def test_without_rocm_runscripts_conda_or_module_file(tmp_path):
    settings = {
        "runscripts": False,
        "with-conda": False,
        "module-file": False,
        "miopen-cache": False,
        "mpi": "none",
    }
    root, report, sandbox = run_stage(tmp_path, settings, rocm=False, ofi=False)
    env = source_env(root)
    assert env["PATH"] == "/usr/bin:/bin"
    assert (
        "WITH_CONDA" not in env
        and "ROCM_PATH" not in env
        and "MIOPEN_USER_DB_PATH" not in env
    )
    assert not (root / "runscripts").exists()
    assert report.host_files.files == {} and report.record["module-files"] == []
    assert "module load" not in report.host_files.run_hint
    assert len(sandbox.calls) == 2  # the build's probe, then the start check


def test_conda_environment_is_activated_with_conda_sh(tmp_path):
    root = make_root(tmp_path)
    (root / "opt/cotainr/conda/etc/profile.d").mkdir(parents=True)
    (root / "opt/cotainr/conda/etc/profile.d/conda.sh").write_text("")
    prefix = "/opt/cotainr/conda/envs/conda_container_env"
    sandbox = FakeSandbox(
        root,
        probe=f"prefix={prefix}\nconda_prefix={prefix}\nconda_exe=/opt/cotainr/conda/bin/conda\n",
    )
    stage = LumiEnvStage(settings={})
    stage.run(context=stage_context(sandbox, image_path=tmp_path / "a.sif"))
    text = (root / WITH_CONDA_FILE.lstrip("/")).read_text()
    assert f"conda activate {prefix}" in text
    assert ". /opt/cotainr/conda/etc/profile.d/conda.sh" in text


def test_module_dir_and_name_settings(tmp_path):
    _, report, _ = run_stage(
        tmp_path, {"module-dir": str(tmp_path / "mods"), "module-name": "pt"}
    )
    outputs = sorted(map(str, report.host_files.files))
    assert [o for o in outputs if "/mods/" in o] == [
        str(tmp_path / "mods/pt.lua"),
        str(tmp_path / "mods/pt.sh"),
    ]
    # CONTAINERROOT stays next to the image, out of the module directory
    # (Lmod walks module directories; user-software can hold many files).
    assert all(
        o.startswith(str(tmp_path / "out/pt.root/"))
        for o in outputs
        if "/mods/" not in o
    )
    assert report.record["user-venv"] == "/user-software/venv/pt"


def test_a_layer_only_build_also_reports_the_module_files_for_its_base(tmp_path):
    """Written instead if the layer is kept: SIF is the base, *_OVERLAY the layer."""
    image, base = tmp_path / "out/torch.sqfs", f"{tmp_path}/it's.sif"
    Path(base).write_text("the base")
    build = build_facts(
        image_path=image,
        layer_only=True,
        base_image=BaseImage(given=base, resolved=base, is_local_file=True),
    )
    _, report, _ = run_stage(tmp_path, {}, build=build)
    layer = report.layer_host_files.files
    assert sorted(map(str, layer)) == sorted(map(str, report.host_files.files))
    hint = report.layer_host_files.run_hint
    assert f"exec --overlay {image}:ro {shlex.quote(base)} conda-python" in hint
    lua = layer[tmp_path / "out/torch.lua"]
    assert f'setenv("SIF", "{base}")' in lua
    assert f'setenv("APPTAINER_OVERLAY", "{image}:ro")' in lua
    assert f"SINGULARITY_OVERLAY={image}:ro; export" in layer[tmp_path / "out/torch.sh"]
    assert "OVERLAY" not in report.host_files.files[tmp_path / "out/torch.lua"]


def test_container_root_var_name_and_user_venv_settings(tmp_path):
    _, report, _ = run_stage(
        tmp_path,
        {
            "container-root": str(tmp_path / "croot"),
            "module-var-name": "PYTORCH",
            "user-venv": "/user-software/venv/pytorch",
        },
    )
    lua = report.host_files.files[tmp_path / "out/torch.lua"]
    assert 'setenv("SIFPYTORCH"' in lua
    assert f'setenv("EBROOTPYTORCH", "{tmp_path / "croot"}")' in lua
    assert tmp_path / "croot/bin/start-shell" in report.host_files.files
    assert report.record["user-venv"] == "/user-software/venv/pytorch"


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"module-var-name": "pytorch"}, "module-var-name"),
        ({"module-var-name": "1X"}, "module-var-name"),
        ({"container-root": "/a,b"}, "container-root"),
        ({"container-root": "/a b"}, "container-root"),
        ({"user-venv": "/opt/venv"}, "user-venv"),
        ({"user-venv": "/user-software/../etc"}, "user-venv"),
    ],
)
def test_bad_container_root_settings_are_named(settings, key):
    with pytest.raises(InputError, match=rf"^Invalid setting lumi-env\.{key}: "):
        LumiEnvStage(settings=settings)


def test_broken_env_file_fails_the_stage(tmp_path):
    root = make_root(tmp_path)
    sandbox = FakeSandbox(root, fail_check=True)
    with pytest.raises(StageError, match="does not start"):
        LumiEnvStage(settings={}).run(
            context=stage_context(sandbox, image_path=tmp_path / "a.sif")
        )


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"env": {"PATH": "/x"}}, "env.PATH"),
        ({"env": {"1BAD": "x"}}, "env.1BAD"),
        ({"env": {"X": True}}, "env.X"),
        ({"env": ["X=1"]}, "env"),
        ({"binds": ["/a,/b"]}, "binds"),
        ({"binds": "/a"}, "binds"),
        ({"path": ["rel"]}, "path"),
        ({"ld-library-path": ["/a:/b"]}, "ld-library-path"),
        ({"module-file": "yes"}, "module-file"),
        ({"module-name": "a/b"}, "module-name"),
        ({"module-dir": 3}, "module-dir"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_invalid_settings_name_the_key(settings, key):
    with pytest.raises(InputError) as info:
        LumiEnvStage(settings=settings)
    assert str(info.value).startswith(f"Invalid setting lumi-env.{key}")


def test_module_dir_must_be_able_to_hold_files(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for directory, problem in (
        (afile, "exists and is not a directory"),
        (afile / "sub", f"cannot create {afile / 'sub'}: {afile} is not a directory"),
    ):
        with pytest.raises(InputError) as info:
            LumiEnvStage(settings={"module-dir": str(directory)})
        assert str(info.value).startswith("Invalid setting lumi-env.module-dir: ")
        assert problem in str(info.value)
    for fine in (tmp_path, tmp_path / "new" / "dir"):
        stage = LumiEnvStage(settings={"module-dir": str(fine)})
        assert stage.settings.module_dir == str(fine)


@pytest.fixture
def lumi_env_profile(tmp_path, base_image, monkeypatch):
    path = tmp_path / "systems.yaml"
    path.write_text(
        "systems:\n"
        "  lumi-env-test:\n"
        "    extends: lumi-g-ext\n"
        f"    base-image: {base_image}\n"
        "    stages: [lumi-env, provenance]\n"
        "    settings:\n"
        "      lumi-env:\n"
        "        env: {CXI_FORK_SAFE: '1', NCCL_SOCKET_IFNAME: 'hsn0,hsn1', NCCL_NET_GDR_LEVEL: null}\n"
        "        binds: [/opt/cray, /pfs]\n"
        "        host-libfabric-binds: []\n"
    )
    monkeypatch.setenv("COTAINR_LUMI_SYSTEMS", str(path))
    return path


def test_api_build_and_dry_run_plan(tmp_path, fake_singularity, lumi_env_profile):
    settings = {"lumi-env": {"env": {"NCCL_SOCKET_IFNAME": None, "EXTRA": "$(x)"}}}
    plan = cotainr_lumi.plan(
        image_path=tmp_path / "pt.sif", system="lumi-env-test", settings=settings
    )
    text = plan_text(plan)
    assert "CXI_FORK_SAFE=1" in text and "EXTRA='$(x)'" in text
    assert "not set: NCCL_SOCKET_IFNAME, NCCL_NET_GDR_LEVEL" in text
    assert "runscripts in /runscripts (on PATH): conda-python-simple" in text
    assert "MIOPEN_CUSTOM_CACHE_DIR=/tmp/$(id -un)-miopen-cache" in text
    assert f"module file {tmp_path / 'pt.lua'}" in text
    fake_singularity.add_handler(
        lambda argv: argv[:2] == ["bash", "-c"] and "ok" in argv[2],
        lambda argv: subprocess.CompletedProcess(argv, 0, stdout="ok\n", stderr=""),
    )
    result = cotainr_lumi.build(
        image_path=tmp_path / "pt.sif", system="lumi-env-test", settings=settings
    )
    assert result.labels["cotainr-lumi.binds"] == "/opt/cray,/pfs"
    # the lumi-g-ext defaults merged with the test profile's and the build's
    env_label = result.labels["cotainr-lumi.env"].split(",")
    assert env_label[0] == "CXI_FORK_SAFE" and env_label[-1] == "EXTRA"
    assert "PYTORCH_ROCM_ARCH" in env_label and "NCCL_SOCKET_IFNAME" not in env_label
    report = result.report("lumi-env")
    assert tmp_path / "pt.lua" in report.host_files.files
    # The pipeline wrote the module file and shell snippet next to the image.
    assert 'setenv("SIF"' in (tmp_path / "pt.lua").read_text()
    # Two binds, and the /user-software bind (SquashFS file or directory).
    assert (tmp_path / "pt.sh").read_text().count("SINGULARITY_BIND=") == 4
    # The host commands are executable; user-software/ exists.
    croot = tmp_path / "pt.root"
    for name in HOST_COMMANDS:
        assert os.access(croot / "bin" / name, os.X_OK), name
    assert (croot / "user-software").is_dir()
    assert not os.access(croot / "user-software/README.cotainr-lumi", os.X_OK)


def test_stage_is_registered():
    assert LumiEnvStage in PIPELINE
    assert (
        Path(cotainr_lumi.__file__)
        .parent.joinpath("stages", "lumi_env", "runscripts", "get-master")
        .is_file()
    )


def test_base_image_runscripts_are_replaced_with_a_note(tmp_path, caplog):
    root = make_root(tmp_path)
    (root / "runscripts").mkdir()
    (root / "runscripts/conda-python-distributed").write_text("#!/bin/bash\nold\n")
    (root / "runscripts/init-conda-venv").write_text("#!/bin/bash\ntheirs\n")
    (root / "runscripts/my-own").write_text("#!/bin/bash\nmine\n")
    sandbox = FakeSandbox(root, probe="prefix=/opt/env\nconda_prefix=\nconda_exe=\n")
    stage = LumiEnvStage(settings=LUMI_SETTINGS)
    context = stage_context(sandbox, image_path=tmp_path / "out" / "torch.sif")
    with caplog.at_level("INFO", logger="cotainr.cotainr_lumi"):
        stage.run(context=context)
    replaced = [r for r in caplog.messages if r.startswith("Replacing")]
    assert replaced == [
        "Replacing the base image's /runscripts/conda-python-distributed "
        "with cotainr-lumi's",
        "Replacing the base image's /runscripts/init-conda-venv with cotainr-lumi's",
    ]
    text = (root / "runscripts/conda-python-distributed").read_text()
    assert "old" not in text and "SLURM_PROCID" in text
    # The base image's other runscripts stay.
    assert (root / "runscripts/my-own").read_text() == "#!/bin/bash\nmine\n"
    # Building again on an image that has ours: nothing to note.
    caplog.clear()
    with caplog.at_level("INFO", logger="cotainr.cotainr_lumi"):
        stage.run(context=context)
    assert not [r for r in caplog.messages if r.startswith("Replacing")]


def _write_fake_conda(tmp_path):
    """A conda-like `activate NAME` script and an env it activates."""
    env = tmp_path / "conda" / "envs" / "pytorch"
    (env / "bin").mkdir(parents=True)
    activate = tmp_path / "conda" / "activate"
    activate.write_text(
        f'export CONDA_PREFIX="{tmp_path}/conda/envs/$1"\n'
        'export PATH="$CONDA_PREFIX/bin:$PATH"\n'
    )
    return env, f"source {activate} pytorch"


def test_with_conda_chains_to_the_base_images_command(tmp_path):
    env, base_value = _write_fake_conda(tmp_path)
    root = make_root(tmp_path, venv=False)
    target = SimpleNamespace(with_conda=base_value)
    chained = imagefiles.base_with_conda(root=root, target=target)
    assert chained == base_value
    script, prefix = imagefiles.with_conda_script(
        root=root,
        target=TargetEnv(prefix=str(env), python=f"{env}/bin/python"),
        base_with_conda=chained,
    )
    assert prefix == str(env)
    (tmp_path / "with-conda.sh").write_text(script)
    # Run it as `$WITH_CONDA` would: the base's command activates the env.
    proc = subprocess.run(
        ["bash", "-c", f'. {tmp_path}/with-conda.sh; echo "$CONDA_PREFIX|$PATH"'],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    )
    conda_prefix, path = proc.stdout.strip().split("|")
    assert conda_prefix == str(env)
    assert path.split(":")[0] == f"{env}/bin"
    # A base built by cotainr-lumi: its chained command is kept, never a
    # script that sources itself.
    (root / "opt/cotainr-lumi").mkdir(parents=True)
    (root / "opt/cotainr-lumi/with-conda.sh").write_text(script)
    again = imagefiles.base_with_conda(
        root=root,
        target=SimpleNamespace(with_conda=". /opt/cotainr-lumi/with-conda.sh"),
    )
    assert again == base_value
    assert (
        imagefiles.base_with_conda(root=root, target=SimpleNamespace(with_conda=""))
        is None
    )


def test_a_multi_line_base_with_conda_is_chained_as_it_is_even_on_a_rebuild(tmp_path):
    """A newline in the base's $WITH_CONDA stays a newline (issue 22)."""
    env, activate = _write_fake_conda(tmp_path)
    base_value = f"{activate}\nexport CHAINED='a\\b'"
    root = make_root(tmp_path, venv=False)
    script, _ = imagefiles.with_conda_script(
        root=root,
        target=TargetEnv(prefix=str(env), python=f"{env}/bin/python"),
        base_with_conda=imagefiles.base_with_conda(
            root=root, target=SimpleNamespace(with_conda=base_value)
        ),
    )
    (root / "opt/cotainr-lumi").mkdir(parents=True)
    (root / "opt/cotainr-lumi/with-conda.sh").write_text(script)
    proc = subprocess.run(
        ["bash", "-c", f'. {root}/opt/cotainr-lumi/with-conda.sh; echo "$CHAINED"'],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert proc.stdout == "a\\b\n"
    again = imagefiles.base_with_conda(
        root=root,
        target=SimpleNamespace(with_conda=". /opt/cotainr-lumi/with-conda.sh"),
    )
    assert again == base_value
    # A with-conda.sh whose chained line was cut (unbalanced quote): no chain,
    # no traceback.
    (root / "opt/cotainr-lumi/with-conda.sh").write_text(
        f"{BASE_WITH_CONDA_MARK}\neval 'source x\n"
    )
    assert (
        imagefiles.base_with_conda(
            root=root,
            target=SimpleNamespace(with_conda=". /opt/cotainr-lumi/with-conda.sh"),
        )
        is None
    )


def test_the_user_venv_comes_first_on_pythonpath_when_the_image_uses_it(tmp_path):
    # LUMI AI Factory images expose /opt/venv through PYTHONPATH, which comes
    # before a venv's own site-packages: the user venv's copy must win.
    root, _, _ = run_stage(tmp_path, {"user-venv": "/user-software/venv/pytorch"})
    venv = tmp_path / "user venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    image_site = "/opt/venv/lib/python3.12/site-packages"
    env = {"COTAINR_LUMI_USER_VENV": str(venv), "PYTHONPATH": image_site}
    got = source_env(root, env=env)
    assert got["PYTHONPATH"] == f"{site}:{image_site}"
    assert got["VIRTUAL_ENV"] == str(venv)
    # Sourced twice (with-conda.sh, a nested shell): added once.
    twice = subprocess.run(
        ["bash", "-c", '. "$1"; . "$1"; printf %s "$PYTHONPATH"', "bash"]
        + [str(root / ENV_FILE.lstrip("/"))],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert twice.stdout == f"{site}:{image_site}"
    # No PYTHONPATH: none is made up.
    assert "PYTHONPATH" not in source_env(
        root, env={"COTAINR_LUMI_USER_VENV": str(venv)}
    )


@pytest.mark.parametrize(
    "env",
    [
        {"HF_TOKEN": "hf_x", "A": "1", "WANDB_API_KEY": "k"},
        {"AWS_SECRET_ACCESS_KEY": "z"},
        {"MLFLOW_TRACKING_PASSWORD": "p"},
        {"github_token": "t"},
        {"PIP_INDEX_URL": "https://user:pw@idx.example.org/simple"},
    ],
)
def test_secrets_in_the_image_env_are_one_error_unless_allowed(env, tmp_path):
    request = BuildRequest(
        image_path=tmp_path / "x.sif",
        base_image="docker://debian",
        settings={"lumi-env": {"env": env, "module-file": False}},
    )
    with pytest.raises(InputError) as info:
        make_plan(request=request)
    text = str(info.value)
    names = [n for n in env if n != "A"]
    assert text.startswith(f"lumi-env: {', '.join(names)} would keep a secret")
    assert (
        f"export SINGULARITYENV_{names[0]}=... (or APPTAINERENV_{names[0]}=...)" in text
    )
    assert f"--set lumi-env.allow-secret-env=[{','.join(names)}]." in text
    request.settings["lumi-env"]["allow-secret-env"] = names
    assert make_plan(request=request).stages[0].env == env


def test_names_that_only_look_alike_and_unset_secrets_are_kept():
    env = {"TOKENIZERS_PARALLELISM": "false", "MONKEY": "1", "HF_TOKEN": None}
    assert LumiEnvStage(settings={"env": env}).env == {
        "TOKENIZERS_PARALLELISM": "false",
        "MONKEY": "1",
    }
