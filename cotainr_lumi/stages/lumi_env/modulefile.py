"""
The files written next to an image: an Lmod module file and a shell snippet.

Bind mounts cannot be baked into a SIF, so, like the LUMI EasyBuild container
modules, a module file (Lua, for Lmod) and an equivalent POSIX shell snippet
set ``SIF``, ``SINGULARITY_BIND``, ``RUNSCRIPTS`` and
``SINGULARITYENV_PREPEND_PATH`` for an image.

Both files start with :data:`MARKER`; the pipeline (which writes a stage's
``StageReport.outputs`` once the image is in place) only ever replaces files
carrying it, so a user's own file of the same name is never overwritten.

Functions
---------
lua_quote(text)
    A Lua string literal.
validate_bind(bind)
    Check one bind specification.
render_lua(*, image, binds, runscripts, name)
    The Lmod module file.
render_shell(*, image, binds, runscripts, name)
    The shell snippet.
"""

from collections.abc import Iterable
import logging
from pathlib import Path
import shlex
import unicodedata

from ..._version import __version__
from ...engine.stage import OUTPUT_MARKER

logger = logging.getLogger(f"cotainr.{__name__}")

#: The first-line marker of every file this module writes (the pipeline's
#: :data:`cotainr_lumi.engine.stage.OUTPUT_MARKER`).
MARKER = OUTPUT_MARKER


def lua_quote(text):
    r"""
    A Lua string literal.

    Parameters
    ----------
    text : str
        Any text.

    Returns
    -------
    literal : str
        A double quoted Lua string; backslashes, quotes and every control or
        non-ASCII byte are escaped as ``\\ddd``, so nothing in `text` can end
        the literal.
    """
    out = ['"']
    for byte in str(text).encode("utf-8"):
        char = chr(byte)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03d}")
    out.append('"')
    return "".join(out)


def validate_bind(bind):
    """
    Check one bind specification (``SRC[:DST[:OPTS]]``).

    Parameters
    ----------
    bind : str
        The bind.

    Returns
    -------
    bind : str
        The bind, unchanged.

    Raises
    ------
    ValueError
        If it does not start with ``/`` or contains ``,``, white space or NUL
        (which would split or break ``SINGULARITY_BIND``).
    """
    if not isinstance(bind, str) or not bind.startswith("/"):
        raise ValueError(
            f"a bind must be an absolute path SRC[:DST[:OPTS]] (got {bind!r})"
        )
    if any(c in bind for c in ",\0") or any(c.isspace() for c in bind):
        raise ValueError(f"the bind {bind!r} contains ',', white space or NUL")
    return bind


def check_image_path(image):
    """
    Check that an image path can be written into a module file.

    Parameters
    ----------
    image : os.PathLike
        The image path.

    Returns
    -------
    image : str
        The path as a string.

    Raises
    ------
    ValueError
        If it is not absolute or contains a control character (Lmod cannot
        pass a newline safely to the shell).
    """
    image = str(image)
    if not image.startswith("/") or any(unicodedata.category(c) == "Cc" for c in image):
        raise ValueError(
            f"the image path {image!r} is not absolute or contains control "
            "characters; no module file can be written for it"
        )
    return image


def _header(*, image, comment):
    # A newline in the path would end the comment: show control characters as "?".
    image = "".join(c if c.isprintable() else "?" for c in str(image))
    return [
        f"{comment} File {MARKER} {__version__} for {image}.",
        f"{comment} Rewritten when the image is rebuilt; copy it before editing.",
    ]


def render_lua(*, image, binds: Iterable[str], runscripts="/runscripts", name=None):
    """
    The Lmod module file for an image.

    Parameters
    ----------
    image : os.PathLike
        The absolute path of the ``.sif`` image.
    binds : iterable of str
        Bind specifications for ``SINGULARITY_BIND`` (see :func:`validate_bind`).
    runscripts : str or None, default="/runscripts"
        The runscripts directory in the image (None: not set).
    name : str, optional
        The module name (for the help text).

    Returns
    -------
    text : str
        Lua code for Lmod.
    """
    image = check_image_path(image)
    binds = [validate_bind(b) for b in binds]
    name = name or Path(image).stem
    help_text = (
        f"cotainr-lumi container image {image}\n\n"
        "Sets SIF (the image), SINGULARITY_BIND (the LUMI host paths the image\n"
        "needs), RUNSCRIPTS and SINGULARITYENV_PREPEND_PATH. Run with e.g.\n"
        '  srun singularity exec "$SIF" conda-python-distributed train.py\n'
    )
    lines = _header(image=image, comment="--")
    lines += [
        f"help({lua_quote(help_text)})",
        f"whatis({lua_quote('Name: ' + name)})",
        f"whatis({lua_quote('Description: cotainr-lumi container image ' + image)})",
        f'setenv("SIF", {lua_quote(image)})',
    ]
    if runscripts:
        lines += [
            f'setenv("RUNSCRIPTS", {lua_quote(runscripts)})',
            f'setenv("SINGULARITYENV_PREPEND_PATH", {lua_quote(runscripts)})',
        ]
    for bind in binds:
        lines.append(f'append_path("SINGULARITY_BIND", {lua_quote(bind)}, ",")')
    return "\n".join(lines) + "\n"


def render_shell(*, image, binds: Iterable[str], runscripts="/runscripts", name=None):
    """
    The POSIX shell snippet for an image (source it: ``. FILE``).

    Parameters
    ----------
    image : os.PathLike
        The absolute path of the ``.sif`` image.
    binds : iterable of str
        Bind specifications for ``SINGULARITY_BIND``; added only when missing.
    runscripts : str or None, default="/runscripts"
        The runscripts directory in the image (None: not set).
    name : str, optional
        Unused; for symmetry with :func:`render_lua`.

    Returns
    -------
    text : str
        Shell code.
    """
    image = check_image_path(image)
    binds = [validate_bind(b) for b in binds]
    lines = _header(image=image, comment="#")
    lines.append(
        '# Use: . THIS_FILE, then e.g. srun singularity exec "$SIF" conda-python-simple x.py'
    )
    lines.append(f"SIF={shlex.quote(image)}; export SIF")
    if runscripts:
        lines.append(f"RUNSCRIPTS={shlex.quote(runscripts)}; export RUNSCRIPTS")
        lines.append(
            f"SINGULARITYENV_PREPEND_PATH={shlex.quote(runscripts)}; "
            "export SINGULARITYENV_PREPEND_PATH"
        )
    for bind in binds:
        quoted = shlex.quote(bind)
        lines.append(
            f'case ",${{SINGULARITY_BIND-}}," in *,{quoted},*) ;; '
            f'*) SINGULARITY_BIND="${{SINGULARITY_BIND:+$SINGULARITY_BIND,}}"{quoted} ;; esac'
        )
    if binds:
        lines.append("export SINGULARITY_BIND")
    return "\n".join(lines) + "\n"
