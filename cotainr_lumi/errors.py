"""
Typed exceptions raised by cotainr-lumi.

Every error a user can cause derives from :class:`CotainrLumiError`. Its
message says what is wrong, where (file, system, key, step) and how to fix
it; the command line prints it once and exits non-zero.

Classes
-------
CotainrLumiError
    Base class of all cotainr-lumi errors.
ProfileError
    A system profile file is invalid.
UnknownSystemError
    The requested system is not defined.
InputError
    A build input (file, option value) is invalid.
ImageExistsError
    The output image exists and overwriting was not allowed.
StageError
    A stage failed while building the image.
UnsupportedCotainrError
    The installed cotainr release is outside the tested range.
"""


class CotainrLumiError(Exception):
    """Base class of all cotainr-lumi errors."""

    exit_code = 1


class ProfileError(CotainrLumiError):
    """
    A system profile file is invalid.

    Parameters
    ----------
    message : str
        What is wrong and how to fix it.
    file : str, optional
        The profile file.
    line : int, optional
        The line in the file.
    system : str, optional
        The system in the file.
    key : str, optional
        The (dotted) key in the system.
    """

    exit_code = 2

    def __init__(self, message, *, file=None, line=None, system=None, key=None):
        self.file = None if file is None else str(file)
        self.line = line
        self.system = system
        self.key = key
        where = []
        if self.file is not None:
            where.append(f"file {self.file}")
        if line is not None:
            where.append(f"line {line}")
        if system is not None:
            where.append(f"system '{system}'")
        if key is not None:
            where.append(f"key '{key}'")
        prefix = f"Invalid system profile ({', '.join(where)}): " if where else ""
        super().__init__(prefix + message)


class UnknownSystemError(CotainrLumiError):
    """
    The requested system is not defined.

    Parameters
    ----------
    system : str
        The requested system name.
    available : list of str
        The names of the systems that are defined.
    """

    exit_code = 2

    def __init__(self, system, *, available):
        self.system = system
        self.available = sorted(available)
        listing = ", ".join(self.available) if self.available else "(none)"
        super().__init__(
            f"System '{system}' does not exist. Available systems: {listing}. "
            "Run 'cotainr info' for details, or define it in a profile file "
            "(see COTAINR_LUMI_SYSTEMS)."
        )


class InputError(CotainrLumiError):
    """A build input (file, option value) is invalid."""

    exit_code = 2


class ImageExistsError(CotainrLumiError):
    """The output image exists and overwriting was not allowed."""

    exit_code = 2


class StageError(CotainrLumiError):
    """
    A stage failed while building the image.

    Parameters
    ----------
    message : str
        What failed and how to fix it.
    stage : str
        The name of the failing stage.
    details : str, optional
        Extra output (e.g. the error lines of a failed command).
    """

    def __init__(self, message, *, stage, details=None):
        self.stage = stage
        self.details = details
        text = f"Stage '{stage}' failed: {message}"
        if details:
            text += "\n" + details.rstrip()
        super().__init__(text)


class UnsupportedCotainrError(CotainrLumiError):
    """The installed cotainr cannot run cotainr-lumi (release or internals)."""


def quoted(text, *, limit=120):
    """
    `text` quoted for an error message, cut to a sane length.

    Parameters
    ----------
    text : str
        A user's input.
    limit : int, default=120
        The most characters shown.

    Returns
    -------
    quoted : str
        ``repr`` of `text`, or of its start followed by how long it is.
    """
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
