"""
Slurm node list (hostlist) expansion.

The reference implementation of what the ``get-master`` runscript does in
bash inside the image: ``nid[005252-005254,005256],nid007000`` expands to
``nid005252 nid005253 nid005254 nid005256 nid007000``. The tests check the
bash script against this module.

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
import logging
import re

logger = logging.getLogger(f"cotainr.{__name__}")

_RANGE_RE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
_HOST_CHARS_RE = re.compile(r"^[^\[\],\s]*$")


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


def _expand_group(group, *, nodelist):
    """The numbers (as padded strings) of one bracket group."""
    numbers = []
    for part in group.split(","):
        match = _RANGE_RE.match(part)
        if not match:
            raise NodelistError(f"bad range {part!r} in node list {nodelist!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            raise NodelistError(f"descending range {part!r} in node list {nodelist!r}")
        width = len(lo_text)
        numbers.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return numbers


def _expand_item(item, *, nodelist):
    """The host names of one host expression."""
    if not item:
        raise NodelistError(f"empty host name in node list {nodelist!r}")
    pieces = re.split(r"\[([^\]]*)\]", item)
    # pieces: text, group, text, group, ..., text
    texts = pieces[0::2]
    for text in texts:
        if not _HOST_CHARS_RE.match(text):
            raise NodelistError(f"bad host name {item!r} in node list {nodelist!r}")
    groups = [_expand_group(g, nodelist=nodelist) for g in pieces[1::2]]
    hosts = []
    for combo in itertools.product(*groups):
        name = texts[0]
        for number, text in zip(combo, texts[1:]):
            name += number + text
        hosts.append(name)
    return hosts


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
        brackets, a range that is not ``N`` or ``LO-HI`` with ``LO <= HI``).
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise NodelistError("empty node list")
    hosts = []
    for item in _split_top_level(nodelist):
        hosts.extend(_expand_item(item, nodelist=nodelist))
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
        The first host (what ``get-master`` prints: the rank 0 node).

    Raises
    ------
    NodelistError
        If the node list is malformed.
    """
    return expand_nodelist(nodelist)[0]
