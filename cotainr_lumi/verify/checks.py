"""Check a built image against the hand-built LUMI PyTorch image."""

from collections import Counter, namedtuple
from dataclasses import dataclass, field
from functools import partial
import json
import logging
import os
from pathlib import Path
import subprocess

from .. import apptainer, imagelayout, safeio
from ..engine import rcclplugin
from ..engine.digest import remembered_sha256
from ..engine.elfinfo import DEFAULT_LOADER_DIRS
from ..errors import InputError
from ..stages.lumi_env.mpi import LOAD_CHECK, LOAD_CHECK_MARK
from ..stages.lumi_env.network import AWS_OFI_RCCL_DIRS
from . import expectedenv, mpi, netplugin
from .status import FAIL, NA, PASS, WARN, hardware_row

logger = logging.getLogger(f"cotainr.{__name__}")

#: The JSON records the probe reads, and what each holds (its top level).
RECORDS = {
    imagelayout.TARGET_ENV_FILE: "object",
    imagelayout.PRUNE_MANIFEST_FILE: "object",
    imagelayout.PIP_PACKAGES_FILE: "array",
    imagelayout.PROVENANCE_FILE: "object",
    imagelayout.MPI_FILE: "object",
    imagelayout.RUNTIME_FILE: "object",
}
#: Labels every cotainr-lumi image carries (provenance stage).
REQUIRED_LABELS = (
    imagelayout.LABEL_VERSION,
    imagelayout.LABEL_SYSTEM,
    imagelayout.LABEL_BASE_IMAGE,
    imagelayout.LABEL_BASE_IMAGE_RESOLVED,
    imagelayout.LABEL_STAGES,
)
#: The most bytes of a record (or labels.json) the probe reads, and the
#: deepest nesting it passes on: beyond either the record is a FAIL row.
MAX_RECORD_BYTES = safeio.MAX_RECORD_BYTES
MAX_RECORD_DEPTH = 64
#: The most seconds ``verify`` runs in the image, all probes together.
VERIFY_TIMEOUT = 600
#: The most characters of a row's evidence (a label can be megabytes).
MAX_EVIDENCE = 2000
#: The runscripts that must be in the image.
REQUIRED_RUNSCRIPTS = ("conda-python-simple", "conda-python-distributed", "get-master")
#: Where rccl-tests may be when the image records none (2024, AI Factory).
RCCL_TESTS_DIRS = ("/opt/rccltests", "/usr/libexec/rccl-tests")
#: The node list ``get-master`` is run on, and the host it must answer.
SAMPLE_NODELIST = "nid[005252-005254,005256],nid007000"
SAMPLE_FIRST_HOST = "nid005252"
HARDWARE_CHECKS = (
    (
        "rccl-bandwidth",
        "rccl-tests all_reduce_perf >= 29 GB/s bus bandwidth on 4 nodes x 8 GCDs",
        f"{mpi.ACCEPTANCE_JOB} (on LUMI-G)",
    ),
    (
        "rccl-net-plugin",
        'NCCL_DEBUG=INFO shows the OFI plugin ("NET/OFI Using aws-ofi-rccl", or '
        '"Using network Libfabric" with aws-ofi-nccl) and the cxi provider',
        f"{mpi.ACCEPTANCE_JOB} (on LUMI-G)",
    ),
    (
        "gpus-visible",
        "torch.cuda.device_count() == 8 on a LUMI-G node",
        "srun -p dev-g --gpus-per-node=8 singularity exec IMAGE python -c "
        "'import torch; print(torch.cuda.device_count())'",
    ),
)


#: One row of the report.
CheckResult = namedtuple("CheckResult", "check status evidence")


@dataclass
class VerifyReport:
    """All rows, with a summary."""

    image: str
    results: list = field(default_factory=list)
    command: str = "verify"

    def add(self, check, status, evidence):
        """Append a row (evidence cut to a sane length, printable as UTF-8)."""
        evidence = str(evidence).encode("utf-8", "backslashreplace").decode("utf-8")
        self.results.append(CheckResult(check, status, evidence[:MAX_EVIDENCE]))

    def pass_if(self, check, ok, passed, failed):
        """A PASS row with `passed` when `ok`, else a FAIL row with `failed`."""
        self.add(check, PASS if ok else FAIL, passed if ok else failed)

    @property
    def failed(self):
        """The ids of the failed checks."""
        return [r.check for r in self.results if r.status == FAIL]

    def status_of(self, check):
        """The status of one check (KeyError if absent)."""
        return {r.check: r.status for r in reversed(self.results)}[check]

    def summary(self):
        """One line: counts per status (WARN only when there are some)."""
        counts = Counter(r.status for r in self.results)
        warn = f", {counts[WARN]} WARN" if counts[WARN] else ""
        return (
            f"{self.command} {self.image}: {counts[PASS]} PASS, {counts[FAIL]} FAIL, "
            f"{counts[NA]} N/A{warn}"
        )

    def as_text(self):
        """The table and the summary."""
        width = max((len(r.check) for r in self.results), default=5)
        rows = [CheckResult("CHECK", "STATUS", "EVIDENCE"), *self.results]
        lines = [f"{r.status:<6}  {r.check:<{width}}  {r.evidence}" for r in rows]
        return "\n".join([*lines, self.summary()])

    def as_json(self):
        """A JSON document with all rows and the summary."""
        return json.dumps(
            {
                "image": self.image,
                "results": [r._asdict() for r in self.results],
                "failed": self.failed,
                "summary": self.summary(),
            },
            indent=2,
        )


