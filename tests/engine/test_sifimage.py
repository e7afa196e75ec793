"""The image written at disk speed (cotainr_lumi/engine/sifimage.py, issue 40)."""

import datetime
import json
import logging
from pathlib import Path
import subprocess

import pytest

from cotainr_lumi.engine import sifimage
from cotainr_lumi.engine.sifimage import GZIP, Compression


@pytest.mark.parametrize(
    "text, parsed, args",
    [
        ("zstd", "zstd:3", ["-comp", "zstd", "-Xcompression-level", "3"]),
        ("zstd:19", "zstd:19", ["-comp", "zstd", "-Xcompression-level", "19"]),
        ("gzip", "gzip:9", ["-comp", "gzip", "-Xcompression-level", "9"]),
        ("lz4", "lz4", ["-comp", "lz4"]),
    ],
)
def test_compressions_and_their_mksquashfs_options(text, parsed, args):
    compression = Compression.parse(text)
    assert (str(compression), compression.args()) == (parsed, args)


@pytest.mark.parametrize(
    "text, words",
    [
        ("brotli", "the compressors are gzip, zstd, lz4, xz"),
        ("lz4:9", "lz4 takes no level"),
        ("zstd:23", "zstd levels are 1-22"),
        ("gzip:fast", "gzip levels are 1-9"),
    ],
)
def test_a_bad_compression_names_what_is_allowed(text, words):
    with pytest.raises(ValueError, match=words):
        Compression.parse(text)


def test_the_jobs_cores_and_memory_bound_mksquashfs(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(128)))
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "7")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "8000")  # MB, less than the host has
    monkeypatch.setattr(sifimage, "_cgroup_free", lambda: None)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    cmd = sifimage.squash_command(source="/s", dest="/x", compression=GZIP)
    assert cmd[:5] == ["mksquashfs", "/s", "/x", "-noappend", "-no-progress"]
    assert cmd[5:10] == ["-all-root", "-processors", "7", "-mem", "2000M"]
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "256")  # never more than the affinity
    assert sifimage.job_processors() == 128


def test_apptainers_build_date_label():
    moment = datetime.datetime(2026, 11, 28, 9, 5, 3, tzinfo=datetime.timezone.utc)
    assert sifimage._build_date(moment) == "Saturday_28_November_2026_9:5:3_UTC"


def _sandbox(tmp_path):
    root = tmp_path / "sandbox"
    (root / ".singularity.d/bootstrap_history").mkdir(parents=True)
    (root / ".singularity.d/bootstrap_history/Apptainer0").write_text("older\n")
    (root / ".singularity.d/Singularity").write_text("bootstrap: localimage\n")
    labels = {"b": "<&>", "org.opencontainers.image.created": "x", "a": "·"}
    (root / ".singularity.d/labels.json").write_text(json.dumps(labels) + " tail")
    return root


class FakeTools:
    """mksquashfs and the runtime's sif/inspect/exec, recorded."""

    def __init__(self, monkeypatch, *, runs=(0,), sif_fails=False):
        self.commands, self.runs, self.sif_fails = [], list(runs), sif_fails
        monkeypatch.setattr(sifimage, "_run", self.run)
        monkeypatch.setattr(sifimage.apptainer, "runtime", lambda: "apptainer")
        monkeypatch.setattr(sifimage.apptainer, "exec_in_image", self.exec_in_image)
        monkeypatch.setattr(sifimage.shutil, "which", lambda name: f"/bin/{name}")

    def run(self, cmd, *, timeout=None):
        cmd = [str(c) for c in cmd]
        self.commands.append(cmd)
        if cmd[0] == "mksquashfs":
            Path(cmd[2]).write_bytes(b"hsqs")
        elif cmd[1:3] == ["sif", "new"]:
            if self.sif_fails:
                raise sifimage._StepError("apptainer sif: no such command")
            Path(cmd[3]).write_bytes(b"SIF")
        elif cmd[1] == "inspect":
            return '{"data": {"attributes": {"deffile": "a <b>"}}, "type": "container"}'
        return ""

    def exec_in_image(self, *, image, args, **options):
        labels = Path(self.root, ".singularity.d/labels.json").read_text()
        code = self.runs.pop(0)
        stderr = "FATAL: squashfs: unknown compression" if code else ""
        return subprocess.CompletedProcess(args, code, "" if code else labels, stderr)


