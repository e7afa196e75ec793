"""
The ROCm versions LUMI's GPU driver supports, and an image checked against them.

The profile's settings section ``rocm`` states the range (``supported: "6.1-7.0"``
and its ``source``); the base image's ROCm and torch's are checked against it and
each other by the dry run, at a build's start and end (a warning, or a stop with
``rocm.strict``; labels keep the answer) and by ``cotainr-lumi verify``.
"""

from dataclasses import dataclass
import logging
import re
from typing import Optional

from .. import imagelayout, safeio
from ..errors import StageError
from .rootfs import resolve_in_root
from .settings import StageSettings, setting

logger = logging.getLogger(f"cotainr.{__name__}")

#: The settings section of the ROCm check (``--set rocm.strict=true``).
SETTINGS_NAME = "rocm"

_MAJOR_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")
_RANGE = re.compile(r"^\s*(\d+\.\d+)\s*-\s*(\d+\.\d+)\s*$")
_TORCH_ROCM = re.compile(r"\+rocm(\d+\.\d+)")
_TORCH_VERSION_PY = re.compile(
    r"^(__version__|hip)\s*(?::[^=]*)?=\s*['\"]([^'\"]*)", re.M
)


def major_minor(version):
    """The major.minor of a version string."""
    match = _MAJOR_MINOR.match(str(version or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _text(version):
    return f"{version[0]}.{version[1]}"


@dataclass(frozen=True)
class Window:
    """A supported range of ROCm major.minor versions (both ends included)."""

    low: tuple[int, int]
    high: tuple[int, int]
    source: str = ""

    @classmethod
    def from_text(cls, text, *, source=""):
        """The window of ``"LOW-HIGH"`` (None: not such a range)."""
        match = _RANGE.match(str(text or ""))
        if match:
            return cls(*(major_minor(v) for v in match.groups()), source=source or "")
        return None

    @classmethod
    def check(cls, text):
        """Raise ValueError unless `text` is a range ``LOW-HIGH``, LOW <= HIGH."""
        window = cls.from_text(text)
        if window is None or window.low > window.high:
            raise ValueError(
                "must be a range of ROCm major.minor versions LOW-HIGH such as "
                f'"6.1-7.0" (got {text!r})'
            )

    def __contains__(self, version):
        return self.low <= version <= self.high

    def __str__(self):
        return f"{_text(self.low)}-{_text(self.high)}"

    def words(self):
        """The range and its source, for messages."""
        source = f" ({self.source})" if self.source else ""
        return f"LUMI's GPU driver supports ROCm {self}{source}"


@dataclass(frozen=True)
class RocmSettings(StageSettings):
    """The settings section ``rocm``."""

    supported: Optional[str] = setting(
        None,
        doc="the ROCm major.minor range LUMI's GPU driver supports, e.g. "
        "6.1-7.0 (null: not checked)",
        check=Window.check,
    )
    source: Optional[str] = setting(
        None, doc="where the support team states that range (shown in messages)"
    )
    strict: bool = setting(
        False,
        doc="stop the build when the base's ROCm or torch's is outside the "
        "range or they disagree (else warn)",
    )

    @property
    def window(self):
        """The supported range (None: not checked)."""
        return Window.from_text(self.supported, source=self.source)


def torch_rocm(torch):
    """The ROCm major.minor a torch was built for."""
    if not torch:
        return None
    match = _TORCH_ROCM.search(str(torch.get("version") or ""))
    return major_minor(match.group(1) if match else torch.get("hip"))


def problems(*, window, base_rocm, torch):
    """What is wrong with an image's ROCm versions, in words."""
    found = []
    base = major_minor(base_rocm)
    built_for = torch_rocm(torch)
    if window is not None and base is not None and base not in window:
        found.append(
            f"the base image's ROCm {base_rocm} is outside what {window.words()}: "
            "GPU jobs are likely to fail at run time; use a base image with ROCm "
            f"{window}"
        )
    if window is not None and built_for is not None and built_for not in window:
        found.append(
            f"torch {torch.get('version')} is built for ROCm {_text(built_for)}, "
            f"outside what {window.words()}; install a torch built for ROCm "
            f"{window}"
        )
    if base is not None and built_for is not None and base != built_for:
        found.append(
            f"torch {torch.get('version')} is built for ROCm {_text(built_for)} "
            f"but the base image has ROCm {base_rocm}: torch keeps its own ROCm "
            "libraries (prune does not link them to the base's), and RCCL may not "
            "use the image's network plugin; install the torch wheel for ROCm "
            f"{_text(base)}"
        )
    return found


def describe_lines(*, plan):
    """What the dry run says about the ROCm versions."""
    window = plan.rocm_settings.window
    base = (plan.base_facts or {}).get("image", {}).get("rocm_version") or None
    profile = plan.system.rocm_version if plan.system is not None else None
    torch = getattr(plan.base_target, "torch", None)  # what the dry run saw
    if not torch:
        explicit = (plan.base_facts or {}).get("explicit", {}).get("python")
        torch = explicit.get("torch") if isinstance(explicit, dict) else None
    if base:
        first = f"base image ROCm {base}"
    elif profile:
        first = f"base image ROCm {profile} (the profile's rocm-version; not asked)"
        base = profile
    else:
        first = "base image ROCm unknown (checked when the build starts)"
    if torch:
        first += f", torch {torch.get('version') or '?'}"
    first += f"; {window.words()}" if window else "; no supported range stated"
    found = problems(window=window, base_rocm=base, torch=torch)
    strict = plan.rocm_settings.strict
    tag = "ERROR (strict): " if strict else "WARNING: "
    lines = [first, *(tag + p for p in found)]
    if found and strict:
        lines.append("the build would stop here (strict)")
    return lines


def _torch_in_sandbox(*, root, target):
    """The torch of the target env, read from ``torch/version.py`` in the sandbox."""
    for site in target.site if target is not None else ():
        try:
            path = resolve_in_root(root=root, path=f"{site}/torch/version.py")
            with safeio.open_regular(path) as f:  # no FIFO, no device
                text = f.read(20000).decode(errors="replace")
        except OSError:
            continue
        found = dict(_TORCH_VERSION_PY.findall(text))
        return {"version": found.get("__version__", ""), "hip": found.get("hip", "")}
    return None


def base_rocm_version(*, root, rocm_path):
    """The base image's ROCm version from ``$ROCM_PATH/.info/version``."""
    try:
        host = resolve_in_root(root=root, path=f"{rocm_path}/.info/version")
        if not host.is_file():
            return None
        with open(host, encoding="utf-8", errors="replace") as f:
            return f.readline(200).strip() or None
    except OSError:
        return None


def check_build(*, context, phase):
    """Check a running build; warn, or stop when strict."""
    window = context.plan.rocm_settings.window
    root = context.sandbox.root
    target = context.known_target_env()
    rocm_path = (target.image.rocm_path if target is not None else "") or "/opt/rocm"
    base = base_rocm_version(root=root, rocm_path=rocm_path)
    found = problems(window=window, base_rocm=base, torch=None)
    if phase != "start":  # the end: only what torch adds (the start said the rest)
        torch = _torch_in_sandbox(root=root, target=target)
        found = [
            p
            for p in problems(window=window, base_rocm=base, torch=torch)
            if p not in found
        ]
        if base:
            context.labels[imagelayout.LABEL_ROCM_VERSION] = base
        if window is not None:
            context.labels[imagelayout.LABEL_ROCM_SUPPORTED] = str(window)
        if (built_for := torch_rocm(torch)) is not None:
            context.labels[imagelayout.LABEL_ROCM_TORCH] = _text(built_for)
    if found and context.plan.rocm_settings.strict:
        raise StageError(
            "; ".join(found)
            + ". The build stops because the profile or --set asks for it "
            "(rocm.strict: true); with --set rocm.strict=false it builds with a warning.",
            stage=SETTINGS_NAME,
        )
    for problem in found:
        logger.warning("ROCm: %s.", problem)