def _check_labels(report, facts):
    labels = facts["labels"]
    missing = [k for k in REQUIRED_LABELS if not labels.get(k)]
    report.pass_if(
        "provenance-labels",
        not missing,
        f"system={labels.get(imagelayout.LABEL_SYSTEM)} "
        f"base={labels.get(imagelayout.LABEL_BASE_IMAGE_RESOLVED)} "
        f"stages={labels.get(imagelayout.LABEL_STAGES)}",
        f"missing labels: {', '.join(missing)}",
    )
    pkg = labels.get(imagelayout.LABEL_PIP_PACKAGES)
    size = facts["files"].get(imagelayout.PIP_PACKAGES_FILE)
    report.pass_if(
        "package-list",
        pkg and size,
        f"{pkg} ({size} bytes)",
        f"no package list (label {imagelayout.LABEL_PIP_PACKAGES} -> "
        f"{imagelayout.PIP_PACKAGES_FILE}); build with the pip stage",
    )


def _check_rocm(report, facts):
    env = facts["env"]
    rocm = facts["rocm"]
    opt_rocm = rocm["opt_rocm"]
    link = f" -> {opt_rocm['link']}" if opt_rocm["link"] else ""
    report.pass_if(
        "rocm-layout",
        env.get("ROCM_PATH") and rocm["exists"] and opt_rocm["kind"] == "dir",
        f"ROCM_PATH={env.get('ROCM_PATH')}, /opt/rocm{link}, version "
        f"{rocm['version_file'] or 'unknown'}",
        f"ROCM_PATH={env.get('ROCM_PATH')!r}, /opt/rocm is {opt_rocm['kind']}",
    )
    rocm_path = env.get("ROCM_PATH") or "/opt/rocm"
    problems = [  # the ROCm directories not on PATH and LD_LIBRARY_PATH
        f"{rocm_path}/{sub} not on {var}"
        for var, sub in (("PATH", "bin"), ("LD_LIBRARY_PATH", "lib"))
        if os.path.normpath(f"{rocm_path}/{sub}")
        not in map(os.path.normpath, netplugin.path_entries(env, var))
    ]
    report.pass_if(
        "rocm-env",
        not problems,
        f"PATH and LD_LIBRARY_PATH include {rocm_path}",
        "; ".join(problems),
    )


def _check_lumi_env(report, facts):
    system = facts["labels"].get(imagelayout.LABEL_SYSTEM)
    for name, value in expectedenv.expected_env(system_name=system).items():
        found = facts["env"].get(name)
        words = f"{name}={found!r} (expected {value!r})"
        report.pass_if(f"env:{name}", found == value, words, words)


def _check_libstdcxx(report, facts):
    present = facts["env_libstdcxx"]
    if not present:
        report.add("env-libstdcxx", PASS, f"no libstdc++ in {facts['prefix']}/lib")
        return
    manifest = facts["prune_manifest"] or {}  # the probe read an object
    skipped = manifest.get("skipped") or []
    kept = [d for d in skipped if isinstance(d, dict) and d.get("group") == "libstdcxx"]
    reason = kept and (kept[0].get("reason") or "reason recorded in the manifest")
    report.pass_if(
        "env-libstdcxx",
        reason,
        f"kept {present[0]}: {reason}",
        f"{', '.join(present)} present and the prune manifest gives no reason",
    )


def _check_target_env(report, facts):
    target = facts["target_env"]
    if target is None:
        report.add(
            "target-env",
            NA,
            f"no {imagelayout.TARGET_ENV_FILE} (not built by this cotainr-lumi); "
            f"inspected the `python` on PATH ({facts['python']})",
        )
    else:
        report.pass_if(
            "target-env",
            target.get("prefix") == facts["prefix"],
            f"{facts['prefix']} ({facts['python']}): {target.get('reason', '')}",
            f"the build installed into {target.get('prefix')} but its interpreter "
            f"{target.get('python')} reports sys.prefix {facts['prefix']}",
        )


