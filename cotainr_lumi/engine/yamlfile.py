"""
The one reader of the YAML files users write, with line numbers.

Mappings and lists come back as :class:`LineDict` and :class:`LineList`, which
remember the line of each key and item (:func:`line_of`).
"""

from collections.abc import Hashable
from pathlib import Path

import yaml


class LineDict(dict):
    """A mapping from a YAML file, with the line of each key (`lines`)."""

    line = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines = {}


class LineList(list):
    """A list from a YAML file, with the line of each item (`lines`, by index)."""

    line = None

    def __init__(self, *args):
        super().__init__(*args)
        self.lines = {}


#: The largest YAML file read (profiles, steps and conda env files are small).
MAX_BYTES = 1024 * 1024
#: The deepest nesting of mappings and lists accepted.
MAX_DEPTH = 64
#: The most aliases (``*name``) accepted in one document.
MAX_ALIASES = 100
#: The most values a document may hold once its aliases are expanded (an
#: "alias bomb" of a few hundred bytes expands to millions).
MAX_VALUES = 100_000


def _expanded_size(node, sizes):
    """The number of values under `node` with aliases expanded (memoised)."""
    key = id(node)
    if key not in sizes:
        sizes[key] = 1  # a node reached again through itself counts once
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        sizes[key] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[key]


def _refuse(problem, mark):
    raise yaml.MarkedYAMLError(problem=problem, problem_mark=mark)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, keeping the lines of keys and items, and bounded."""

    depth = 0
    aliases = 0

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_VALUES:
            _refuse(
                f"expands to more than {MAX_VALUES} values through its aliases",
                node.start_mark,
            )
        return node

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
        if self.aliases > MAX_ALIASES:
            _refuse(
                f"more than {MAX_ALIASES} aliases (*name); write the values out",
                self.peek_event().start_mark,
            )
        self.depth += 1
        if self.depth > MAX_DEPTH:
            _refuse(
                f"nested more than {MAX_DEPTH} levels deep",
                self.peek_event().start_mark,
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _construct_mapping(loader, node):
    data = LineDict()
    yield data
    data.update(loader.construct_mapping(node, deep=True))
    data.line = node.start_mark.line + 1
    for key, _value in node.value:  # keys are hashable, or construct_mapping raised
        data.lines[loader.construct_object(key, deep=True)] = key.start_mark.line + 1


def _construct_sequence(loader, node):
    data = LineList()
    yield data
    data.extend(loader.construct_sequence(node, deep=True))
    data.line = node.start_mark.line + 1
    data.lines = {i: item.start_mark.line + 1 for i, item in enumerate(node.value)}


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def read_yaml(*, path, error):
    """Read a YAML file."""
    try:
        path = Path(path)
        size = path.stat().st_size  # a missing file: "cannot be read: No such ..."
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise error(f"is {kind}; give a YAML file")
        if size > MAX_BYTES:
            raise error(
                f"is {size} bytes, more than the {MAX_BYTES} a YAML file of "
                "cotainr-lumi may have"
            )
        with path.open("rb") as f:
            text = f.read(MAX_BYTES + 1).decode("utf-8")
    except OSError as e:
        raise error(f"cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise error(f"is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    return read_yaml_text(text=text, error=error)


def read_yaml_text(*, text, error):
    """Read YAML text (e.g. the value of an option), with the same bounds."""
    if len(text) > MAX_BYTES:
        raise error(f"is longer than {MAX_BYTES} characters")
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"is not valid YAML{where}: {problem}") from None
    except RecursionError:  # pragma: no cover - MAX_DEPTH stops it first
        raise error(f"is nested too deeply (more than {MAX_DEPTH} levels)") from None


def line_of(*, data, path):
    """The line of the value at `path` in data read by :func:`read_yaml`."""
    line = getattr(data, "line", None)
    for part in path:
        lines = getattr(data, "lines", {})
        if not isinstance(part, Hashable) or part not in lines:
            break
        line = lines[part]
        data = data[part]
    return line
