"""The shim on cotainr releases that change: stock cotainr never breaks.

Each test copies the installed cotainr, changes it as a future release
might, puts the copy first on ``PYTHONPATH`` and runs the real ``cotainr``
command (the start-up hook and the shim included) with a fake
``singularity`` on ``PATH``.
"""

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import cotainr
import errorlines
import pytest

COTAINR = Path(sys.executable).parent / "cotainr"
FAKE_SINGULARITY = r"""#!/bin/bash
# build [--sandbox] ... TARGET SOURCE / exec ... SANDBOX CMD...
args=("$@")
if [[ " $* " == *" build "* ]]; then
    target=${args[-2]} source=${args[-1]}
    if [[ " $* " == *" --sandbox "* ]]; then
        mkdir -p "$target/.singularity.d/env"
        echo '{"org.label-schema.build-arch": "amd64", "base": "a long base label value"}' \
            > "$target/.singularity.d/labels.json"
    else
        { echo FAKE-SIF; cat "$source/.singularity.d/labels.json"; } > "$target"
    fi
    exit 0
fi
if [[ " $* " == *" exec "* ]]; then
    [[ " $* " == *" uname -m"* ]] && echo x86_64
    exit 0
fi
[[ "$1" == --version ]] && echo "apptainer version 1.4.5"
[[ "$1" == sif ]] && { echo "FATAL: no sif tool in this fake" >&2; exit 1; }
exit 0
"""


def change(tree, module, old, new):
    path = tree / "cotainr" / f"{module}.py"
    text = path.read_text()
    assert old in text, f"{old!r} not in cotainr/{module}.py"
    path.write_text(text.replace(old, new))


NEW_OPTION = [
    (  # the last parameter of Build.__init__ (whatever it is: a patch adds some)
        "cli",
        '    ):\n        """Construct the "build" subcommand."""',
        '        foo=None,\n    ):\n        """Construct the "build" subcommand."""',
    ),
    (
        "cli",
        '        parser.add_argument(\n            "--no-color",',
        '        parser.add_argument("--foo")\n'
        '        parser.add_argument(\n            "--no-color",',
    ),
]
RENAMED_METADATA = [
    ("container", "def add_metadata(self):", "def add_labels(self):"),
    ("cli", "sandbox.add_metadata()", "sandbox.add_labels()"),
]
NO_METADATA_STEP = [("cli", "sandbox.add_metadata()", "pass")]
RENAMED_IMAGE_PATH = [
    (
        "cli",
        "        image_path,\n        base_image=None,",
        "        image,\n        base_image=None,",
    ),
    ("cli", "self.image_path = Path(image_path)", "self.image_path = Path(image)"),
    ("cli", '            "image_path",\n', '            "image",\n'),
]


