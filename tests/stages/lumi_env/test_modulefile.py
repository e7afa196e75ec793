"""Tests of cotainr_lumi.stages.lumi_env.modulefile: the Lmod module file and shell snippet."""

import os
from pathlib import Path
import subprocess
from types import SimpleNamespace

from hosttools import LMOD_INIT, need_lmod, need_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from cotainr_lumi.engine.targetenv import TargetEnv
from cotainr_lumi.stages.lumi_env.modulefile import (
    MARKER,
    LayerBase,
    module_ops,
    module_outputs,
    wrapper_names,
)
from cotainr_lumi.stages.lumi_env.mpi import plan_mpi
from cotainr_lumi.stages.lumi_env.ops import lua_quote, render
from cotainr_lumi.stages.lumi_env.settings import LumiEnvSettings, ModuleNames
from cotainr_lumi.stages.lumi_env.validators import (
    check_image_path,
    check_var_name,
    validate_bind,
    var_name_of,
)

BINDS = ["/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1", "/pfs", "/scratch"]


def names(name, root=None):
    """The module's names as the settings derive them (`root`: CONTAINERROOT)."""
    venv = f"/user-software/venv/{name}"
    root = root or Path(f"/x/{name}.root")
    return ModuleNames(name, var_name_of(name), venv, None, None, root)


def lmod_env(module_dir, name, *, env=None, unload=False):
    """Load a module in real Lmod and return the resulting environment."""
    need_lmod()
    script = f'source {LMOD_INIT} && module use "$1" && module load "$2"'
    if unload:
        script += ' && module unload "$2"'
    script += " && env -0"
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(module_dir), name],
        env={"PATH": os.environ["PATH"], "HOME": str(module_dir), **(env or {})},
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"error" not in proc.stderr.lower(), proc.stderr.decode()
    return dict(e.decode().partition("=")[::2] for e in proc.stdout.split(b"\0") if e)


PRINTABLE_PATH = st.text(
    st.characters(
        min_codepoint=0x20, max_codepoint=0x2FF, blacklist_categories=("Cc",)
    ),
    min_size=1,
    max_size=20,
).map(lambda s: "/images/" + s.replace("/", "_") + ".sif")


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=30))
def test_lua_quote_round_trips_in_real_lua(text):
    lua = need_tool("lua5.4", "lua5.3", "lua", install="apt-get install -y lmod")
    proc = subprocess.run(
        [lua, "-e", f"io.write({lua_quote(text)})"], capture_output=True, check=True
    )
    assert proc.stdout == text.encode("utf-8", "surrogatepass")


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(image=PRINTABLE_PATH)
def test_module_file_loads_in_lmod_with_hostile_paths(tmp_path, image):
    marker = tmp_path / "PWNED"
    image = image.replace("X", f"$(touch {marker})`touch {marker}`")
    (tmp_path / "img.lua").write_text(
        render(module_ops(image=image, binds=BINDS, names=names("img")), language="lua")
    )
    env = lmod_env(tmp_path, "img")
    assert env["SIF"] == image
    assert env["SINGULARITY_BIND"] == ",".join(BINDS)
    assert env["RUNSCRIPTS"] == "/x/img.root/runscripts"
    assert env["SINGULARITYENV_PREPEND_PATH"] == "/runscripts"
    assert not marker.exists()


def test_module_file_keeps_existing_binds_and_unloads_cleanly(tmp_path):
    (tmp_path / "img.lua").write_text(
        render(
            module_ops(image="/x/img.sif", binds=BINDS, names=names("img")),
            language="lua",
        )
    )
    env = lmod_env(tmp_path, "img", env={"SINGULARITY_BIND": "/mine,/pfs"})
    binds = env["SINGULARITY_BIND"].split(",")
    assert binds.count("/pfs") == 1 and "/mine" in binds
    assert set(BINDS) <= set(binds)
    after = lmod_env(
        tmp_path, "img", env={"SINGULARITY_BIND": "/mine,/pfs"}, unload=True
    )
    assert "SIF" not in after
    assert set(after["SINGULARITY_BIND"].split(",")) == {"/mine", "/pfs"}


def test_shell_snippet_sets_the_same_variables(tmp_path):
    image = "/x/it's $(touch " + str(tmp_path / "PWNED") + ").sif"
    snippet = tmp_path / "img.sh"
    snippet.write_text(
        render(module_ops(image=image, binds=BINDS, names=names("img")), language="sh")
    )
    for shell in ("bash", "sh"):
        proc = subprocess.run(
            [shell, "-c", '. "$1"; . "$1"; env -0', "sh", str(snippet)],
            env={"PATH": os.environ["PATH"], "SINGULARITY_BIND": "/mine,/pfs"},
            capture_output=True,
            check=True,
        )
        env = dict(
            e.decode().partition("=")[::2] for e in proc.stdout.split(b"\0") if e
        )
        assert env["SIF"] == image
        assert env["SINGULARITY_BIND"] == "/mine,/pfs," + ",".join(
            b for b in BINDS if b != "/pfs"
        )
        assert env["RUNSCRIPTS"] == "/x/img.root/runscripts"
        assert env["SINGULARITYENV_PREPEND_PATH"] == "/runscripts"
    assert not (tmp_path / "PWNED").exists()


