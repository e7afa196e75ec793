"""
The validators of text that goes into an env file or a module file (a leaf).

Each check returns its argument or raises :class:`EnvError` (a ValueError);
``text_problem`` returns the reason instead (None: fine).
"""

import re

# Matched with fullmatch: "$" would also match before a trailing newline.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Search paths: extended with ``envfile.path_addition``, never assigned.
PATH_VARIABLES = frozenset({"PATH", "LD_LIBRARY_PATH"})

#: Names an env file must not set: shell and session state, and the search
#: paths (see :data:`PATH_VARIABLES`).
RESERVED_NAMES = PATH_VARIABLES | frozenset(
    "_ BASH_ENV CDPATH ENV EUID HOME HOSTNAME IFS LOGNAME OLDPWD OPTARG OPTIND "
    "PPID PROMPT_COMMAND PS1 PS2 PS3 PS4 PWD SHELL SHELLOPTS SHLVL UID USER".split()
)

#: Name prefixes that configure the container runtime itself.
RESERVED_PREFIXES = tuple(
    "APPTAINER_ APPTAINERENV_ SINGULARITY_ SINGULARITYENV_ BASH_FUNC_".split()
)

#: Unicode's control characters (category Cc), as a regular expression range.
CONTROL_CHARACTERS = r"\x00-\x1f\x7f-\x9f"

#: The longest value accepted (Linux's limit for one NAME=VALUE is 128 KiB).
MAX_VALUE_BYTES = 64 * 1024

#: The rules of :func:`text_problem` for the module's places.
MODULE_DIR = dict(
    what="the module directory",
    forbid=":",
    spaces=True,
    absolute=False,
    use="MODULEPATH",
)
CONTAINER_ROOT = dict(what="CONTAINERROOT", absolute=False, use="SINGULARITY_BIND")


class EnvError(ValueError):
    """An environment variable name or value cannot be used."""


def text_problem(value, *, what, forbid=",:", spaces=False, absolute=True, use=""):
    """Why `value` cannot be `what`, a path or name in a list (None when it can)."""
    rule = [repr(c) for c in forbid]
    bad = re.escape(forbid) + CONTROL_CHARACTERS
    if not spaces:
        rule.append("white space")
        bad += r"\s"
    start = "/" if absolute else ""
    if isinstance(value, str) and value and value.startswith(start):
        if not re.search(f"[{bad}]", value):
            return None
    kind = "an absolute path" if absolute else "non-empty text"
    where = f" (it goes into {use})" if use else ""
    return (
        f"{what} must be {kind} without {', '.join(rule)} or control characters"
        f"{where} (got {value!r})"
    )


def check_text(value, **rule):
    """`value`, or EnvError saying why :func:`text_problem` refuses it."""
    problem = text_problem(value, **rule)
    if problem:
        raise EnvError(problem)
    return value


def validate_path_entry(*, name, entry):
    """Check one search path entry."""
    return check_text(entry, what=f"{name} entry", forbid=":", spaces=True)


def validate_bind(bind):
    """Check one bind specification (``SRC[:DST[:OPTS]]``)."""
    return check_text(bind, what="a bind SRC[:DST[:OPTS]]", forbid=",")


def check_image_path(image):
    """Check that an image path can be written into a module file."""
    what = "the image path (no module file can be written for it)"
    return check_text(str(image), what=what, forbid="", spaces=True)


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


def check_module_name(value):
    """Check the name of a module Lmod loads."""
    what = "the module name"
    check_text(value, what=what, forbid=",:/", absolute=False)
    if value.startswith((".", "-")):
        raise EnvError(f"{what} must not start with '.' or '-' (got {value!r})")
    if value.endswith((".lua", ".sh")):
        raise EnvError(
            f"{what} must not end in .lua or .sh, the module files' (got {value!r})"
        )
    return value


def is_name(name):
    """Whether `name` is an environment variable name."""
    return isinstance(name, str) and bool(_NAME_RE.fullmatch(name))


def validate_name(name):
    """Check an environment variable name."""
    if not is_name(name):
        raise EnvError(
            f"{name!r} is not a valid environment variable name: use letters, "
            "digits and '_', not starting with a digit"
        )
    if name in PATH_VARIABLES:
        raise EnvError(
            f"{name} cannot be set as a value (it would replace the image's "
            "search path); add directories with the 'path' or "
            "'ld-library-path' settings instead"
        )
    if name in RESERVED_NAMES:
        raise EnvError(
            f"{name} is reserved for the shell or the session and cannot be set"
        )
    if name.startswith(RESERVED_PREFIXES):
        raise EnvError(
            f"{name} configures the container runtime and cannot be set in the image"
        )
    return name


def validate_value(*, name, value):
    """Check a value and turn it into a string."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise EnvError(
            f"the value of {name} must be a string or a number (got "
            f'{type(value).__name__} {value!r}); quote it, e.g. "1"'
        )
    text = str(value)
    if "\0" in text:
        raise EnvError(f"the value of {name} contains a NUL character")
    if len(text.encode("utf-8", errors="replace")) > MAX_VALUE_BYTES:
        raise EnvError(
            f"the value of {name} is {len(text)} characters long, more than the "
            f"{MAX_VALUE_BYTES} bytes an environment variable may safely have "
            "(Linux refuses one NAME=VALUE over 128 KiB when starting a "
            "program); put long data in a file and set its path instead"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise EnvError(
            f"the value of {name} is not valid UTF-8 ({text!r}); give it as UTF-8 text"
        ) from None
    return text
