"""
The one reader of the YAML files users write, with line numbers.

Profiles, pip steps files and conda environment files are read here: one
set of messages for a file that cannot be read, is not UTF-8 or is not YAML.
Mappings and lists come back as :class:`LineDict` and :class:`LineList`,
which remember the line of each key and item, so that a later check can
name the line of a bad value (:func:`line_of`).

Classes
-------
LineDict
    A mapping from a YAML file, with the line of each key.
LineList
    A list from a YAML file, with the line of each item.

Functions
---------
read_yaml(*, path, error)
    Read a YAML file.
line_of(*, data, path)
    The line of the value at `path` in data read by :func:`read_yaml`.
"""

from collections.abc import Hashable
import logging
from pathlib import Path

import yaml

logger = logging.getLogger(f"cotainr.{__name__}")


class LineDict(dict):
    """
    A mapping from a YAML file, with the line of each key.

    Attributes
    ----------
    line : int or None
        The 1-based line where the mapping starts.
    lines : dict
        The 1-based line of each key.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.line = None
        self.lines = {}


class LineList(list):
    """
    A list from a YAML file, with the line of each item.

    Attributes
    ----------
    line : int or None
        The 1-based line where the list starts.
    lines : list of int
        The 1-based line of each item.
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.line = None
        self.lines = []


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, keeping the lines of keys and items."""


def _construct_mapping(loader, node):
    data = LineDict()
    yield data
    data.update(loader.construct_mapping(node, deep=True))
    data.line = node.start_mark.line + 1
    for key_node, _value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable):
            data.lines[key] = key_node.start_mark.line + 1


def _construct_sequence(loader, node):
    data = LineList()
    yield data
    data.extend(loader.construct_sequence(node, deep=True))
    data.line = node.start_mark.line + 1
    data.lines = [item.start_mark.line + 1 for item in node.value]


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def read_yaml(*, path, error):
    """
    Read a YAML file.

    Parameters
    ----------
    path : os.PathLike
        The file.
    error : callable
        ``error(message) -> Exception`` for a file that cannot be read, is not
        UTF-8 or not YAML; `message` is a predicate such as ``"is not valid
        YAML at line 3, column 5: ..."``.

    Returns
    -------
    data : object
        The content (None for an empty file); mappings and lists are
        :class:`LineDict` and :class:`LineList`.

    Raises
    ------
    Exception
        What `error` returns.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
        return yaml.load(text, Loader=_Loader)
    except OSError as e:
        raise error(f"cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise error(f"is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"is not valid YAML{where}: {problem}") from None


def line_of(*, data, path):
    """
    The line of the value at `path` in data read by :func:`read_yaml`.

    Parameters
    ----------
    data : object
        What :func:`read_yaml` returned (or a part of it).
    path : sequence
        Keys and 0-based list indices leading to the value.

    Returns
    -------
    line : int or None
        The line of the deepest part of `path` that is in `data` (None when
        `data` did not come from a file).
    """
    line = getattr(data, "line", None)
    for part in path:
        if isinstance(data, LineDict) and isinstance(part, Hashable) and part in data:
            line = data.lines.get(part, line)
        elif (
            isinstance(data, LineList)
            and isinstance(part, int)
            and 0 <= part < len(data)
            and part < len(data.lines)
        ):
            line = data.lines[part]
        else:
            break
        data = data[part]
    return line
