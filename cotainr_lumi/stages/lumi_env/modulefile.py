"""
The files written next to an image: an Lmod module file and a shell snippet.

Bind mounts cannot be baked into a SIF, so, like the LUMI EasyBuild container
modules, a module file (Lua, for Lmod) and an equivalent POSIX shell snippet
set what LUST's EasyBuild container modules set: ``SIF``, ``SIF<NAME>``,
``CONTAINERROOT``, ``EBROOT<NAME>``, ``RUNSCRIPTS``, ``SINGULARITY_BIND``
(with ``/user-software``) and ``SINGULARITYENV_PREPEND_PATH``, and put the
host commands of ``$CONTAINERROOT/bin`` on ``PATH``.

Both files start with :data:`MARKER`; the pipeline (which writes a stage's
``StageReport.outputs`` once the image is in place) only ever replaces files
carrying it, so a user's own file of the same name is never overwritten.
"""

from collections.abc import Iterable
import logging
from pathlib import Path
import re
import shlex
import unicodedata

from ..._version import __version__
from ...engine.stage import OUTPUT_MARKER
from ...imagelayout import RUNSCRIPTS_DIR, USER_SOFTWARE_DIR

logger = logging.getLogger(f"cotainr.{__name__}")

#: The first-line marker of every file this module writes (the pipeline's
#: :data:`cotainr_lumi.engine.stage.OUTPUT_MARKER`).
MARKER = OUTPUT_MARKER


def lua_quote(text):
    r"""A Lua string literal."""
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
    """Check one bind specification (``SRC[:DST[:OPTS]]``)."""
    if not isinstance(bind, str) or not bind.startswith("/"):
        raise ValueError(
            f"a bind must be an absolute path SRC[:DST[:OPTS]] (got {bind!r})"
        )
    if any(c in bind for c in ",\0") or any(c.isspace() for c in bind):
        raise ValueError(f"the bind {bind!r} contains ',', white space or NUL")
    return bind


def check_image_path(image):
    """Check that an image path can be written into a module file."""
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


def var_name_of(name):
    """The ``SIF<NAME>`` suffix for a module name, as EasyBuild would make it."""
    var = re.sub(r"[^A-Z0-9]+", "_", str(name).upper()).strip("_")
    if not var or not var[0].isalpha():
        var = "IMAGE_" + var if var else "IMAGE"
    return var


