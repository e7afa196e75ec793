"""LUMI's real artefacts as test data: facts with the source each comes from.

Each artefact is one YAML file in ``tests/artefacts/`` (``SLUG.yaml``)::

    source:
      repo: Lumi-supercomputer/LUMI-SoftwareStack    # owner/name on GitHub
      path: easybuild/easyconfigs/c/cotainr/cotainr-2025.7.1.eb
      commit: 0123456789abcdef0123456789abcdef01234567   # 40 hex digits
      lines: "61-74"                                  # where the facts are
      checked: 2026-11-28                             # when they were read
    facts:
      ...                                             # names, paths, versions,
                                                      # env values, command forms

Facts only (what the artefact states), never a copy of its text. Tests load
them with :func:`load` and build host trees, images and expectations from
them, so a fixture is the way the real thing is, not the way our parser
wants it.
"""

from dataclasses import dataclass
import datetime
from pathlib import Path
import re
from typing import Any

import yaml

ARTEFACTS_DIR = Path(__file__).parent / "artefacts"


@dataclass(frozen=True)
class Source:
    """Where a set of facts was read: repository, path, lines and commit."""

    repo: str
    path: str
    commit: str
    lines: str
    checked: datetime.date

    def cite(self):
        """One line naming the source, for assertion messages and docs."""
        return f"{self.repo} {self.path} L{self.lines} ({self.commit[:8]})"


@dataclass(frozen=True)
class Artefact:
    """One real LUMI artefact: its source and the facts it states."""

    slug: str
    source: Source
    facts: Any


def _source(slug, raw):
    if not isinstance(raw, dict):
        raise ValueError(f"{slug}: 'source' must be a mapping")
    source = Source(
        repo=str(raw["repo"]),
        path=str(raw["path"]),
        commit=str(raw["commit"]),
        lines=str(raw["lines"]),
        checked=raw["checked"],
    )
    if not re.fullmatch(r"[0-9a-f]{40}", source.commit):
        raise ValueError(f"{slug}: the commit must be 40 hex digits")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", source.repo):
        raise ValueError(f"{slug}: the repo must be owner/name")
    if not isinstance(source.checked, datetime.date):
        raise ValueError(f"{slug}: 'checked' must be a date")
    return source


def load(slug):
    """The artefact ``tests/artefacts/SLUG.yaml``."""
    raw = yaml.safe_load((ARTEFACTS_DIR / f"{slug}.yaml").read_text())
    return Artefact(slug=slug, source=_source(slug, raw["source"]), facts=raw["facts"])


def all_artefacts():
    """Every artefact in ``tests/artefacts/``, by slug."""
    return {path.stem: load(path.stem) for path in sorted(ARTEFACTS_DIR.glob("*.yaml"))}
