"""Where settings come from: each source's :class:`Origin` words its errors."""

from pathlib import Path

from ..errors import InputError, ProfileError
from .yamlfile import line_of


def dotted(path):
    """A settings path as users write it."""
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part + 1}]"
        else:
            text += f".{part}" if text else str(part)
    return text


class Origin:
    """Settings given in Python (the API) or by an `option`: an error names both."""

    def __init__(self, *, base_dir=None, label=None, option=None):
        self.base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
        self.label = label
        self.option = option

    def error(self, *, path, message):
        """The error for a problem at `path` (and the option that gave it)."""
        what = f"setting {dotted(path)}" if path else "settings"
        where = f" ({self.option})" if self.option else ""
        return InputError(f"Invalid {what}{where}: {message}")


class FileOrigin(Origin):
    """One stage's settings file (a pip steps file): an error names its line."""

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
    """The ``settings:`` of a system in a profile file: an error names the line."""

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