@pytest.fixture
def future(tmp_path, test_profile):
    """Run the `cotainr` command on a changed copy of cotainr."""
    tree = tmp_path / "future-cotainr"
    shutil.copytree(Path(cotainr.__file__).parent, tree / "cotainr")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("singularity", "apptainer"):  # whatever else is on PATH
        (bindir / name).write_text(FAKE_SINGULARITY)
        (bindir / name).chmod(0o755)

    def run(*args, changes=()):
        for module, old, new in changes:
            change(tree, module, old, new)
        changes = ()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("COTAINR_DISABLE_PLUGINS", "COTAINR_LUMI_DISABLE")
        }
        env.update(  # the changed cotainr first, then the cotainr-lumi under test
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(tree), env.get("PYTHONPATH")])
            ),
            PATH=f"{bindir}:{env['PATH']}",
            COTAINR_LUMI_SYSTEMS=str(test_profile),
        )
        return subprocess.run(
            [str(COTAINR), *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    return run


def labels(image):
    return json.loads(Path(image).read_text().split("\n", 1)[1])


def stock_build_works(run, tmp_path, base_image, *extra):
    out = run("build", tmp_path / "stock.sif", f"--base-image={base_image}", *extra)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert labels(tmp_path / "stock.sif")["cotainr.url"]
    info = run("info")
    assert info.returncode == 0 and "System info" in info.stdout
    assert "lumi-test" not in info.stdout  # no plugin is loaded for info


def one_error(out, *needles):
    assert out.returncode == 1 and "Traceback" not in out.stderr
    errorlines.one_error(out.stderr, *needles)


def test_today_stock_and_lumi_builds(future, tmp_path, base_image):
    stock_build_works(future, tmp_path, base_image)
    out = future("build", tmp_path / "x.sif", "--system=lumi-test")
    assert out.returncode == 0, out.stderr
    assert labels(tmp_path / "x.sif")["cotainr-lumi.system"] == "lumi-test"


def test_a_new_build_option(future, tmp_path, base_image):
    """Adding one option to cotainr's build made every build crash before."""
    future("info", changes=NEW_OPTION)
    stock_build_works(future, tmp_path, base_image, "--foo=1")
    out = future("build", tmp_path / "x.sif", "--system=lumi-test", "--foo=2")
    assert out.returncode == 0, out.stderr
    assert labels(tmp_path / "x.sif")["cotainr-lumi.system"] == "lumi-test"


def test_a_renamed_internal(future, tmp_path, base_image):
    future("info", changes=RENAMED_METADATA)
    stock_build_works(future, tmp_path, base_image)
    out = future("build", tmp_path / "x.sif", "--system=lumi-test")
    version = cotainr.__version__
    one_error(out, f"cotainr {version}", "add_metadata", "Install a cotainr-lumi")
    assert not (tmp_path / "x.sif").exists()


def test_a_build_that_no_longer_adds_metadata(future, tmp_path, base_image):
    future("info", changes=NO_METADATA_STEP)
    out = future("build", tmp_path / "stock.sif", f"--base-image={base_image}")
    assert out.returncode == 0, out.stderr
    out = future("build", tmp_path / "x.sif", "--system=lumi-test")
    one_error(out, "add_metadata, then build_image", "Install a cotainr-lumi")
    assert not list(tmp_path.glob("*x.sif*"))


def test_a_changed_build_signature(future, tmp_path, base_image):
    future("info", changes=RENAMED_IMAGE_PATH)
    stock_build_works(future, tmp_path, base_image)
    out = future("build", tmp_path / "x.sif", "--system=lumi-test")
    one_error(out, "Build.__init__(image_path=...)", "Install a cotainr-lumi")


def test_a_broken_cotainr_breaks_no_other_python(future, tmp_path):
    future("info", changes=[("util", "import json", "import json_is_gone")])
    out = future("info")
    assert out.returncode != 0  # cotainr itself is broken: its own traceback
    assert "cotainr plugin" not in out.stderr
    other = subprocess.run(
        [sys.executable, "-c", "import json; print('ok')"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tmp_path / "future-cotainr")),
        check=False,
    )
    assert other.stdout == "ok\n" and other.stderr == ""


def test_piped_answers_still_work_and_eof_names_force(future, tmp_path, base_image):
    image = tmp_path / "x.sif"
    image.write_text("precious")
    out = future("build", image, "--system=lumi-test")
    # One line naming --force: the shim's, or cotainr's own where it has --force.
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert [ln for ln in out.stderr.splitlines() if "--force" in ln] == [
        out.stderr.strip()
    ]
    assert image.read_text() == "precious"
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    piped = subprocess.run(
        f"echo yes | {COTAINR} build {image} --system=lumi-test",
        shell=True,
        capture_output=True,
        text=True,
        env=dict(env, COTAINR_LUMI_SYSTEMS=os.environ["COTAINR_LUMI_SYSTEMS"]),
        cwd=tmp_path,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert labels(image)["cotainr-lumi.system"] == "lumi-test"


def test_the_recorded_command_line_holds_no_credentials(future, tmp_path):
    # A path that reads as a URL with a password stands in for any argument.
    image = tmp_path / "https:" / "user:s3cret@example.org" / "x.sif"
    image.parent.mkdir(parents=True)
    argument = str(image).replace("https:/", "https://")
    out = future("build", argument, "--system=lumi-test")
    assert out.returncode == 0, out.stderr
    command = labels(image)["cotainr.command"]
    assert "user:***@example.org" in command and "s3cret" not in command