def _torch_rccl_row(torch, rocm_real):
    """The ``torch-rccl`` row: the librccl libtorch_hip.so loads is the base's."""
    ldd = torch.get("ldd_torch_hip")
    if not ldd:
        return NA, "no torch/lib/libtorch_hip.so to resolve"
    rccl = [
        f"{n} => {p or 'not found'}" for n, p in ldd["deps"].items() if "librccl" in n
    ]
    real = torch.get("rccl_realpath") or ""
    if real.startswith(rocm_real.rstrip("/") + "/"):
        return PASS, f"{rccl[0] if rccl else ''} (real path {real})"
    if not rccl:
        return FAIL, "librccl not resolved"
    return FAIL, f"{rccl[0]} (real path {real or 'unknown'}, not in {rocm_real})"


def _check_torch(report, facts):
    torch = facts["torch"]
    if torch is None or not torch.get("hip"):
        why = "torch is not installed in the image"
        if torch is not None:
            why = f"{torch['dir']} is not a ROCm build of torch"
        report.add("torch-rocm-duplicates", NA, why)
        report.add("torch-rccl", NA, why)
        return
    rocm_names = set(facts["rocm"]["lib_names"])
    rocm_real = facts["rocm"]["realpath"]
    shared = [e for e in torch["lib"] if e["name"] in rocm_names]
    dups = sorted(
        e["name"]
        for e in shared
        if not (e["link"] and str(e.get("target", "")).startswith(rocm_real))
    )
    more = " ..." if len(dups) > 6 else ""
    report.pass_if(
        "torch-rocm-duplicates",
        not dups,
        f"torch {torch['hip']}: no duplicates ({len(shared)} entries link into {rocm_real})",
        f"{len(dups)} torch/lib entries duplicate the base's ROCm: "
        f"{', '.join(dups[:6])}{more}",
    )
    report.add("torch-rccl", *_torch_rccl_row(torch, rocm_real))


def _check_runtime(report, facts):
    scripts = facts["runscripts"]
    missing = [n for n, s in scripts.items() if not s["executable"]]
    master = scripts["get-master"].get("run", {}).get("out", "").strip()
    found = (
        f"{imagelayout.RUNSCRIPTS_DIR} on PATH: {facts['runscripts_on_path']}; get-master "
        f"'{SAMPLE_NODELIST}' -> {master!r}"
    )
    report.pass_if(
        "runscripts",
        not missing and master == SAMPLE_FIRST_HOST and facts["runscripts_on_path"],
        found,
        f"missing or not executable: {', '.join(missing)}" if missing else found,
    )
    with_conda = facts.get("with_conda")
    if with_conda is None:
        report.add("with-conda", FAIL, "WITH_CONDA is not set in the image")
    else:
        report.pass_if(
            "with-conda",
            with_conda["rc"] == 0 and with_conda["out"].strip() == facts["prefix"],
            f"$WITH_CONDA={facts['env'].get('WITH_CONDA')!r} -> {with_conda['out'].strip()}",
            f"$WITH_CONDA failed (rc={with_conda['rc']}): {with_conda['err'].strip()[-200:]}",
        )


def probe_inputs():
    """What :mod:`.probe` needs to know of the image imagelayout."""
    return {
        "labels_file": imagelayout.LABELS_FILE,
        "target_env_file": imagelayout.TARGET_ENV_FILE,
        "records": RECORDS,
        "max_record_bytes": MAX_RECORD_BYTES,
        "max_record_depth": MAX_RECORD_DEPTH,
        "prune_manifest_file": imagelayout.PRUNE_MANIFEST_FILE,
        "runscripts_dir": imagelayout.RUNSCRIPTS_DIR,
        "runscripts": REQUIRED_RUNSCRIPTS,
        "sample_nodelist": SAMPLE_NODELIST,
        "runtime_file": imagelayout.RUNTIME_FILE,
        "mpi_file": imagelayout.MPI_FILE,
        "load_check": LOAD_CHECK,
        "load_check_mark": LOAD_CHECK_MARK,
        "plugin_patterns": rcclplugin.PATTERNS,
        "plugin_dirs": AWS_OFI_RCCL_DIRS,
        "loader_dirs": DEFAULT_LOADER_DIRS,
        "rccl_tests_dirs": RCCL_TESTS_DIRS,
    }


