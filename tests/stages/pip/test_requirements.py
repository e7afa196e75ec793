"""Unit tests of cotainr_lumi.stages.pip.requirements (requirement files: checks and staging)."""

import os
from pathlib import Path
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from cotainr_lumi.errors import InputError, StageError
from cotainr_lumi.stages.pip.requirements import (
    StagedStep,
    moving_vcs_ref,
    scan_step,
)
from cotainr_lumi.stages.pip.steps import PipStep

KEEP = "/opt/cotainr-lumi/pip/step1"
STAGING = "/opt/cotainr-lumi/.pip-work/staging/step1"


@pytest.fixture
def project(tmp_path):
    """A user's directory with requirement files and local artefacts."""
    src = tmp_path / "src"
    (src / "wheels").mkdir(parents=True)
    (src / "wheels" / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (src / "dist").mkdir()
    (src / "dist" / "other-2.0.tar.gz").write_bytes(b"sdist")
    (src / "proj").mkdir()
    (src / "proj" / "pyproject.toml").write_text("[project]\nname='proj'\n")
    (src / "links").mkdir()
    (src / "links" / "x-1-py3-none-any.whl").write_bytes(b"x")
    (src / "sub").mkdir()
    (src / "sub" / "base.txt").write_text("numpy<3  # pinned\n-c ../constraints.txt\n")
    (src / "constraints.txt").write_text("numpy>=1.26\n")
    return src


def _step(tmp_path, *, requirements=(), packages=(), base_dir=None):
    return PipStep(
        number=1,
        source="test",
        requirements=[Path(r) for r in requirements],
        packages=list(packages),
        base_dir=base_dir or tmp_path,
    )


def test_scan_and_stage_rewrites_every_local_reference(tmp_path, project):
    req = project / "requirements.txt"
    req.write_text(
        "# a comment\n"
        "-r sub/base.txt\n"
        "./wheels/demo-1.0-py3-none-any.whl\n"
        "dist/other-2.0.tar.gz --hash=sha256:abc\n"
        "./proj[extra] ; python_version >= '3.9'\n"
        "--find-links links\n"
        f"proj @ file://{project / 'proj'}\n"
        "torch==2.13.0 \\\n"
        "   --hash=sha256:def\n"
        "requests @ https://example.org/requests-2.0-py3-none-any.whl\n"
        "git+https://github.com/ROCm/apex.git@master#egg=apex\n"
        "--extra-index-url https://download.pytorch.org/whl/rocm6.2\n"
    )
    scan = scan_step(step=_step(tmp_path, requirements=[req]))
    inputs = scan.local_inputs
    assert str(project / "wheels" / "demo-1.0-py3-none-any.whl") in inputs
    assert str(project / "proj") in inputs

    root = tmp_path / "sandbox"
    root.mkdir()
    staged = StagedStep(scan=scan, root=root, keep_dir=KEEP, staging_dir=STAGING)
    assert staged.requirement_files == [f"{KEEP}/requirements.txt"]
    assert set(staged.kept_files) == {
        f"{KEEP}/requirements.txt",
        f"{KEEP}/base.txt",
        f"{KEEP}/constraints.txt",
    }
    lines = (root / KEEP.lstrip("/") / "requirements.txt").read_text().splitlines()
    # Line numbers are kept (pip's "(line N)" still points at the user's file).
    assert len(lines) == 12
    assert lines[0] == "# a comment"
    assert lines[1].startswith(f"-r {KEEP}/base.txt")
    assert lines[2].startswith(
        f"{STAGING}/1/demo-1.0-py3-none-any.whl  # cotainr-lumi: was "
    )
    assert lines[3].startswith(f"{STAGING}/2/other-2.0.tar.gz --hash=sha256:abc")
    assert lines[4].startswith(f"{STAGING}/3/proj[extra] ; python_version >= '3.9'")
    assert lines[5].startswith(f"--find-links {STAGING}/4/links")
    # The same project directory is staged once.
    assert lines[6].startswith(f"proj @ file://{STAGING}/3/proj")
    assert lines[7:9] == ["torch==2.13.0 \\", "   --hash=sha256:def"]
    assert lines[9] == "requests @ https://example.org/requests-2.0-py3-none-any.whl"
    base = (root / KEEP.lstrip("/") / "base.txt").read_text().splitlines()
    assert base == [
        "numpy<3  # pinned",
        f"-c {KEEP}/constraints.txt  # cotainr-lumi: was ../constraints.txt",
    ]

    wheel = root / STAGING.lstrip("/") / "1" / "demo-1.0-py3-none-any.whl"
    # Files are mounted read-only where pip reads them (an empty file to mount
    # on), directories copied.
    assert wheel.read_bytes() == b""
    host_wheel = project / "wheels" / "demo-1.0-py3-none-any.whl"
    assert f"{host_wheel}:{STAGING}/1/demo-1.0-py3-none-any.whl:ro" in staged.binds
    assert (root / STAGING.lstrip("/") / "3" / "proj" / "pyproject.toml").is_file()
    assert not os.path.samefile(
        root / STAGING.lstrip("/") / "3" / "proj" / "pyproject.toml",
        project / "proj" / "pyproject.toml",
    )
    assert staged.staged[f"{STAGING}/1/demo-1.0-py3-none-any.whl"] == str(
        project / "wheels" / "demo-1.0-py3-none-any.whl"
    )


def _stage_one_line(tmp_path, project, line):
    """(the sandbox, the StagedStep) of a requirements file of one `line`."""
    req = project / "r.txt"
    req.write_text(f"{line}\n")
    root = tmp_path / "sandbox"
    staged = StagedStep(
        scan=scan_step(step=_step(tmp_path, requirements=[req])),
        root=root,
        keep_dir=KEEP,
        staging_dir=STAGING,
    )
    return root, staged


def test_symlinked_wheel_is_staged_as_its_target(tmp_path, project):
    real = project / "wheels" / "demo-1.0-py3-none-any.whl"
    (project / "linked").mkdir()
    link = project / "linked" / real.name
    link.symlink_to(real)
    root, staged = _stage_one_line(tmp_path, project, f"linked/{real.name}")
    target = root / STAGING.lstrip("/") / "1" / real.name
    assert not target.is_symlink()
    assert staged.binds == [f"{real}:{STAGING}/1/{real.name}:ro"]
    assert staged.requirement_files == [f"{KEEP}/r.txt"]


def test_a_file_whose_path_cannot_be_mounted_is_linked(tmp_path, project):
    odd = project / "a,b"
    odd.mkdir()
    real = odd / "demo-1.0-py3-none-any.whl"
    real.write_bytes(b"wheel")
    root, staged = _stage_one_line(tmp_path, project, f"a,b/{real.name}")
    assert staged.binds == []
    assert os.path.samefile(root / STAGING.lstrip("/") / "1" / real.name, real)


def test_inline_packages_are_relative_to_the_base_dir(tmp_path, project):
    step = _step(tmp_path, packages=["./proj", "deepspeed==0.16.4"], base_dir=project)
    root = tmp_path / "sandbox"
    staged = StagedStep(
        scan=scan_step(step=step), root=root, keep_dir=KEEP, staging_dir=STAGING
    )
    assert staged.requirement_files == [f"{KEEP}/packages.txt"]
    text = (root / KEEP.lstrip("/") / "packages.txt").read_text().splitlines()
    assert text[0].startswith(f"{STAGING}/1/proj")
    assert text[1] == "deepspeed==0.16.4"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("numpy\n./missing.whl\n", "line 2: ./missing.whl:"),
        ("-e ./proj\n", "line 1: editable installs"),
        ("--editable=git+https://x/y.git#egg=y\n", "editable installs"),
        ("-r nothere.txt\n", "line 1: nothere.txt:"),
        ("./notaproject\n", "is not a Python project"),
        ("./README\n", "neither a wheel nor an sdist"),
        ("file:relative/x.whl\n", "only absolute file: URLs"),
        ("numpy>>1\n", "invalid requirement 'numpy>>1'"),
        ("./wheels/${VERSION}.whl\n", "cannot be staged"),
        ("-r loop.txt\n", "cycle"),
        ("-c /no/such/host/constraints.txt\n", "does not exist on this machine"),
        # malformed URLs: an InputError with file and line, not a ValueError
        (
            "numpy\ngit+https://[x/y.git\n",
            "line 2: git+https://[x/y.git is not a valid URL",
        ),
        ("pkg @ file://[::1/x.whl\n", "line 1: file://[::1/x.whl is not a valid URL"),
        ("file://[::1/x.whl\n", "line 1: file://[::1/x.whl is not a valid URL"),
        ("pkg @ git+https://[x/y.git\n", "line 1: git+https://[x/y.git is not a valid"),
        ("pkg @ https://[x/y.whl\n", "line 1: https://[x/y.whl is not a valid URL"),
    ],
)
def test_bad_references_name_file_and_line(tmp_path, project, content, fragment):
    (project / "notaproject").mkdir()
    (project / "README").write_text("hi")
    req = project / "loop.txt"
    req.write_text(content)
    with pytest.raises(InputError) as info:
        scan_step(step=_step(tmp_path, requirements=[req]))
    assert str(req) in str(info.value)
    assert fragment in str(info.value)