def test_no_runscripts_means_no_runscripts_variables():
    ops = module_ops(
        image="/x/a.sif",
        binds=[],
        names=names("a"),
        runscripts=None,
        user_software=False,
    )
    text = render(ops, language="lua")
    assert 'setenv("RUNSCRIPTS"' not in text and "append_path" not in text
    assert 'setenv("RUNSCRIPTSA"' not in text
    assert 'prepend_path("SINGULARITYENV_PREPEND_PATH"' not in text
    assert 'setenv("SIF", "/x/a.sif")' in text
    shell = render(ops, language="sh")
    assert "RUNSCRIPTS=" not in shell and "SINGULARITY_BIND" not in shell
    assert "RUNSCRIPTSA=" not in shell
    assert "SIF=/x/a.sif; export SIF" in shell


@pytest.mark.parametrize("bind", ["relative", "/a,/b", "/a b", "/a\nb", "", None])
def test_bad_binds_are_rejected(bind):
    with pytest.raises(ValueError):
        validate_bind(bind)


@pytest.mark.parametrize("image", ["relative.sif", "/a\nb.sif", "/a\tb.sif"])
def test_unwritable_image_paths_are_rejected(image):
    with pytest.raises(ValueError):
        check_image_path(image)


def test_var_name_of_follows_easybuild_style():
    assert var_name_of("pytorch") == "PYTORCH"
    assert var_name_of("my-torch.2") == "MY_TORCH_2"
    assert var_name_of("2x") == "IMAGE_2X"
    assert var_name_of("---") == "IMAGE"
    with pytest.raises(ValueError, match="upper case"):
        check_var_name("pytorch")


def _lust_env(tmp_path, *, squashfs):
    root = tmp_path / "pt.root"
    (root / "user-software").mkdir(parents=True)
    if squashfs:
        (root / "user-software.squashfs").write_bytes(b"")
    mods = tmp_path / "mods"
    mods.mkdir(exist_ok=True)
    (mods / "pt.lua").write_text(
        render(
            module_ops(image="/x/pt.sif", binds=BINDS, names=names("pt", root)),
            language="lua",
        )
    )
    return root, mods


@pytest.mark.parametrize("squashfs", [False, True])
def test_module_file_is_a_drop_in_for_lusts_module(tmp_path, squashfs):
    root, mods = _lust_env(tmp_path, squashfs=squashfs)
    before = {"SINGULARITYENV_PREPEND_PATH": "/mine", "PATH": os.environ["PATH"]}
    env = lmod_env(mods, "pt", env=before)
    assert env["SIF"] == env["SIFPT"] == "/x/pt.sif"
    assert env["CONTAINERROOT"] == env["EBROOTPT"] == str(root)
    assert env["RUNSCRIPTS"] == env["RUNSCRIPTSPT"] == str(root / "runscripts")
    # Prepended, never overwritten.
    assert env["SINGULARITYENV_PREPEND_PATH"] == "/runscripts:/mine"
    assert env["PATH"].split(":")[0] == str(root / "bin")
    user_bind = (
        f"{root}/user-software.squashfs:/user-software:image-src=//"
        if squashfs
        else f"{root}/user-software:/user-software"
    )
    assert env["SINGULARITY_BIND"].split(",") == [user_bind, *BINDS]
    after = lmod_env(mods, "pt", env=before, unload=True)
    assert after["SINGULARITYENV_PREPEND_PATH"] == "/mine"
    assert "CONTAINERROOT" not in after and "SIFPT" not in after


@pytest.mark.parametrize("squashfs", [False, True])
def test_shell_snippet_is_the_same_drop_in(tmp_path, squashfs):
    root, _ = _lust_env(tmp_path, squashfs=squashfs)
    snippet = tmp_path / "pt.sh"
    snippet.write_text(
        render(
            module_ops(image="/x/pt.sif", binds=BINDS, names=names("pt", root)),
            language="sh",
        )
    )
    proc = subprocess.run(
        ["sh", "-c", '. "$1"; . "$1"; env -0', "sh", str(snippet)],
        env={"PATH": os.environ["PATH"], "SINGULARITYENV_PREPEND_PATH": "/mine"},
        capture_output=True,
        check=True,
    )
    env = dict(e.decode().partition("=")[::2] for e in proc.stdout.split(b"\0") if e)
    assert env["SIFPT"] == "/x/pt.sif" and env["EBROOTPT"] == str(root)
    assert env["SINGULARITYENV_PREPEND_PATH"] == "/runscripts:/mine"
    assert env["PATH"].split(":").count(str(root / "bin")) == 1
    suffix = ".squashfs:/user-software:image-src=/" if squashfs else ":/user-software"
    assert env["SINGULARITY_BIND"].split(",")[0] == f"{root}/user-software{suffix}"


