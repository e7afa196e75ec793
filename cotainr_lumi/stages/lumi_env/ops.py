"""
The module file's operations: typed records, each with its Lua and its sh.

The module file (Lmod Lua) and its shell snippet (POSIX sh, to source) are
rendered from one list of these records (:func:`render`). An operation's
``LUA`` and ``SH`` templates get its fields in order, each quoted for the
language; an operation without ``SH`` is not in the snippet.
"""

from dataclasses import astuple, dataclass
import shlex
import textwrap
from typing import ClassVar, Optional


def lua_quote(text):
    """A Lua string literal."""
    data = str(text).encode("utf-8")
    safe = (
        chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\{b:03d}" for b in data
    )
    return '"' + "".join(safe) + '"'


def printable(text):
    """`text` for a comment: control characters (a CR ends a Lua comment) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


#: The string literal and the comment of each language.
QUOTE = {"lua": lua_quote, "sh": shlex.quote}
COMMENT = {"lua": "--", "sh": "#"}


class Op:
    """An operation: its fields fill the ``LUA`` and ``SH`` templates."""

    LUA: ClassVar[str]
    SH: ClassVar[Optional[str]] = None

    def code(self, language):
        """The operation in Lmod's Lua (``lua``) or POSIX sh (``sh``; None: not in sh)."""
        template = getattr(self, language.upper())
        return template and template.format(*map(QUOTE[language], self.args(language)))

    def args(self, language):
        """The values the `language` template gets."""
        return astuple(self)


@dataclass(frozen=True)
class Comment(Op):
    """A comment line: ``-- text`` in Lua, ``# text`` in sh."""

    text: str

    def code(self, language):
        """The comment, control characters as ``?``."""
        return f"{COMMENT[language]} {printable(self.text)}"


@dataclass(frozen=True)
class Help(Op):
    """The text of ``module help``."""

    LUA = "help({0})"
    text: str


@dataclass(frozen=True)
class Whatis(Op):
    """A line of ``module whatis``."""

    LUA = "whatis({0})"
    text: str


@dataclass(frozen=True)
class SetEnv(Op):
    """Set a variable."""

    LUA = "setenv({0}, {1})"
    SH = "{0}={1}; export {0}"
    name: str
    value: str


@dataclass(frozen=True)
class PushEnv(Op):
    """Set a variable unless it is set."""

    LUA = "pushenv({0}, {1})"
    SH = '[ -n "${{{0}-}}" ] || {0}={1}; export {0}'
    name: str
    value: str


@dataclass(frozen=True)
class PrependPath(Op):
    """Put an entry first in a search path (`sep` separated) unless present."""

    LUA = "prepend_path({0}, {1}, {2})"
    SH = (
        'case "{2}${{{0}-}}{2}" in *{2}{1}{2}*) ;; '
        '*) {0}={1}"${{{0}:+{2}${0}}}" ;; esac; export {0}'
    )
    name: str
    entry: str
    sep: str = ":"

    def args(self, language):
        """Lmod drops a final "/" from path entries: "//" keeps one."""
        if language == "lua" and self.entry.endswith("/"):
            return self.name, self.entry + "/", self.sep
        return astuple(self)


@dataclass(frozen=True)
class AppendPath(PrependPath):
    """Put an entry last in a search path (`sep` separated) unless present."""

    LUA = "append_path({0}, {1}, {2})"
    SH = (
        'case "{2}${{{0}-}}{2}" in *{2}{1}{2}*) ;; '
        '*) {0}="${{{0}:+${0}{2}}}"{1} ;; esac; export {0}'
    )


def bind(value):
    """The operation adding a bind to ``SINGULARITY_BIND``."""
    return AppendPath("SINGULARITY_BIND", value, ",")


@dataclass(frozen=True)
class Discover(Op):
    """Find the host's MPI on load (``mpi.discovery_program``); unload unsets it.

    The line of key `say` is shown; the library and path go to `lib_var` and
    `path_var`.
    """

    LUA = """local cl = {{libmpi = os.getenv({2}), path = os.getenv({3})}}
if mode() == "load" then
    cl = {{}}
    for k, v in capture({0}):gmatch("(%a+) ([^\\n]*)") do cl[k] = v end
    if cl[{1}] then LmodMessage(cl[{1}]) end
end
if cl.libmpi then setenv({2}, cl.libmpi) end
if cl.path then setenv({3}, cl.path) end"""
    SH = """unset {2} {3}; _cl_out=$(eval {0})
_cl_v=$(printf '%s\\n' "$_cl_out" | sed -n 's/^libmpi //p'); [ -z "$_cl_v" ] || export {2}="$_cl_v"
_cl_v=$(printf '%s\\n' "$_cl_out" | sed -n 's/^path //p'); [ -z "$_cl_v" ] || export {3}="$_cl_v"
printf '%s\\n' "$_cl_out" | sed -n 's/^{1} //p' >&2
unset _cl_out _cl_v"""
    command: str
    say: str
    lib_var: str
    path_var: str


@dataclass(frozen=True)
class SameBase(Op):
    """Refuse to load a layer's module on another base than its own.

    `stamp`: the base's ``stat -L -c '%s %Y'`` at build time; `stat`: the
    shell command printing it now (the sh has its own).
    """

    LUA = 'if mode() == "load" and capture({3}) ~= {1} .. "\\n" then LmodError({2}) end'
    SH = (
        "if [ \"$(stat -L -c '%s %Y' -- {0} 2>/dev/null)\" != {1} ]; then "
        "printf '%s\\n' {2} >&2; return 1; fi"
    )
    path: str
    stamp: str
    message: str
    stat: str


#: IfPath in each language: if, elif, end, its tests of a file and a directory.
IF_PATH = {
    "lua": ("if {} then", "elseif {} then", "end", "isFile({})", "isDir({})"),
    "sh": ("if {}; then", "elif {}; then", "fi", "[ -f {} ]", "[ -d {} ]"),
}


@dataclass(frozen=True)
class IfPath(Op):
    """The operations of the first branch whose path exists.

    `branches`: (``file`` or ``dir``, path, operations), tested in order.
    """

    branches: tuple

    def code(self, language):
        """``if isFile(...) then ... elseif isDir(...) then ... end`` (sh: ``[ -f ]``)."""
        first, other, end, is_file, is_dir = IF_PATH[language]
        lines = []
        for i, (kind, path, ops) in enumerate(self.branches):
            test = {"file": is_file, "dir": is_dir}[kind].format(QUOTE[language](path))
            lines.append((other if i else first).format(test))
            text = render(ops, language=language).rstrip("\n")
            lines.append(textwrap.indent(text, "    "))
        return "\n".join([*lines, end])


def render(ops, *, language):
    """The module file (``lua``) or shell snippet (``sh``, to source) of `ops`."""
    texts = (op.code(language) for op in ops)
    return "\n".join(text for text in texts if text is not None) + "\n"
