import json
import os

import pytest

from cotainr_lumi import apptainer
from cotainr_lumi.errors import InputError


def test_exec_command_is_spelled_once():
    argv = apptainer.exec_command(
        runtime="/bin/apptainer", image="/x.sif", args=["python", "-c", "1"]
    )
    assert argv == [
        "/bin/apptainer",
        "exec",
        "--no-home",
        "--cleanenv",
        "/x.sif",
        "python",
        "-c",
        "1",
    ]
    argv = apptainer.exec_command(
        runtime="s", image="/x.sif", args=["env"], clean_env=False, env={"A": "1 2"}
    )
    assert argv == ["s", "exec", "--no-home", "--env", "A=1 2", "/x.sif", "env"]


def fake_runtime(directory, name):
    """An executable NAME printing its argv and stdin as JSON."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'stdin': sys.stdin.read()}))\n"
    )
    path.chmod(0o755)
    return path


def test_apptainer_is_preferred_to_singularity(tmp_path, monkeypatch):
    # PATH holds only the fakes: a real apptainer on the host's PATH (CI
    # provisions one) must not take part.
    singularity = fake_runtime(tmp_path / "a", "singularity")
    monkeypatch.setenv("PATH", str(singularity.parent))
    assert apptainer.find_runtime() == str(singularity)
    app = fake_runtime(tmp_path / "b", "apptainer")
    monkeypatch.setenv("PATH", f"{singularity.parent}{os.pathsep}{app.parent}")
    assert apptainer.runtime() == str(app)


def test_no_runtime_is_none_or_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert apptainer.find_runtime() is None
    with pytest.raises(InputError, match="Neither 'apptainer' nor 'singularity'"):
        apptainer.exec_in_image(image=tmp_path / "x.sif", args=["true"])


def test_exec_in_image_runs_the_command_line_with_empty_stdin(tmp_path, monkeypatch):
    app = fake_runtime(tmp_path / "bin", "apptainer")
    monkeypatch.setenv("PATH", f"{app.parent}{os.pathsep}{os.environ['PATH']}")
    proc = apptainer.exec_in_image(image=tmp_path / "x.sif", args=["a b"])
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {
        "argv": ["exec", "--no-home", "--cleanenv", str(tmp_path / "x.sif"), "a b"],
        "stdin": "",
    }
