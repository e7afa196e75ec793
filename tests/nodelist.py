"""
Slurm node list (hostlist) expansion: the tests' reference for ``get-master``.

The reference implementation of what the ``get-master`` runscript
(``cotainr_lumi/stages/lumi_env/runscripts/get-master``) does in bash inside
the image: ``nid[005252-005254,005256],nid007000`` expands to
``nid005252 nid005253 nid005254 nid005256 nid007000``.
``tests/stages/lumi_env/test_nodelist.py`` checks the bash script against
this module; no package code uses it.

Grammar (as Slurm's ``hostlist.c`` reads it): a node list is a comma
separated list of host expressions; commas inside brackets do not separate.
A host expression is text with any number of bracket groups; a group is a
comma separated list of ``N`` or ``LO-HI`` (decimal digits, ``LO <= HI``).
Numbers are zero padded to the width of ``LO``. Several groups in one
expression expand as a cartesian product, leftmost group slowest.

Functions
---------
expand_nodelist(nodelist)
    All host names of a node list, in order.
first_host(nodelist)
    The first host name of a node list.
"""

import itertools
import re

# Matched with fullmatch ("$" would also match before a trailing newline).
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
#: White space as Slurm (C isspace) and the bash script see it.
WHITESPACE = " \t\n\r\v\f"
_HOST_CHARS_RE = re.compile(r"[^\[\],\t\n\r\v\f ]*")
#: The most significant digits a node number may have: bash arithmetic (in
#: ``get-master``) is 64-bit, so larger numbers would wrap around.
MAX_DIGITS = 18


class NodelistError(ValueError):
    """A Slurm node list is malformed."""


def _split_top_level(text):
    """Split at commas that are not inside brackets."""
    items = []
    depth = 0
    current = []
    for char in text:
        if char == "[":
            if depth:
                raise NodelistError(f"nested '[' in node list {text!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise NodelistError(f"unbalanced ']' in node list {text!r}")
            depth = 0
        elif char == "," and not depth:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise NodelistError(f"unclosed '[' in node list {text!r}")
    items.append("".join(current))
    return items


def _parse_group(group, *, nodelist):
    """The ranges ``(lo_text, lo, hi)`` of one bracket group, checked."""
    ranges = []
    for part in group.split(","):
        match = _RANGE_RE.fullmatch(part)
        if not match:
            raise NodelistError(f"bad range {part!r} in node list {nodelist!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        for text in (lo_text, hi_text or ""):
            if len(text.lstrip("0")) > MAX_DIGITS:
                raise NodelistError(
                    f"number {text} in node list {nodelist!r} is too large "
                    f"(more than {MAX_DIGITS} digits)"
                )
        # (Python limits int() to 4300 digits: leading zeros are dropped.)
        lo = int(lo_text.lstrip("0") or "0")
        hi = lo if hi_text is None else int(hi_text.lstrip("0") or "0")
        if hi < lo:
            raise NodelistError(f"descending range {part!r} in node list {nodelist!r}")
        ranges.append((lo_text, lo, hi))
    return ranges


def _parse_item(item, *, nodelist):
    """The texts and parsed groups of one host expression, checked."""
    if not item:
        raise NodelistError(f"empty host name in node list {nodelist!r}")
    pieces = re.split(r"\[([^\]]*)\]", item)
    # pieces: text, group, text, group, ..., text
    texts = pieces[0::2]
    for text in texts:
        if not _HOST_CHARS_RE.fullmatch(text):
            raise NodelistError(f"bad host name {item!r} in node list {nodelist!r}")
    groups = [_parse_group(g, nodelist=nodelist) for g in pieces[1::2]]
    return texts, groups


def _join(texts, numbers):
    name = texts[0]
    for number, text in zip(numbers, texts[1:]):
        name += number + text
    return name


def _parse(nodelist):
    """Every host expression of a node list, parsed and checked."""
    nodelist = nodelist.strip(WHITESPACE)
    if not nodelist:
        raise NodelistError("empty node list")
    return [_parse_item(i, nodelist=nodelist) for i in _split_top_level(nodelist)]


def expand_nodelist(nodelist: str) -> list[str]:
    """
    All host names of a node list, in order.

    Parameters
    ----------
    nodelist : str
        A Slurm node list such as ``nid[005252-005254,005256],nid007000``.

    Returns
    -------
    hosts : list of str
        The host names, in the order the list gives them (duplicates kept).

    Raises
    ------
    NodelistError
        If the node list is malformed (empty host, unbalanced or nested
        brackets, a range that is not ``N`` or ``LO-HI`` with ``LO <= HI``,
        a number with more than :data:`MAX_DIGITS` significant digits).
    """
    hosts = []
    for texts, groups in _parse(nodelist):
        numbers = [
            [
                f"{n:0{len(lo_text)}d}"
                for lo_text, lo, hi in group
                for n in range(lo, hi + 1)
            ]
            for group in groups
        ]
        hosts.extend(_join(texts, combo) for combo in itertools.product(*numbers))
    return hosts


def first_host(nodelist: str) -> str:
    """
    The first host name of a node list.

    Parameters
    ----------
    nodelist : str
        A Slurm node list.

    Returns
    -------
    host : str
        The first host (what ``get-master`` prints: the rank 0 node),
        without expanding the ranges.

    Raises
    ------
    NodelistError
        If the node list is malformed (as for :func:`expand_nodelist`).
    """
    # The whole list is checked, but only the first host is built: a range
    # such as n[0-99999999999] costs nothing. The first number of a group is
    # its first LO, which is already padded to its own width.
    texts, groups = _parse(nodelist)[0]
    return _join(texts, [group[0][0] for group in groups])
