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

from .ops import AppendPath, PrependPath, SetEnv
from .validators import (
    EnvError,
    is_name,
    validate_name,
    validate_path_entry,
    validate_value,
)


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
    return SetEnv(name, validate_value(name=name, value=value)).code("sh")


def path_addition(*, name, entries, position="append"):
    """Shell code adding entries to a search path unless present."""
    if not is_name(name):
        raise EnvError(f"{name!r} is not a valid environment variable name")
    entries = [validate_path_entry(name=name, entry=e) for e in entries]
    op = AppendPath
    if position == "prepend":
        op = PrependPath
        entries.reverse()
    return "\n".join(op(name, e).code("sh") for e in entries)


def render_env_file(*, header, blocks: Iterable[str]):
    """Join code blocks into an env file."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [""] + [block.rstrip("\n") for block in blocks if block]
    return "\n".join(lines) + "\n"


def default_assignments(env: Mapping[str, object]):
    """Shell code setting each variable unless it is set (``None`` values: not)."""
    return "\n".join(
        computed_default(
            name=n, expression=shlex.quote(validate_value(name=n, value=v))
        )
        for n, v in env.items()
        if v is not None
    )