def _base_of_layer(layer):
    """The base SIF a ``--layer-only`` image (a squashfs file) names, and its labels."""
    cmd = ["unsquashfs", "-cat", str(layer), imagelayout.LABELS_FILE]
    try:  # bounded: the labels are the layer's, the base whatever its label names
        text = safeio.output_bounded(cmd).decode(errors="replace")
        labels = json.JSONDecoder().raw_decode(text)[0]
        base = labels.get(imagelayout.LABEL_BASE_IMAGE_RESOLVED)
        if base and apptainer.is_sif(base):  # a regular file (no FIFO, no device)
            return Path(base), labels
        why = f"its base {base} is not a SIF file"
    except (OSError, ValueError, AttributeError) as e:
        why = str(e)[:500]
    raise InputError(
        f"{layer} is not an image: neither a SIF file nor a layer (--layer-only) "
        f"whose base SIF is where its labels say ({why}); give the .sif file "
        "cotainr built"
    )


def _check_layer_base(report, base, labels):
    """The ``layer-base`` row: the base is the file the layer was built on (sha256)."""
    recorded = labels.get(imagelayout.LABEL_BASE_IMAGE_SHA256)
    if not recorded:
        report.add("layer-base", NA, f"{base}: the layer records no sha256 of it")
        return
    found = remembered_sha256(path=base)
    report.pass_if(
        "layer-base",
        found == recorded,
        f"{base}: sha256 {found} as the layer records",
        f"{base} is not the base this layer was built on (sha256 {found}, the "
        f"layer records {recorded}): put that base back, or build the layer again",
    )


def _probe(image, *, timeout, overlay):
    """Run :mod:`.probe` in the image's own python; return its facts."""
    probe = Path(__file__).with_name("probe.py").read_text()
    inputs = json.dumps(probe_inputs())
    args = ["bash", "-c", apptainer.IMAGE_PYTHON, probe, probe, inputs]
    proc = apptainer.exec_in_image(
        image=image, args=args, timeout=timeout, overlay=overlay
    )
    lines = proc.stdout.strip().splitlines()
    try:
        facts = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except (ValueError, RecursionError):
        facts = None
    if not isinstance(facts, dict):
        raise InputError(
            f"Cannot inspect {image}: running its python failed (exit "
            f"{proc.returncode}, no facts printed): "
            f"{(proc.stderr.strip() or proc.stdout.strip())[-500:]}"
            + apptainer.env_deadline_hint(proc.stderr, image=str(image))
        )
    return facts


def _check_records(report, facts):
    """The ``records`` row: labels.json and the records verify reads."""
    problems = facts.get("problems") or {}
    report.pass_if(
        "records",
        not problems,
        f"no malformed {imagelayout.LABELS_FILE} or record",
        "; ".join(f"{where}: {why}" for where, why in problems.items()),
    )


def _guarded(report, row, check, facts):
    """Run a check; facts it cannot read are its first row, FAIL (no traceback)."""
    try:
        check(report, facts)
    except (AttributeError, LookupError, TypeError, ValueError, RecursionError) as e:
        logger.debug("Check %s failed on the facts", row, exc_info=True)
        report.add(
            row,
            FAIL,
            f"cannot check: the image's records are malformed "
            f"({type(e).__name__}: {e})",
        )


def verify_image(*, image, strict=False, timeout=VERIFY_TIMEOUT):
    """Run every check on an image."""
    image = Path(image)
    if not image.exists():
        raise InputError(f"The image {image} does not exist.")
    if not image.is_file():
        raise InputError(
            f"{image} is not an image: it is a directory or special file; give the "
            ".sif file built by cotainr, e.g. cotainr-lumi verify my.sif"
        )
    try:
        sif = apptainer.is_sif(image)
    except OSError as e:
        raise InputError(f"Cannot read the image {image}: {e.strerror}.") from None
    report = VerifyReport(image=str(image))
    base = image
    if not sif:
        base, labels = _base_of_layer(image)
        _check_layer_base(report, base, labels)
    try:
        facts = _probe(base, timeout=timeout, overlay=None if sif else f"{image}:ro")
    except subprocess.TimeoutExpired:
        raise InputError(
            f"Cannot inspect {image}: running its python did not finish within "
            f"{timeout:g} s (a python or an env script of the image that never "
            "returns?); the container was stopped. Fix the image, or allow more "
            "time with --timeout SECONDS."
        ) from None
    checks = {  # each by the row it fails with when the facts are malformed
        "records": _check_records,
        "provenance-labels": _check_labels,
        "rocm-layout": _check_rocm,
        "net-plugin": netplugin.check_network,
        "env": _check_lumi_env,
        "target-env": _check_target_env,
        "env-libstdcxx": _check_libstdcxx,
        "torch-rocm-duplicates": _check_torch,
        "rocm-driver": partial(expectedenv.check_rocm_driver, strict=strict),
        "runscripts": _check_runtime,
        "mpi-host-binding": mpi.check_mpi,
    }
    for row, check in checks.items():
        _guarded(report, row, check, facts)
    for check in HARDWARE_CHECKS:
        report.add(*hardware_row(*check))
    return report
