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
#: ``hip = '6.1...'`` or ``hip: str = '6.1...'`` (``__version__`` too) in a version.py.
_VERSION_PY_FIELD = re.compile(
    r"^(__version__|hip)\s*(?::[^=\n]*)?=\s*['\"]([^'\"\n]*)['\"]", re.M
)


def major_minor(version):
    """The major.minor of a version string."""
    match = _MAJOR_MINOR.match(str(version or ""))
    return (int(match[1]), int(match[2])) if match else None


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
            return cls(major_minor(match[1]), major_minor(match[2]), source or "")
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


def system_window(system):
    """The supported range a system's profile states (None: not checked)."""
    return RocmSettings.complete(system.stage_settings(SETTINGS_NAME)).window


def torch_rocm(torch):
    """The ROCm major.minor a torch was built for."""
    if not torch:
        return None
    match = _TORCH_ROCM.search(str(torch.get("version") or ""))
    return major_minor(match[1] if match else torch.get("hip"))


def problems(*, window, base_rocm, torch):
    """What is wrong with an image's ROCm versions, in words."""
    found = []
    base = major_minor(base_rocm)
    built_for = torch_rocm(torch)
    if window and base and base not in window:
        found.append(
            f"the base image's ROCm {base_rocm} is outside what {window.words()}: "
            "GPU jobs are likely to fail at run time; use a base image with ROCm "
            f"{window}"
        )
    if window and built_for and built_for not in window:
        found.append(
            f"torch {torch.get('version')} is built for ROCm {_text(built_for)}, "
            f"outside what {window.words()}; install a torch built for ROCm "
            f"{window}"
        )
    if base and built_for and base != built_for:
        found.append(
            f"torch {torch.get('version')} is built for ROCm {_text(built_for)} "
            f"but the base image has ROCm {base_rocm}: torch keeps its own ROCm "
            "libraries (prune does not link them to the base's), and RCCL may not "
            "use the image's network plugin; install the torch wheel for ROCm "
            f"{_text(base)}"
        )
    return found


def _explicit_torch(facts):
    """The torch of the explicit prefix the dry run probed."""
    explicit = facts.get("explicit", {}).get("python")
    return explicit.get("torch") if isinstance(explicit, dict) else None


def _dry_run_base(*, facts, profile_rocm):
    """The base image's ROCm the dry run knows of, and its words."""
    base = facts.get("image", {}).get("rocm_version")
    if base:
        return base, f"base image ROCm {base}"
    if profile_rocm:
        words = "the profile's rocm-version; not asked"
        return profile_rocm, f"base image ROCm {profile_rocm} ({words})"
    return None, "base image ROCm unknown (checked when the build starts)"


def describe_lines(*, settings, profile_rocm, facts, target):
    """
    What the dry run says about the ROCm versions.

    Parameters
    ----------
    settings : RocmSettings
        The rocm settings.
    profile_rocm : str or None
        The profile's rocm-version.
    facts : dict or None
        The dry run's probe facts of the base image.
    target : TargetEnv or other
        The target env the dry run found (its torch, else the explicit
        prefix's torch of `facts`).
    """
    facts = facts or {}
    window = settings.window
    base, first = _dry_run_base(facts=facts, profile_rocm=profile_rocm)
    torch = getattr(target, "torch", None) or _explicit_torch(facts)
    if torch:
        first += f", torch {torch.get('version') or '?'}"
    first += f"; {window.words() if window else 'no supported range stated'}"
    found = problems(window=window, base_rocm=base, torch=torch)
    tag = "ERROR (strict): " if settings.strict else "WARNING: "
    lines = [first, *(tag + p for p in found)]
    if found and settings.strict:
        lines.append("the build would stop here (strict)")
    return lines


def version_py_fields(*, root, path):
    """``__version__`` and ``hip`` of a package's ``version.py``, never imported.

    Parameters
    ----------
    root : os.PathLike
        The sandbox.
    path : str
        The file's path in the image, resolved inside `root`; read only if it
        is a regular file (a FIFO or a device is never opened).

    Returns
    -------
    fields : dict or None
        The fields found (name -> value); None when the file cannot be read.
    """
    try:
        host = resolve_in_root(root=root, path=path)
        with safeio.open_regular(host) as f:
            text = f.read(1024**2).decode("utf-8", "replace")
    except OSError:
        return None
    return dict(_VERSION_PY_FIELD.findall(text))


def _torch_in_sandbox(*, root, target):
    """The torch of the target env, read from ``torch/version.py`` in the sandbox."""
    for site in target.site if target else ():
        found = version_py_fields(root=root, path=f"{site}/torch/version.py")
        if found is not None:
            return {
                "version": found.get("__version__", ""),
                "hip": found.get("hip", ""),
            }
    return None


def base_rocm_version(*, root, rocm_path):
    """The base image's ROCm version from ``$ROCM_PATH/.info/version``."""
    try:
        host = resolve_in_root(root=root, path=f"{rocm_path}/.info/version")
        if not host.is_file():  # no FIFO, no directory
            return None
        with open(host, encoding="utf-8", errors="replace") as f:
            return f.readline(200).strip() or None
    except OSError:
        return None


def _report(found, *, settings):
    """Warn about what was `found`; stop when strict."""
    if found and settings.strict:
        raise StageError(
            "; ".join(found)
            + ". The build stops because the profile or --set asks for it "
            "(rocm.strict: true); with --set rocm.strict=false it builds with a warning.",
            stage=SETTINGS_NAME,
        )
    for problem in found:
        logger.warning("ROCm: %s.", problem)


def _base_rocm(*, root, target):
    """The base image's ROCm version, found through the target env's ROCM_PATH."""
    rocm_path = target.image.rocm_path if target else ""
    return base_rocm_version(root=root, rocm_path=rocm_path or "/opt/rocm")


def check_start(*, root, target, settings):
    """Check the base image's ROCm when the build starts; warn, or stop when strict."""
    base = _base_rocm(root=root, target=target)
    _report(
        problems(window=settings.window, base_rocm=base, torch=None), settings=settings
    )


def check_end(*, root, target, settings):
    """
    Check what torch adds at the end of the build; warn, or stop when strict.

    Returns
    -------
    labels : dict of str to str
        The ROCm labels of the image.
    """
    window = settings.window
    base = _base_rocm(root=root, target=target)
    torch = _torch_in_sandbox(root=root, target=target)
    said = problems(window=window, base_rocm=base, torch=None)
    found = problems(window=window, base_rocm=base, torch=torch)
    _report([p for p in found if p not in said], settings=settings)
    built_for = torch_rocm(torch)
    labels = {
        imagelayout.LABEL_ROCM_VERSION: base,
        imagelayout.LABEL_ROCM_SUPPORTED: window,
        imagelayout.LABEL_ROCM_TORCH: built_for and _text(built_for),
    }
    return {key: str(value) for key, value in labels.items() if value}
