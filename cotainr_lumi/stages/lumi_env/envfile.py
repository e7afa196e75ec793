"""
The image's env files: POSIX sh that Apptainer sources at container start.

Every value is a single quoted literal (:func:`shlex.quote`). Settings are
defaults: a variable already set in the shell, or listed in Apptainer's
``$__exported_env__`` (the host environment, hidden from env scripts), wins.
Search paths only get missing entries added.
"""

from collections.abc import Iterable, Mapping
import importlib.resources
import re
import shlex
import unicodedata

# Matched with fullmatch: "$" would also match before a trailing newline.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Search paths: extended with :func:`path_addition`, never assigned.
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


class EnvError(ValueError):
    """An environment variable name or value cannot be used."""


def text_problem(value, *, what, forbid=",:", spaces=False, absolute=True, use=""):
    """Why `value` cannot be `what`, a path or name in a list (None when it can)."""
    rule = [repr(c) for c in forbid] + ([] if spaces else ["white space"])
    if (
        isinstance(value, str)
        and value
        and (value.startswith("/") or not absolute)
        and not any(c in forbid or unicodedata.category(c) == "Cc" for c in value)
        and (spaces or not any(c.isspace() for c in value))
    ):
        return None
    kind = "an absolute path" if absolute else "non-empty text"
    return (
        f"{what} must be {kind} without {', '.join(rule)} or control characters"
        f"{f' (it goes into {use})' if use else ''} (got {value!r})"
    )


def printable(text):
    """`text` for a comment: control characters (a CR ends a Lua comment) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def validate_name(name):
    """Check an environment variable name."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
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


#: The longest value accepted (Linux's limit for one NAME=VALUE is 128 KiB).
MAX_VALUE_BYTES = 64 * 1024


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


def default_assignment(*, name, value):
    """Shell code setting a variable unless it is already set."""
    text = validate_value(name=name, value=value)
    return computed_default(name=name, expression=shlex.quote(text))


def computed_default(*, name, expression):
    """Shell code setting a variable to a shell expression unless already set."""
    validate_name(name)
    return (
        f'if [ -z "${{{name}+x}}" ]; then case "${{__exported_env__:-}}" in '
        f'{name}=*|*"\n{name}="*) ;; *) {name}={expression}; export {name} ;; esac; fi'
    )


def read_host_value(*, name, into, default):
    """Shell code: `into` = $name, the container's, else the host's, else `default`."""
    return f"""\
if [ -n "${{{name}+x}}" ]; then
    {into}=${name}
else
    _cl_env="
${{__exported_env__-}}"
    case "$_cl_env" in
    *"
{name}="*)
        {into}=${{_cl_env##*"
{name}="}}
        {into}=${{{into}%%"
"*}} ;;
    *) {into}={default} ;;
    esac
fi"""


def private_dir_defaults(*, groups):
    """Shell code setting variables, unless set, to private directories of the user.

    `groups` is a list of (names, path): the names share the directory at path.
    """
    # The runscript's cotainr_lumi_private_dir makes or checks the directory.
    runscripts = importlib.resources.files(__package__) / "runscripts"
    text = (runscripts / "conda-python-distributed").read_text()
    function = re.search(r"^cotainr_lumi_private_dir\(\) \{$.*?^\}$", text, re.M | re.S)
    lines = [function.group(0)]
    for (first, *others), path in groups:
        call = f'"$(cotainr_lumi_private_dir "{path}")"'
        lines.append(computed_default(name=first, expression=call))
        for name in others:  # no ${first:-$(...)}: Apptainer's shell runs the $(...)
            same = computed_default(name=name, expression=f'"${first}"')
            fresh = computed_default(name=name, expression=call)
            lines.append(f'if [ -n "${{{first}:-}}" ]; then {same}; else {fresh}; fi')
    return "\n".join([*lines, "unset -f cotainr_lumi_private_dir"])


def forced_assignment(*, name, value):
    """Shell code setting a variable unconditionally."""
    validate_name(name)
    return sh_op("setenv", name, validate_value(name=name, value=value))


def check_text(value, **rule):
    """`value`, or EnvError saying why :func:`text_problem` refuses it."""
    problem = text_problem(value, **rule)
    if problem:
        raise EnvError(problem)
    return value


def validate_path_entry(*, name, entry):
    """Check one search path entry."""
    return check_text(entry, what=f"{name} entry", forbid=":", spaces=True)


def path_addition(*, name, entries, position="append"):
    """Shell code adding entries to a search path unless present."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise EnvError(f"{name!r} is not a valid environment variable name")
    entries = [validate_path_entry(name=name, entry=e) for e in entries]
    if position == "prepend":
        entries.reverse()
    return "\n".join(sh_op(f"{position}_path", name, e, ":") for e in entries)


#: POSIX sh for the operations of :func:`.modulefile.module_ops`.
SH_OPS = {
    "setenv": "{0}={1}; export {0}",
    "pushenv": '[ -n "${{{0}-}}" ] || {0}={1}; export {0}',
    "prepend_path": 'case "{2}${{{0}-}}{2}" in *{2}{1}{2}*) ;; '
    '*) {0}={1}"${{{0}:+{2}${0}}}" ;; esac; export {0}',
    "append_path": 'case "{2}${{{0}-}}{2}" in *{2}{1}{2}*) ;; '
    '*) {0}="${{{0}:+${0}{2}}}"{1} ;; esac; export {0}',
    "discover": """unset {2} {3}; _cl_out=$(eval {0})
_cl_v=$(printf '%s\\n' "$_cl_out" | sed -n 's/^libmpi //p'); [ -z "$_cl_v" ] || export {2}="$_cl_v"
_cl_v=$(printf '%s\\n' "$_cl_out" | sed -n 's/^path //p'); [ -z "$_cl_v" ] || export {3}="$_cl_v"
printf '%s\\n' "$_cl_out" | sed -n 's/^{1} //p' >&2
unset _cl_out _cl_v""",
    "same_base": "if [ \"$(stat -L -c '%s %Y' -- {0} 2>/dev/null)\" != {1} ]; then "
    "printf '%s\\n' {2} >&2; return 1; fi",
    "file": "[ -f {0} ]",
    "dir": "[ -d {0} ]",
}


def sh_op(kind, *args):
    """One operation in POSIX sh, every argument quoted (None: not in sh)."""
    template = SH_OPS.get(kind)
    return template and template.format(*map(shlex.quote, args))


def render_env_file(*, header, blocks: Iterable[str]):
    """Join code blocks into an env file."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [""] + [block.rstrip("\n") for block in blocks if block]
    return "\n".join(lines) + "\n"


def default_assignments(env: Mapping[str, object]):
    """Default assignments for a mapping, skipping ``None`` values."""
    return "\n".join(
        default_assignment(name=name, value=value)
        for name, value in env.items()
        if value is not None
    )
