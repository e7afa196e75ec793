"""
Typed exceptions raised by cotainr-lumi.

Every error a user can cause derives from :class:`CotainrLumiError`. Its
message says what is wrong, where (file, system, key, step) and how to fix
it; the command line prints it once and exits non-zero.
"""

import re
import sys

#: Environment variable names taken for secrets: a ``_``-separated part
#: TOKEN(S), SECRET(S), PASSWORD(S), PASSWD, CREDENTIAL(S) or APIKEY, or a last
#: part KEY, in any case (``HF_TOKEN``, ``WANDB_API_KEY``; not
#: ``TOKENIZERS_PARALLELISM``).
SECRET_NAME_RE = re.compile(
    r"(^|_)(TOKENS?|SECRETS?|PASSWORDS?|PASSWD|CREDENTIALS?|APIKEY)(_|$)|_KEY$",
    re.IGNORECASE,
)
# A URL's user information: all before the last "@" of its authority. (A
# scheme starts where a run of scheme characters starts: linear in the text,
# an env script's 20 MB line of letters took hours.)
_USERINFO_RE = re.compile(
    r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#\"<>]*)@"
)


class CotainrLumiError(Exception):
    """Base class of all cotainr-lumi errors (their text shown :func:`redact`-ed)."""

    exit_code = 1

    def __str__(self):
        return redact(super().__str__())


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
        shown = (
            f"file {self.file}",
            f"line {line}",
            f"system '{system}'",
            f"key '{key}'",
        )
        where = [text for text, value in zip(shown, (file, line, system, key)) if value]
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
    removed : str, optional
        The profile's message for a retired system.
    """

    exit_code = 2

    def __init__(self, system, *, available, removed=None):
        self.system = system
        self.available = sorted(available)
        listing = ", ".join(self.available) if self.available else "(none)"
        if removed:
            super().__init__(f"System '{system}' was removed: {removed}")
            return
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
            text += "\n" + clip_output(details.rstrip())
        super().__init__(text)


class UnsupportedCotainrError(CotainrLumiError):
    """The installed cotainr cannot run cotainr-lumi (release or internals)."""


def clip_output(text, *, line_limit=500, limit=4000):
    """The last lines of `text` within `limit` UTF-8 bytes, each cut to `line_limit`."""
    kept = []
    size = 0
    for line in reversed(str(text).splitlines()):
        raw = line.encode("utf-8", "replace")
        if len(raw) > line_limit:  # saying its length: clipping twice changes nothing
            cut = raw[: line_limit - 40].decode("utf-8", "ignore")
            line = f"{cut}... ({len(raw)} bytes)"
        size += len(line.encode("utf-8", "replace")) + 1
        if size > limit:
            break
        kept.append(line)
    return "\n".join(reversed(kept))


def quoted(text, *, limit=120):
    """``repr`` of a user's input for a message, cut to `limit` characters."""
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def redact(text, *, values=()):
    """
    `text` with URLs' passwords and tokens, and `values`, shown as ``***``.

    The one redaction of cotainr-lumi (records, logs, labels, plans, errors):
    ``https://user:pw@host/p`` becomes ``https://user:***@host/p``,
    ``https://token@host/p`` becomes ``https://***@host/p``. Only `values` of
    4 characters or more are hidden (shorter ones would hide ordinary text).
    """
    text = _USERINFO_RE.sub(
        lambda m: m[1] + (m[2].split(":")[0] + ":" if ":" in m[2] else "") + "***@",
        str(text),
    )
    for value in values:
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def redact_env(env):
    """`env` as recorded: ``***`` for secrets (:data:`SECRET_NAME_RE`), else redacted."""
    return {k: "***" if SECRET_NAME_RE.search(k) else redact(v) for k, v in env.items()}


def fail(error, *, prefix="cotainr-lumi: error", exit_code=None):
    """Print the one line ``PREFIX: ERROR`` and exit with the error's code."""
    sys.stderr.write(f"{prefix}: {error}\n")
    if exit_code is None:
        exit_code = getattr(error, "exit_code", 1)
    raise SystemExit(exit_code) from None
