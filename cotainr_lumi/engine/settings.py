"""
Settings: declared once, read by one loader.

A settings section is a frozen :class:`StageSettings` dataclass with one
:func:`setting` field per setting (key: the field name with ``-`` for ``_``;
type: the annotation; ``check`` adds a rule, ``load`` replaces the conversion).
:func:`load_sections` reads what one source gives (a profile, ``--set``, the
Python API) into typed values of only the keys given, so that sources merge;
:meth:`StageSettings.complete` fills in the defaults. The first problem is one
error, worded by the source's :class:`cotainr_lumi.engine.origins.Origin`.
"""

from collections.abc import Mapping
import contextlib
import copy
import dataclasses
from dataclasses import dataclass
import difflib
import functools
from pathlib import Path
from typing import Any, Callable, Optional, Union, get_args, get_origin, get_type_hints

_NONE = type(None)

#: How messages name values of a scalar type: (one, many).
_WORDS = {
    bool: ("true or false", "true or false values"),
    str: ("a string", "strings"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    Any: ("a value", "values"),
}


class SettingError(ValueError):
    """A value that does not fit its declaration (`path`: where, below the value)."""

    def __init__(self, message, *, path=()):
        super().__init__(message)
        self.message = message
        self.path = tuple(path)

    def under(self, *parts):
        """The same error, `parts` further up the path."""
        return SettingError(self.message, path=(*parts, *self.path))


def _under(path, function, *args, **kwargs):
    """Call `function`; a ValueError it raises becomes a SettingError under `path`."""
    try:
        return function(*args, **kwargs)
    except SettingError as e:
        raise e.under(*path) from None
    except ValueError as e:
        raise SettingError(str(e), path=path) from None


def setting(default, *, doc, check=None, load=None):
    """Declare one setting (a dataclass field)."""
    metadata = {"doc": doc, "check": check, "load": load}
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=functools.partial(copy.deepcopy, default),
            metadata=metadata,
        )
    return dataclasses.field(default=default, metadata=metadata)


def each(check):
    """A check of every item of a list."""

    def check_items(values):
        for i, value in enumerate(values):
            _under((i,), check, value)

    return check_items


@dataclass(frozen=True)
class Declared:
    """One declared setting."""

    key: str
    name: str
    type: Any
    default: Any
    doc: str = ""
    check: Optional[Callable] = None
    load: Optional[Callable] = None

    def read(self, value, *, origin):
        """The typed value of what a source gives."""
        if self.load is not None:
            value = self.load(value, origin=origin)
        else:
            value = convert(type_=self.type, value=value)
        if self.check is not None and value is not None:
            _under((), self.check, value)
        return value


def _plain(value):
    """`value` as JSON-serialisable data (objects with ``to_dict`` too)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass(frozen=True)
class StageSettings:
    """Base class of a settings section: frozen, its fields made with :func:`setting`."""

    @classmethod
    @functools.cache
    def declared(cls):
        """The declared settings, by key."""
        hints = get_type_hints(cls)
        specs = {}
        for f in dataclasses.fields(cls):
            key = f.name.replace("_", "-")
            default = f.default
            if default is dataclasses.MISSING:
                default = f.default_factory()
            specs[key] = Declared(
                key=key, name=f.name, type=hints[f.name], default=default, **f.metadata
            )
        return specs

    @classmethod
    def complete(cls, partial=None):
        """The settings with the defaults filled in."""
        return cls(**{k.replace("-", "_"): v for k, v in (partial or {}).items()})

    def to_dict(self):
        """The settings as users write them (keys with ``-``, plain data)."""
        return {
            spec.key: _plain(getattr(self, spec.name))
            for spec in self.declared().values()
        }


@dataclass(frozen=True)
class NoSettings(StageSettings):
    """The declaration of a stage without settings."""


def _union_words(args, many):
    text = " or ".join(_words(a, many=many) for a in args if a is not _NONE)
    return text + (" or null" if _NONE in args else "")


def _words(type_, *, many=False):
    """How messages name values of `type_`."""
    args = get_args(type_)
    origin = get_origin(type_)
    if origin is Union:
        return _union_words(args, many)
    if origin is list:
        return ("lists of " if many else "a list of ") + _words(args[0], many=True)
    if origin is dict:
        return (
            "mappings"
            if many
            else f"a mapping of names to {_words(args[1], many=True)}"
        )
    if type_ in _WORDS:
        return _WORDS[type_][many]
    name = getattr(type_, "__name__", str(type_))
    return f"{name} values" if many else f"a {name}"


#: What a value of a type (or generic type's origin) may be, where not itself.
_KINDS = {float: (int, float), list: (list, tuple), dict: Mapping}


def _fits(type_, value):
    kind = get_origin(type_) or type_
    if isinstance(value, bool) and kind in (int, float):
        return False  # a bool is an int to Python, not to users
    return isinstance(value, _KINDS.get(kind, kind))


def _mismatch(type_, value):
    return SettingError(f"must be {_words(type_)} (got {value!r})")


def _key(type_, key):
    """A mapping's key, checked against its declared type."""
    if not _fits(type_, key):
        raise SettingError(f"{key!r} is not {_words(type_)}", path=(key,))
    return key


def _convert_union(type_, args, value):
    for arg in args:
        with contextlib.suppress(SettingError):
            return convert(type_=arg, value=value)
    raise _mismatch(type_, value)


def convert(*, type_, value):
    """A value as a declared type (lists and mappings copied)."""
    args = get_args(type_)
    origin = get_origin(type_)
    if type_ is Any or (value is None and _NONE in args):
        return value
    if origin is Union:
        return _convert_union(type_, args, value)
    if not _fits(type_, value):
        raise _mismatch(type_, value)
    if origin is list:
        return [
            _under((i,), convert, type_=args[0], value=v) for i, v in enumerate(value)
        ]
    if origin is dict:
        return {
            _key(args[0], k): _under((k,), convert, type_=args[1], value=v)
            for k, v in value.items()
        }
    return value


def unknown_message(name, known, what):
    """The message for an unknown key or stage, with the closest known one."""
    text = f"unknown {what} (known: {', '.join(known)})"
    close = difflib.get_close_matches(str(name), known, n=1)
    return text + (f"; did you mean '{close[0]}'?" if close else "")


def read_declared(*, schema, raw, origin, unknown="setting"):
    """Typed values of a mapping of declared keys."""
    if not isinstance(raw, Mapping):
        raise SettingError(f"must be a mapping of {unknown}s to values (got {raw!r})")
    declared = schema.declared()
    values = {}
    for key, value in raw.items():
        if key not in declared:
            raise SettingError(
                unknown_message(key, list(declared), unknown), path=(key,)
            )
        values[key] = _under((key,), declared[key].read, value, origin=origin)
    return values


def load_settings(*, schema, raw, origin, stage):
    """Read the settings one source gives for one stage."""
    if raw is None:
        return {}
    try:
        return read_declared(schema=schema, raw=raw, origin=origin)
    except SettingError as e:
        raise origin.error(path=(stage, *e.path), message=e.message) from None


def load_sections(*, sections, raw, origin):
    """Read the settings tree one source gives: section name -> settings."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise origin.error(
            path=(),
            message="must map stage names to their settings, e.g. "
            f"{{'prune': {{'strict': True}}}} (got {raw!r})",
        )
    loaded = {}
    for name, values in raw.items():
        if name not in sections:
            raise origin.error(
                path=(name,), message=unknown_message(name, sorted(sections), "stage")
            )
        loaded[name] = load_settings(
            schema=sections[name], raw=values, origin=origin, stage=name
        )
    return loaded