def check_var_name(var):
    """Check a ``SIF<NAME>`` suffix."""
    if not isinstance(var, str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", var):
        raise ValueError(
            f"must be upper case letters, digits and '_', starting with a letter "
            f"(got {var!r}), e.g. PYTORCH for SIFPYTORCH"
        )
    return var


def _checked(*, image, binds, name, var, container_root):
    """The arguments of the renderers, checked, with their defaults filled in."""
    image = check_image_path(image)
    binds = [validate_bind(b) for b in binds]
    name = name or Path(image).stem
    var = check_var_name(var or var_name_of(name))
    root = check_image_path(container_root) if container_root else None
    return image, binds, name, var, root


def render_lua(
    *,
    image,
    binds: Iterable[str],
    runscripts=RUNSCRIPTS_DIR,
    name=None,
    var=None,
    container_root=None,
    user_software=True,
):
    """The Lmod module file for an image, a drop-in for LUST's EasyBuild modules."""
    image, binds, name, var, root = _checked(
        image=image, binds=binds, name=name, var=var, container_root=container_root
    )
    lines = _header(image=image, comment="--")
    lines += [
        f"help({lua_quote(_help_text(image=image, var=var, root=root))})",
        f"whatis({lua_quote('Name: ' + name)})",
        f"whatis({lua_quote('Description: cotainr-lumi container image ' + image)})",
        f'setenv("SIF", {lua_quote(image)})',
        f'setenv("SIF{var}", {lua_quote(image)})',
    ]
    if runscripts:
        lines.append(
            f'prepend_path("SINGULARITYENV_PREPEND_PATH", {lua_quote(runscripts)})'
        )
    if root:
        lines += _lua_container_root(root=root, var=var, runscripts=runscripts)
        lines += _lua_user_software() if user_software else []
    elif runscripts:
        lines.append(f'setenv("RUNSCRIPTS", {lua_quote(runscripts)})')
    lines += [f'append_path("SINGULARITY_BIND", {lua_quote(b)}, ",")' for b in binds]
    return "\n".join(lines) + "\n"


def _help_text(*, image, var, root):
    """The module's help text."""
    text = (
        f"cotainr-lumi container image {image}\n\n"
        f"Sets SIF and SIF{var} (the image), SINGULARITY_BIND (the LUMI host paths\n"
        f"the image needs), SINGULARITYENV_PREPEND_PATH ({RUNSCRIPTS_DIR} first in the\n"
        "container)"
    )
    if root:
        text += (
            f", CONTAINERROOT ({root}), RUNSCRIPTS (host copies of the\n"
            "runscripts) and puts start-shell, make-squashfs and unmake-squashfs on\n"
            "PATH. $CONTAINERROOT/user-software (or user-software.squashfs, after\n"
            f"make-squashfs) is mounted at {USER_SOFTWARE_DIR}; a venv there is active in\n"
            f"the container (source {RUNSCRIPTS_DIR}/init-conda-venv creates it)"
        )
    return (
        text
        + '. Run with e.g.\n  srun singularity exec "$SIF" conda-python-distributed train.py\n'
    )


def _lua_container_root(*, root, var, runscripts):
    """Lua lines setting CONTAINERROOT, EBROOT<NAME>, RUNSCRIPTS and PATH."""
    lines = [
        f"local root = {lua_quote(root)}",
        'setenv("CONTAINERROOT", root)',
        f'setenv("EBROOT{var}", root)',
        'prepend_path("PATH", pathJoin(root, "bin"))',
    ]
    if runscripts:
        lines += [
            'setenv("RUNSCRIPTS", pathJoin(root, "runscripts"))',
            f'setenv("RUNSCRIPTS{var}", pathJoin(root, "runscripts"))',
        ]
    return lines


def _lua_user_software():
    """Lua lines binding $CONTAINERROOT's user-software (after `local root`)."""
    return [
        f"-- {USER_SOFTWARE_DIR}: the SquashFS file when there is one, else the directory.",
        "-- (image-src=// because Lmod drops a final '/' from path entries.)",
        'local squashfs = pathJoin(root, "user-software.squashfs")',
        "if isFile(squashfs) then",
        f'    append_path("SINGULARITY_BIND", squashfs .. ":{USER_SOFTWARE_DIR}:image-src=//", ",")',
        'elseif isDir(pathJoin(root, "user-software")) then',
        f'    append_path("SINGULARITY_BIND", pathJoin(root, "user-software") .. ":{USER_SOFTWARE_DIR}", ",")',
        "end",
    ]


def _shell_bind(value):
    """Shell code adding one bind (a shell word) to SINGULARITY_BIND when missing."""
    return (
        f'case ",${{SINGULARITY_BIND-}}," in *,{value},*) ;; '
        f'*) SINGULARITY_BIND="${{SINGULARITY_BIND:+$SINGULARITY_BIND,}}"{value} ;; esac'
    )


def render_shell(
    *,
    image,
    binds: Iterable[str],
    runscripts=RUNSCRIPTS_DIR,
    name=None,
    var=None,
    container_root=None,
    user_software=True,
):
    """The POSIX shell snippet for an image (source it: ``. FILE``)."""
    image, binds, name, var, root = _checked(
        image=image, binds=binds, name=name, var=var, container_root=container_root
    )
    lines = _header(image=image, comment="#")
    lines.append(
        '# Use: . THIS_FILE, then e.g. srun singularity exec "$SIF" conda-python-simple x.py'
    )
    lines.append(f"SIF={shlex.quote(image)}; export SIF")
    lines.append(f"SIF{var}=$SIF; export SIF{var}")
    if runscripts:
        lines += _shell_prepend_runscripts(runscripts)
    if root:
        lines += _shell_container_root(root=root, var=var, runscripts=runscripts)
        lines += _shell_user_software() if user_software else []
    elif runscripts:
        lines.append(f"RUNSCRIPTS={shlex.quote(runscripts)}; export RUNSCRIPTS")
    lines += [_shell_bind(shlex.quote(bind)) for bind in binds]
    if binds or root:
        lines.append('[ -n "${SINGULARITY_BIND-}" ] && export SINGULARITY_BIND || :')
    return "\n".join(lines) + "\n"


def _shell_prepend_runscripts(runscripts):
    """Shell lines putting `runscripts` first on the container's PATH."""
    quoted = shlex.quote(runscripts)
    return [
        f'case ":${{SINGULARITYENV_PREPEND_PATH-}}:" in *:{quoted}:*) ;; '
        f'*) SINGULARITYENV_PREPEND_PATH={quoted}"${{SINGULARITYENV_PREPEND_PATH:+:$SINGULARITYENV_PREPEND_PATH}}" ;; esac',
        "export SINGULARITYENV_PREPEND_PATH",
    ]


def _shell_container_root(*, root, var, runscripts):
    """Shell lines setting CONTAINERROOT, EBROOT<NAME>, RUNSCRIPTS and PATH."""
    lines = [
        f"CONTAINERROOT={shlex.quote(root)}; export CONTAINERROOT",
        f"EBROOT{var}=$CONTAINERROOT; export EBROOT{var}",
        'case ":${PATH-}:" in *:"$CONTAINERROOT/bin":*) ;; '
        '*) PATH="$CONTAINERROOT/bin${PATH:+:$PATH}" ;; esac',
        "export PATH",
    ]
    if runscripts:
        lines += [
            'RUNSCRIPTS="$CONTAINERROOT/runscripts"; export RUNSCRIPTS',
            f"RUNSCRIPTS{var}=$RUNSCRIPTS; export RUNSCRIPTS{var}",
        ]
    return lines


def _shell_user_software():
    """Shell lines binding $CONTAINERROOT's user-software."""
    return [
        'if [ -f "$CONTAINERROOT/user-software.squashfs" ]; then',
        "    "
        + _shell_bind(
            f'"$CONTAINERROOT/user-software.squashfs:{USER_SOFTWARE_DIR}:image-src=/"'
        ),
        'elif [ -d "$CONTAINERROOT/user-software" ]; then',
        "    " + _shell_bind(f'"$CONTAINERROOT/user-software:{USER_SOFTWARE_DIR}"'),
        "fi",
    ]