def test_absolute_path_missing_on_host_is_looked_up_in_the_image(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("/opt/wheels/apex-1.0-cp311-cp311-linux_x86_64.whl\n")
    scan = scan_step(step=_step(tmp_path, requirements=[req]))
    assert scan.local_inputs == [
        "image:/opt/wheels/apex-1.0-cp311-cp311-linux_x86_64.whl"
    ]
    root = tmp_path / "sandbox"
    with pytest.raises(StageError, match="nor in the image"):
        StagedStep(scan=scan, root=root, keep_dir=KEEP, staging_dir=STAGING)
    wheel = root / "opt/wheels/apex-1.0-cp311-cp311-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"")
    staged = StagedStep(scan=scan, root=root, keep_dir=KEEP, staging_dir=STAGING)
    text = (root / KEEP.lstrip("/") / "r.txt").read_text()
    assert text == "/opt/wheels/apex-1.0-cp311-cp311-linux_x86_64.whl\n"
    assert staged.staged == {}


def test_same_file_names_get_distinct_kept_names(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "requirements.txt").write_text("x\n")
    (tmp_path / "b" / "requirements.txt").write_text("y\n")
    step = _step(
        tmp_path,
        requirements=[
            tmp_path / "a" / "requirements.txt",
            tmp_path / "b" / "requirements.txt",
        ],
    )
    staged = StagedStep(
        scan=scan_step(step=step),
        root=tmp_path / "sb",
        keep_dir=KEEP,
        staging_dir=STAGING,
    )
    assert staged.requirement_files == [
        f"{KEEP}/requirements.txt",
        f"{KEEP}/requirements-2.txt",
    ]


@pytest.mark.parametrize(
    ("url", "moving"),
    [
        ("git+https://github.com/ROCm/apex.git@master", "'master' is a branch"),
        ("git+https://github.com/ROCm/apex.git", "no revision given"),
        ("git+https://github.com/ROCm/apex.git@release/1.5.0", "'release/1.5.0'"),
        ("git+ssh://git@github.com/o/r.git#egg=r", "no revision given"),
        ("git+https://github.com/o/r.git@" + "a" * 40, None),
        ("git+https://github.com/o/r.git@v2.6.3#egg=r", None),
        ("git+https://github.com/o/r.git@2.6.3-cktile", None),
        ("https://example.org/pkg-1.0.tar.gz", None),
    ],
)
def test_moving_vcs_ref(url, moving):
    reason = moving_vcs_ref(url)
    if moving is None:
        assert reason is None
    else:
        assert moving in reason


def test_scan_lists_unpinned_vcs_requirements_with_file_and_line(tmp_path, project):
    (project / "more.txt").write_text(
        "numpy\n"
        "flash_attn @ git+https://github.com/ROCm/flash-attention.git@main\n"
        "git+https://github.com/o/pinned.git@" + "0" * 40 + "#egg=pinned\n"
    )
    (project / "r.txt").write_text("-r more.txt\n")
    step = _step(
        tmp_path,
        requirements=[project / "r.txt"],
        packages=["apex @ git+https://github.com/ROCm/apex.git@master"],
        base_dir=project,
    )
    scan = scan_step(step=step)
    assert len(scan.moving_refs) == 2
    assert scan.moving_refs[0].startswith(f"{project / 'more.txt'}, line 2: ")
    assert "flash-attention.git@main: 'main' is a branch" in scan.moving_refs[0]
    assert (
        ", packages[1]: git+https://github.com/ROCm/apex.git@master"
        in (scan.moving_refs[1])
    )
    assert "pin a commit" in scan.moving_refs[1]


def test_non_utf8_requirements_file_names_step_and_file(tmp_path, project):
    (project / "r.txt").write_text("-r latin1.txt\n")
    (project / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    step = _step(tmp_path, requirements=[project / "r.txt"], base_dir=project)
    with pytest.raises(InputError, match="latin1.txt is not UTF-8 text"):
        scan_step(step=step)


def test_malformed_url_in_inline_packages_names_the_package(tmp_path):
    step = _step(tmp_path, packages=["numpy", "git+https://[x/y.git"])
    with pytest.raises(
        InputError, match=r"packages\[2\]: git\+https://\[x/y.git is not"
    ):
        scan_step(step=step)


def test_moving_vcs_ref_of_a_malformed_url_is_no_traceback():
    assert "not a valid URL" in moving_vcs_ref("git+https://[x/y.git")


def test_very_deep_include_chain_is_one_clear_error(tmp_path):
    depth = 400
    for i in range(depth):
        (tmp_path / f"r{i}.txt").write_text(f"-r r{i + 1}.txt\n")
    (tmp_path / f"r{depth}.txt").write_text("numpy\n")
    with pytest.raises(
        InputError, match="include each other more than 100 levels deep"
    ):
        scan_step(step=_step(tmp_path, requirements=[tmp_path / "r0.txt"]))


def test_include_chain_within_the_limit_is_scanned_and_staged(tmp_path):
    depth = 100
    for i in range(depth):
        (tmp_path / f"r{i}.txt").write_text(f"-r r{i + 1}.txt\n")
    (tmp_path / f"r{depth}.txt").write_text("numpy\n")
    scan = scan_step(step=_step(tmp_path, requirements=[tmp_path / "r0.txt"]))
    root = tmp_path / "root"
    root.mkdir()
    staged = StagedStep(scan=scan, root=root, keep_dir=KEEP, staging_dir=STAGING)
    assert len(staged.kept_files) == depth + 1


# Fuzz: requirement files made of hostile pieces (malformed URLs, options,
# quoting, continuations, local paths, NUL-free control characters). The
# scan gives an InputError or a scan; staging a scan rewrites only lines
# that reference local things, keeps the line count and writes nothing
# outside the sandbox.
REQ_PIECES = st.sampled_from(
    [
        "numpy",
        "numpy>=1.26",
        "torch==2.4 ; python_version>'3'",
        "git+https://[x/y.git",
        "git+https://github.com/a/b.git@v1.2",
        "pkg @ file://[::1/x.whl",
        "pkg @ https://[x/y.whl",
        "file:///abs/x.whl",
        "-r",
        "-c",
        "-f",
        "--find-links",
        "-e",
        "./wheels/demo-1.0-py3-none-any.whl",
        "./proj",
        "../..",
        "sub/base.txt",
        "/etc/passwd",
        "--hash=sha256:abc",
        "'",
        '"',
        "\\",
        "#",
        " ",
        "\t",
        "[",
        "]",
        "@",
        ";",
        "${HOME}",
        "é",
        "\r",
    ]
)
REQ_LINES = st.lists(
    st.lists(REQ_PIECES, min_size=1, max_size=4).map(" ".join), max_size=5
)


@settings(max_examples=80, deadline=None)
@given(lines=REQ_LINES)
def test_fuzz_requirement_files_scan_and_stage_or_one_clear_error(lines):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        (src / "wheels").mkdir(parents=True)
        (src / "wheels" / "demo-1.0-py3-none-any.whl").write_bytes(b"w")
        (src / "proj").mkdir()
        (src / "proj" / "setup.py").write_text("")
        (src / "sub").mkdir()
        (src / "sub" / "base.txt").write_text("numpy\n")
        req = src / "r.txt"
        req.write_text("\n".join(lines) + "\n")
        try:
            scan = scan_step(step=_step(tmp, requirements=[req], base_dir=src))
        except InputError as e:
            # names the file (this one or an included one) and the line
            assert ", line " in str(e) or str(req) in str(e)
            return
        root = tmp / "root"
        root.mkdir()
        before = {p for p in tmp.rglob("*") if not p.is_relative_to(root)}
        try:
            staged = StagedStep(
                scan=scan, root=root, keep_dir=KEEP, staging_dir=STAGING
            )
        except StageError as e:  # an absolute path in neither place, or ..
            assert "nor in the image" in str(e) or "holds the image" in str(e)
            return
        after = {p for p in tmp.rglob("*") if not p.is_relative_to(root)}
        assert after == before  # nothing written outside the sandbox
        kept = root / staged.requirement_files[0].lstrip("/")
        original = req.read_text().splitlines()
        rewritten = kept.read_text().splitlines()
        assert len(rewritten) == len(original)
        changed = {r.start for r in scan.files[0].refs}
        for i, (old, new) in enumerate(zip(original, rewritten)):
            if i not in changed and not any(
                r.start < i <= r.end for r in scan.files[0].refs
            ):
                assert new == old


def test_a_directory_holding_the_sandbox_is_never_copied_into_it(tmp_path):
    """`..` of a project under the work directory: one error, no runaway copy."""
    src = tmp_path / "work" / "src"
    src.mkdir(parents=True)
    req = src / "r.txt"
    req.write_text("..\n")
    (tmp_path / "work" / "setup.py").write_text("")
    root = tmp_path / "work" / "root"
    root.mkdir()
    scan = scan_step(step=_step(tmp_path, requirements=[req], base_dir=src))
    with pytest.raises(StageError, match="holds the image being built"):
        StagedStep(scan=scan, root=root, keep_dir=KEEP, staging_dir=STAGING)
    assert list(root.rglob("*")) == []
