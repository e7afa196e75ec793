"""
Protection of installed distributions against later pip steps.

Before a step every installed distribution is pinned ``name==version`` in a
constraints file (``pip install -c``) except those in ``allow-changes``; pip's
resolver then keeps e.g. the installed ROCm torch, and its conflict output is
explained. After the step the package lists are checked again.
"""

from dataclasses import dataclass
import json
import logging
import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import VERSION_PATTERN

from ...errors import StageError

logger = logging.getLogger(f"cotainr.{__name__}")

_PEP440_RE = re.compile(rf"\s*{VERSION_PATTERN}\s*", re.VERBOSE | re.IGNORECASE)
_CAUSE_RE = re.compile(
    r"^\s*(?:The user requested (?P<constraint>\(constraint\) )?(?P<ureq>.+?)"
    r"|(?P<pkg>\S+) (?P<ver>\S+) depends on (?P<dreq>.+?))\s*$"
)
_NOT_FOUND_RE = re.compile(
    r"Could not find a version that satisfies the requirement (?P<req>.+?)"
    r"(?: \(from (?P<from>[^)]*)\))?(?: \(from versions:.*)?$"
)
_CHECK_RE = re.compile(
    r"\S+ \S+ (?:requires (?P<missing>\S+), which is not installed"
    r"|has requirement .+, but you have (?P<dep>\S+) \S+"
    r"|is not supported on this platform)\.?"
)


@dataclass
class Conflict:
    """A protected distribution a step wanted to change."""

    name: str
    installed: str
    wanted: list[str]

    def describe(self):
        """One sentence for an error message."""
        wanted = "; ".join(self.wanted) if self.wanted else "a requirement of this step"
        return (
            f"{self.name} {self.installed} is installed (before this step) and "
            f"protected, but another version was wanted by: {wanted}"
        )


def parse_pip_list(*, text):
    """(installed by canonical name, the list) from ``pip list --format json``."""
    for line in reversed(text.splitlines()):
        if line.strip().startswith("["):
            data = json.loads(line)
            names = {
                canonicalize_name(d["name"]): (d["name"], d["version"]) for d in data
            }
            return names, data
    raise ValueError(f"no package list in pip's output: {text[-500:]!r}")


def parse_pip_check(*, text):
    """(package, problem, packages involved) of each line ``pip check`` complains in."""
    found = []
    for line in map(str.strip, text.splitlines()):
        if m := _CHECK_RE.fullmatch(line):
            name, version, problem = line.split(" ", 2)
            others = [n for n in (m["missing"], m["dep"]) if n]
            found.append((f"{name} {version}", problem.rstrip("."), [name, *others]))
    return found


def constraints_text(*, installed, allowed):
    """The constraints file pinning every installed distribution."""
    lines = [
        "# Installed before this step; pinned by cotainr-lumi so that the step",
        "# cannot upgrade, downgrade or remove them (see allow-changes).",
    ]
    for key in sorted(installed):
        name, version = installed[key]
        if key in allowed:
            lines.append(f"# {name}=={version}  (allow-changes)")
        elif _PEP440_RE.fullmatch(version):
            lines.append(f"{name}=={version}")
        else:
            logger.warning(
                "Not protecting %s: its version %r is not a PEP 440 version.",
                name,
                version,
            )
            lines.append(f"# {name} {version}  (not a PEP 440 version: not pinned)")
    return "\n".join(lines) + "\n"


def _req_name(text):
    try:
        return canonicalize_name(Requirement(text.strip()).name)
    except InvalidRequirement:
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
        return canonicalize_name(m.group(1)) if m else None


def _resolver_lines(output):
    """(line, whether in a "The conflict is caused by:" block) of pip's output."""
    in_block = False
    for line in output.splitlines():
        if "The conflict is caused by:" in line:
            in_block = True
        elif in_block and not line.strip():
            in_block = False
        else:
            yield line, in_block


def _cause(line):
    """(name, who wants it, whether pinned) of a line of a conflict block."""
    m = _CAUSE_RE.match(line)
    if m is None:
        return None
    if m["constraint"]:
        return _req_name(m["ureq"]), None, True
    if m["ureq"]:
        return _req_name(m["ureq"]), m["ureq"], False
    return _req_name(m["dreq"]), f"{m['pkg']} {m['ver']} depends on {m['dreq']}", False


def _not_found(line):
    """(name, who wants it, pinned) of pip's "Could not find a version" line."""
    m = _NOT_FOUND_RE.search(line)
    if m is None:
        return None
    origin = f" (from {m['from']})" if m["from"] else ""
    return _req_name(m["req"]), m["req"].strip() + origin, True


def explain_conflicts(*, output, installed, allowed):
    """The protected distributions pip's resolver error is about (as Conflicts)."""
    pinned = set()
    wanted = {}
    for line, in_block in _resolver_lines(output):
        found = _cause(line) if in_block else _not_found(line)
        if found is None:
            continue
        name, wants, pin = found
        if pin:
            pinned.add(name)
        if wants:
            wanted.setdefault(name, []).append(wants)
    names = sorted(n for n in pinned if n in installed and n not in allowed)
    return [
        Conflict(*installed[n], wanted=list(dict.fromkeys(wanted.get(n, []))))
        for n in names
    ]


def check_protected(*, step, before, after):
    """Fail when a step upgraded, downgraded or removed a protected distribution."""
    new = {key: version for key, (_, version) in after.items()}
    changes = [
        (name, version, new.get(key))
        for key, (name, version) in sorted(before.items())
        if key not in step.allow_changes and new.get(key) != version
    ]
    if changes:
        text = "\n".join(
            f"  {name} {old} -> {new if new else 'removed'}"
            for name, old, new in changes
        )
        names = ", ".join(name for name, _, _ in changes)
        raise StageError(
            f"{step.title} changed protected package(s) {names} despite the "
            f"constraints:\n{text}\nAdd 'allow-changes: [{names}]' to the step "
            "if this is intended.",
            stage="pip",
        )


def describe_changes(*, before, after):
    """Added and changed distributions of a step, for its report."""
    added = {n: v for k, (n, v) in after.items() if k not in before}
    changed = {
        n: [v, after[k][1]]
        for k, (n, v) in before.items()
        if k in after and after[k][1] != v
    }
    removed = [n for k, (n, _) in before.items() if k not in after]
    return {"added": added, "changed": changed, "removed": removed}
