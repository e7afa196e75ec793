"""The one error line of a failed command, in each form cotainr-lumi prints it.

``cotainr-lumi: error: ...`` (the ``cotainr-lumi`` command), ``cotainr plugin
'lumi' (cotainr-lumi VERSION): ...`` (a plugin's error in the ``cotainr``
command: the shim prints it, a cotainr with the build hook logs it as a
CRITICAL line) and ``cotainr: error: ...`` / ``cotainr build: error: ...``
(cotainr's own, or argparse's, for an unknown system).
"""

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR = re.compile(
    r"^(?:Cotainr:-:CRITICAL: )?"
    r"(?:cotainr(?:-lumi)?(?: build)?: error|cotainr plugin '[^']+' \([^)]*\)): "
)


def error_lines(text):
    """The error lines of `text` (colours removed)."""
    lines = _ANSI.sub("", text).splitlines()
    return [line for line in lines if _ERROR.match(line)]


def one_error(text, *needles):
    """The one error line of `text`, which mentions every needle; no traceback."""
    found = error_lines(text)
    assert len(found) == 1, text
    assert "Traceback" not in text, text
    for needle in needles:  # (a message may go on over lines)
        assert needle in text, (needle, text)
    return found[0]