def test_wrappers_are_the_commands_the_target_env_has(tmp_path):
    """LUST's set, X.Y from the env's Python; links resolved inside the image."""
    root = tmp_path / "sandbox"
    bin_dir = root / "opt/env/bin"
    bin_dir.mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.12").write_text("")
    (bin_dir / "python").symlink_to("/usr/bin/python3.12")  # inside the image
    (bin_dir / "python3.12").symlink_to("python")
    for name in ("pip", "pip3.12", "torchrun", "hf", "conda"):
        (bin_dir / name).write_text("#!/bin/sh\n")
    (bin_dir / "python3").symlink_to("/nowhere")  # dangling: no wrapper
    (bin_dir / "ray").mkdir()  # not a command
    target = TargetEnv(
        prefix="/opt/env", python="/opt/env/bin/python", version="3.12.4"
    )
    names = wrapper_names(root=root, target=target)
    assert names == ["python", "python3.12", "pip", "pip3.12", "torchrun"]
    assert wrapper_names(root=root, target=None) == []

    image = tmp_path / "out/pt.sif"
    settings = LumiEnvSettings.complete({"module-dir": str(tmp_path / "mods")})
    mpi = plan_mpi(root=root, target=None, requested="none", host_setting={}, stage="x")
    croot = settings.names(image_path=image).root
    outputs = module_outputs(
        settings=settings,
        names=settings.names(image_path=image),
        image_path=image,
        binds=[],
        user_software=True,
        mpi=mpi,
        wrappers=names,
    )
    script = outputs[croot / "bin" / "python"]
    for name in names:  # copies of one script (it runs the name it is called by)
        assert outputs[croot / "bin" / name] == script
    assert (
        "${0##*/}" in script and f"default_sif={image}" in script and MARKER in script
    )
    lua = outputs[tmp_path / "mods/pt.lua"]
    assert "wrappers of the image's python, pip, torchrun, ..." in lua
    assert not any(str(p).endswith(("/python3", "/ray", "/hf")) for p in outputs)


def test_a_layer_only_image_is_mounted_on_its_base_in_lmod_and_sh(tmp_path):
    """--layer-only: SIF is the base, the runtimes' *_OVERLAY the layer (quoted)."""
    layer = "/x/it's $(touch " + str(tmp_path / "PWNED") + ") layer.sqfs"
    base = f'{tmp_path}/"big" `touch {tmp_path / "PWNED"}` $(touch ..).sif'
    Path(base).parent.mkdir(parents=True)
    Path(base).write_text("the base")
    on_base = LayerBase.of(SimpleNamespace(resolved=base, pinned=None))
    ops = module_ops(image=layer, binds=BINDS, names=names("img"), base=on_base)
    (tmp_path / "img.lua").write_text(render(ops, language="lua"))
    (tmp_path / "img.sh").write_text(render(ops, language="sh"))
    snippet = subprocess.run(
        ["sh", "-c", '. "$1"; env -0', "sh", str(tmp_path / "img.sh")],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        check=True,
    ).stdout
    shell = dict(e.decode().partition("=")[::2] for e in snippet.split(b"\0") if e)
    for env in (lmod_env(tmp_path, "img"), shell):
        assert env["SIF"] == env["SIFIMG"] == base
        assert env["APPTAINER_OVERLAY"] == env["SINGULARITY_OVERLAY"] == layer + ":ro"
    assert not (tmp_path / "PWNED").exists()
    assert "OVERLAY" not in render(
        module_ops(image=layer, binds=[], names=names("img")), language="sh"
    )


def test_a_layer_only_module_and_snippet_stop_on_another_base(tmp_path):
    """Size and mtime (``stat -L -c '%s %Y'``) of the base the layer was built on."""
    need_lmod()
    base = tmp_path / "it's base.sif"
    base.write_text("the base")
    on_base = LayerBase.of(SimpleNamespace(resolved=str(base), pinned=None))
    ops = module_ops(
        image=tmp_path / "my.sqfs",
        binds=[],
        names=names("my"),
        runscripts=None,
        base=on_base,
    )
    (tmp_path / "my.lua").write_text(render(ops, language="lua"))
    (tmp_path / "my.sh").write_text(render(ops, language="sh"))
    snippet = ["sh", "-c", '. "$1" && printf %s "$SIF"', "sh", tmp_path / "my.sh"]
    assert lmod_env(tmp_path, "my")["SIF"] == str(base)
    assert subprocess.run(snippet, capture_output=True, text=True).stdout == str(base)
    base.write_text("another base")
    os.utime(base, (1, 1))
    script = f'source {LMOD_INIT} && module use "$1" && module load my && echo LOADED'
    lmod = ["bash", "-c", script, "bash", tmp_path]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for cmd in (lmod, snippet):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert proc.returncode != 0 and "LOADED" not in proc.stdout, proc.stdout
        assert str(base) not in proc.stdout  # SIF is not set
        needle = f"the base image {base} is not the one the layer"
        assert " ".join(proc.stderr.split()).count(needle) == 1, proc.stderr
