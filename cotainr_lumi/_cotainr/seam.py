"""
cotainr's public extension points (plugins, systems sources, build stages).

cotainr releases with the upstream patch series (``docs/upstream/``) load
plugins from the ``cotainr.plugins`` entry point group themselves and have a
build stage seam. cotainr-lumi then registers one build stage and a systems
source through these public names only. Without them it falls back to the
start-up hook (see :mod:`cotainr_lumi._cotainr.plugin`).

Functions
---------
has_build_stage_seam()
    Whether the installed cotainr has the public seam.
register(*, stage_logic, systems_source)
    Register a build stage and a systems source with cotainr.
"""

import logging

from cotainr import cli as _cli
from cotainr import util as _util

try:
    from cotainr import plugins as _plugins
    from cotainr import stages as _stages
except ImportError:  # cotainr without the seam
    _plugins = None
    _stages = None

logger = logging.getLogger(f"cotainr.{__name__}")

# The BuildStage classes made by register(), by stage logic class.
_registered = {}

#: The public names of the seam, by module (checked by :func:`has_build_stage_seam`).
SEAM_NAMES = {
    "cotainr.plugins": ("load_plugins", "PLUGIN_GROUP"),
    "cotainr.stages": ("BuildStage",),
    "cotainr.cli.Build": ("add_stage", "plan"),
    "cotainr.cli.CotainrCLI": ("add_subcommand",),
    "cotainr.util": ("add_systems_source",),
}


def _seam_objects():
    """The objects named by :data:`SEAM_NAMES` (None if a module is missing)."""
    return {
        "cotainr.plugins": _plugins,
        "cotainr.stages": _stages,
        "cotainr.cli.Build": _cli.Build,
        "cotainr.cli.CotainrCLI": _cli.CotainrCLI,
        "cotainr.util": _util,
    }


def missing_seam_names():
    """
    The public seam names the installed cotainr lacks.

    Returns
    -------
    missing : list of str
        Dotted names; empty when cotainr has the whole seam.
    """
    objects = _seam_objects()
    missing = []
    for owner, names in SEAM_NAMES.items():
        for name in names:
            if objects[owner] is None or not hasattr(objects[owner], name):
                missing.append(f"{owner}.{name}")
    return missing


def has_build_stage_seam():
    """
    Whether the installed cotainr has the public seam.

    Returns
    -------
    has_seam : bool
        True when every name of :data:`SEAM_NAMES` exists.
    """
    return not missing_seam_names()


def register(*, stage_logic, systems_source):
    """
    Register a build stage and a systems source with cotainr.

    Parameters
    ----------
    stage_logic : type
        A class with the methods of ``cotainr.stages.BuildStage`` (``name``,
        ``add_arguments``, ``from_build``, ``describe``, ``run``,
        ``after_build``); it is combined with ``BuildStage``.
    systems_source : callable
        Returns systems in cotainr's ``systems.json`` format.

    Returns
    -------
    stage_cls : type
        The registered ``BuildStage`` subclass.
    """
    if stage_logic in _registered:
        return _registered[stage_logic]
    stage_cls = type(stage_logic.__name__, (stage_logic, _stages.BuildStage), {})
    stage_cls.__doc__ = stage_logic.__doc__
    _cli.Build.add_stage(stage_cls=stage_cls)
    _util.add_systems_source(source=systems_source)
    _registered[stage_logic] = stage_cls
    return stage_cls