def test_the_sif_is_written_as_apptainer_writes_it(tmp_path, monkeypatch):
    root = _sandbox(tmp_path)
    tools = FakeTools(monkeypatch)
    tools.root = root
    image = sifimage.write_sif(
        sandbox_dir=root,
        path=tmp_path / "x.sif",
        compression=Compression.parse("zstd"),
        architecture="x86_64",
    )
    assert (image.compression, image.why_gzip) == (Compression("zstd", 3), None)
    squash, new, deffile, metadata, system = tools.commands[1:]
    assert squash[squash.index("-comp") :] == [
        "-comp",
        "zstd",
        "-Xcompression-level",
        "3",
    ]
    assert new == ["apptainer", "sif", "new", str(tmp_path / "x.sif")]
    assert deffile[3:6] == ["--groupid=1", "--datatype=1", "--filename="]
    assert metadata[4:6] == ["--datatype=6", "--filename=inspect-metadata.json"]
    assert "--parttype=2" in system and "--partarch=2" in system
    assert tools.commands[0][1:3] == ["inspect", "--all"]
    # The sandbox's metadata as Apptainer's build sets it (Go's JSON).
    history = root / ".singularity.d/bootstrap_history"
    assert sorted(p.name for p in history.iterdir()) == ["Apptainer0", "Apptainer1"]
    definition = (root / ".singularity.d/Singularity").read_text()
    assert definition == f"bootstrap: localimage\nfrom: {root}\n\n"
    text = (root / ".singularity.d/labels.json").read_text()
    assert text.startswith('{\n\t"a": "·",\n\t"b": "\\u003c\\u0026\\u003e",\n')
    labels = json.loads(text)
    assert labels["cotainr-lumi.compression"] == "zstd:3"
    assert labels["org.label-schema.usage.singularity.deffile.from"] == str(root)
    assert labels["org.opencontainers.image.created"] != "x"


def test_a_runtime_that_cannot_run_zstd_gets_gzip_and_one_line(
    tmp_path, monkeypatch, caplog
):
    root = _sandbox(tmp_path)
    tools = FakeTools(monkeypatch, runs=(255, 255, 0))  # the image, a tiny one, gzip
    tools.root = root
    image = sifimage.write_sif(
        sandbox_dir=root,
        path=tmp_path / "x.sif",
        compression=Compression.parse("zstd"),
        architecture="x86_64",
    )
    assert image.compression == GZIP
    assert image.why_gzip == (
        "apptainer cannot run the zstd:3 image: FATAL: squashfs: unknown compression"
    )
    squashes = [c for c in tools.commands if c[0] == "mksquashfs"]  # image, tiny, gzip
    assert [c[c.index("-comp") + 1] for c in squashes] == ["zstd", "zstd", "gzip"]
    assert (
        json.loads((root / ".singularity.d/labels.json").read_text())[
            "cotainr-lumi.compression"
        ]
        == "gzip:9"
    )
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"Squashing the image again with gzip: {image.why_gzip}"
    ]


def test_without_the_sif_tool_or_a_known_arch_apptainer_builds_it(
    tmp_path, monkeypatch, caplog
):
    root = _sandbox(tmp_path)
    tools = FakeTools(monkeypatch, sif_fails=True)
    tools.root = root
    write = dict(sandbox_dir=root, compression=GZIP, path=tmp_path / "x.sif")
    assert sifimage.write_sif(**write, architecture="x86_64") is None
    assert not (tmp_path / "x.sif").exists()
    assert sifimage.write_sif(**write, architecture="vax") is None
    assert [r.message for r in caplog.records] == [
        "Apptainer builds the image (slower): apptainer sif: no such command.",
        "Apptainer builds the image (slower): the architecture 'vax' has no SIF "
        "number here.",
    ]


def test_an_image_the_runtime_cannot_run_for_another_reason_is_kept(
    tmp_path, monkeypatch, caplog
):
    """A tiny zstd image runs: not zstd's fault, so no gzip squash (hours at 15 GB)."""
    root = _sandbox(tmp_path)
    tools = FakeTools(monkeypatch, runs=(255, 0))
    tools.root = root
    image = sifimage.write_sif(
        sandbox_dir=root,
        path=tmp_path / "x.sif",
        compression=Compression.parse("zstd"),
        architecture="x86_64",
    )
    assert (str(image.compression), image.why_gzip) == ("zstd:3", None)
    assert len([c for c in tools.commands if c[0] == "mksquashfs"]) == 2  # + tiny
    assert caplog.records[0].message == (
        "The runtime cannot run the image here (kept): FATAL: squashfs: unknown "
        "compression"
    )
