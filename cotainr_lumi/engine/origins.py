"""
Where settings come from, and how an error names it.

The one settings loader (:mod:`cotainr_lumi.engine.settings`) reads settings
from several sources; each is an :class:`Origin`, which words the error for a
bad value: the key for the Python API, the option for a command line option,
the file and line for a file.
"""

import logging
from pathlib import Path

from ..errors import InputError, ProfileError
from .yamlfile import line_of

logger = logging.getLogger(f"cotainr.{__name__}")


def dotted(path):
    """
    A settings path as users write it.

    Parameters
    ----------
    path : sequence
        Keys and 0-based list indices.

    Returns
    -------
    text : str
        E.g. ``pip.steps[2].env.CC`` for ``("pip", "steps", 1, "env", "CC")``.
    """
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part + 1}]"
        else:
            text += f".{part}" if text else str(part)
    return text


# -- where settings come from -------------------------------------------------


class Origin:
    """
    Settings given in Python (the API): an error names the key.

    Parameters
    ----------
    base_dir : os.PathLike, optional
        The directory relative paths count from (default: the current one).
    label : str, optional
        How values from here are labelled where it matters (pip steps).
    """

    def __init__(self, *, base_dir=None, label=None):
        self.base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
        self.label = label

    def error(self, *, path, message):
        """
        The error for a problem at `path`.

        Parameters
        ----------
        path : tuple
            ``(stage, key, ...)``; empty for the settings as a whole.
        message : str
            What is wrong and what to write instead.

        Returns
        -------
        error : :class:`cotainr_lumi.errors.CotainrLumiError`
            To raise.
        """
        if not path:
            return InputError(f"Invalid settings: {message}")
        return InputError(f"Invalid setting {dotted(path)}: {message}")


class OptionOrigin(Origin):
    """
    Settings from a command line option: an error names the option.

    Parameters
    ----------
    option : str
        The option as given, e.g. ``--set 'prune.strict=yes'``.
    base_dir : os.PathLike, optional
        As for :class:`Origin`.
    """

    def __init__(self, *, option, base_dir=None):
        super().__init__(base_dir=base_dir)
        self.option = option

    def error(self, *, path, message):
        """The error for a problem at `path` (see :meth:`Origin.error`)."""
        what = f"setting {dotted(path)}" if path else "settings"
        return InputError(f"Invalid {what} ({self.option}): {message}")


class FileOrigin(Origin):
    """
    One stage's settings file (a pip steps file): an error names its line.

    Parameters
    ----------
    file : os.PathLike
        The file (relative paths in it count from its directory).
    data : object
        What :func:`cotainr_lumi.engine.yamlfile.read_yaml` read from it.
    what : str
        What the file is, e.g. ``"pip steps file"``.
    describe : callable, optional
        ``describe(path) -> str`` naming a key path in the file's words
        (default ``key 'steps[2].env'``).
    """

    def __init__(self, *, file, data, what, describe=None):
        super().__init__(base_dir=Path(file).parent, label=str(file))
        self.file = file
        self.data = data
        self.what = what
        self.describe = describe

    def error(self, *, path, message):
        """The error for a problem at ``(stage, *path)`` in the file."""
        inner = tuple(path[1:])
        line = line_of(data=self.data, path=inner)
        where = f"{self.file}, line {line}" if line else str(self.file)
        if inner:
            key = self.describe(inner) if self.describe else f"key '{dotted(inner)}'"
            where += f", {key}"
        return InputError(f"Invalid {self.what} {where}: {message}.")


class ProfileOrigin(Origin):
    """
    The ``settings:`` of a system in a profile file: an error names the line.

    Parameters
    ----------
    file : os.PathLike
        The profile file.
    system : str
        The system.
    data : mapping
        The system's definition as read from the file.
    """

    def __init__(self, *, file, system, data):
        super().__init__()
        self.file = file
        self.system = system
        self.data = data

    def error(self, *, path, message):
        """The error for a problem at ``settings.<path>`` of the system."""
        full = ("settings", *path)
        return ProfileError(
            message,
            file=self.file,
            line=line_of(data=self.data, path=full),
            system=self.system,
            key=dotted(full),
        )
