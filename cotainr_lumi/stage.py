"""
The stage interface of the cotainr-lumi build pipeline.

A stage is one step run on the cotainr sandbox after cotainr's conda install
and before cotainr writes its metadata and builds the image. Stages are named
in a system profile (in order) and configured by the profile's ``settings``
for that name, possibly overridden per build.

Classes
-------
Stage
    Abstract base class of a pipeline stage.
StageReport
    What a stage did.
StageContext
    What a running stage gets to work with.

Functions
---------
register_stage(stage_cls)
    Make a stage class available to profiles under its name.
get_stage_class(name)
    Look up a registered stage class.
available_stages()
    The names of all registered stages.
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
import logging
from typing import Any, ClassVar, Optional

logger = logging.getLogger(f"cotainr.{__name__}")

_REGISTRY: dict[str, type] = {}


@dataclass
class StageReport:
    """
    What a stage did.

    Attributes
    ----------
    name : str
        The stage name.
    summary : str
        A one-line human-readable summary (printed in the build log).
    details : dict
        JSON-serialisable details (returned by the Python API).
    labels : dict of str to str
        Labels to add to the image metadata.
    duration : float
        Wall time of the stage in seconds (set by the pipeline).
    """

    name: str
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    duration: float = 0.0


@dataclass
class StageContext:
    """
    What a running stage gets to work with.

    Attributes
    ----------
    sandbox : :class:`cotainr_lumi._cotainr.Sandbox`
        The sandbox being built (``sandbox.root`` is its host path; use
        :mod:`cotainr_lumi.rootfs` to resolve image paths inside it, and
        ``sandbox.run(...)`` to run commands in the container).
    plan : :class:`cotainr_lumi.plan.BuildPlan`
        The resolved build plan (system, base image, options).
    reports : list of StageReport
        The reports of the stages that already ran, in order.
    labels : dict of str to str
        Labels collected so far (stages may read what earlier stages set).
    """

    sandbox: Any
    plan: Any
    reports: list[StageReport] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


class Stage(ABC):
    """
    Abstract base class of a pipeline stage.

    Subclasses set :attr:`name`, may set :attr:`defaults` (the settings used
    when a profile gives none) and implement :meth:`run`; :meth:`describe`
    feeds the dry-run plan and :meth:`validate_settings` checks the settings
    of a profile when it is loaded.

    Parameters
    ----------
    settings : mapping, optional
        The stage settings (profile settings merged with build overrides).
    """

    #: The name profiles use for this stage.
    name: ClassVar[str] = ""
    #: Default settings, merged under the profile's settings.
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, *, settings: Optional[Mapping[str, Any]] = None):
        merged = dict(self.defaults)
        merged.update(settings or {})
        self.settings = merged

    @classmethod
    def validate_settings(cls, *, settings: Mapping[str, Any]) -> list[tuple[str, str]]:
        """
        Check stage settings from a profile.

        Parameters
        ----------
        settings : mapping
            The settings given for this stage.

        Returns
        -------
        problems : list of (str, str)
            ``(key, message)`` pairs, empty when the settings are valid. The
            default accepts exactly the keys of :attr:`defaults`.
        """
        problems = []
        for key in settings:
            if cls.defaults and key not in cls.defaults:
                known = ", ".join(sorted(cls.defaults))
                problems.append((key, f"unknown setting (known: {known})"))
        return problems

    @classmethod  # noqa: B027
    def add_arguments(cls, *, parser) -> None:
        """
        Add this stage's command line options to the ``build`` parser.

        Parameters
        ----------
        parser : :class:`argparse.ArgumentParser`
            The parser (or an argument group of it).
        """

    @classmethod
    def settings_from_args(cls, *, args) -> dict[str, Any]:
        """
        Stage setting overrides from parsed command line options.

        Parameters
        ----------
        args : :class:`argparse.Namespace`
            The parsed options (only those this stage added matter).

        Returns
        -------
        overrides : dict
            Settings to merge over the profile's; empty when no option of
            this stage was given.
        """
        return {}

    def describe(self, *, plan) -> list[str]:
        """
        Describe what the stage will do, for the dry-run plan.

        Parameters
        ----------
        plan : :class:`cotainr_lumi.plan.BuildPlan`
            The resolved build plan.

        Returns
        -------
        lines : list of str
            Human-readable lines (no trailing newlines).
        """
        return []

    def enabled(self, *, plan) -> bool:
        """
        Whether the stage runs in this build.

        Parameters
        ----------
        plan : :class:`cotainr_lumi.plan.BuildPlan`
            The resolved build plan.

        Returns
        -------
        enabled : bool
            The default is True.
        """
        return True

    @abstractmethod
    def run(self, *, context: StageContext) -> StageReport:
        """
        Run the stage on the sandbox.

        Parameters
        ----------
        context : StageContext
            The sandbox, plan and earlier reports.

        Returns
        -------
        report : StageReport
            What the stage did.

        Raises
        ------
        :class:`cotainr_lumi.errors.StageError`
            If the stage fails; the build then stops and no image is written.
        """


def register_stage(stage_cls):
    """
    Make a stage class available to profiles under its name.

    Usable as a class decorator.

    Parameters
    ----------
    stage_cls : type
        A :class:`Stage` subclass with a non-empty ``name``.

    Returns
    -------
    stage_cls : type
        The class, unchanged.
    """
    if not (isinstance(stage_cls, type) and issubclass(stage_cls, Stage)):
        raise TypeError(f"{stage_cls!r} is not a Stage subclass")
    if not stage_cls.name:
        raise ValueError(f"{stage_cls.__name__} has no stage name")
    _REGISTRY[stage_cls.name] = stage_cls
    return stage_cls


def get_stage_class(name):
    """
    Look up a registered stage class.

    Parameters
    ----------
    name : str
        The stage name.

    Returns
    -------
    stage_cls : type
        The stage class.

    Raises
    ------
    KeyError
        If no stage has that name.
    """
    _load_builtin_stages()
    return _REGISTRY[name]


def available_stages():
    """
    The names of all registered stages.

    Returns
    -------
    names : list of str
        Sorted stage names.
    """
    _load_builtin_stages()
    return sorted(_REGISTRY)


def _load_builtin_stages():
    """Import the built-in stage modules (they register themselves)."""
    from . import stages  # noqa: F401
