"""Domain values on the control socket: frozen dataclasses to JSON and back, by their types.

The server answers reads with the same values the service returns (schedules, runs, fires,
approvals, audit entries, the console's pages); the client rebuilds them, so a command reads
them through the socket exactly as it would from a local service. One codec, driven by the
dataclasses' own type hints, instead of a hand-written pair per type: a field added to a
domain type travels without another change here. Anything that does not fit the type is a
ProtocolError, never a half-built value.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

from engine.control.wire import ProtocolError
from engine.domain.errors import InvalidInput
from engine.domain.triggers import Trigger, trigger_from_json, trigger_to_json
from engine.domain.values import JsonValue

T = TypeVar("T")


def to_wire(value: Any) -> Any:
    """`value` as JSON-ready data (dataclasses as objects of their constructor's fields)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "to_spec") and hasattr(value, "kind"):  # a Trigger
        return trigger_to_json(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in _fields(type(value))}
    if isinstance(value, Mapping):
        return {str(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(to_wire(v) for v in value)
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    raise TypeError(f"{type(value).__name__} does not travel on the control socket")


def from_wire(kind: type[T], value: Any) -> T:
    """The `kind` that `to_wire` made `value` from; ProtocolError if it does not fit."""
    try:
        return typing.cast("T", _loader(typing.cast("Any", kind))(value))
    except _Misfit as exc:
        raise ProtocolError(f"{kind.__name__}{exc.where}: {exc.why}") from None
    except InvalidInput as exc:  # a value the domain type itself refuses
        raise ProtocolError(f"the server sent a {kind.__name__} that is not valid: {exc}") from None


class _Misfit(Exception):
    """A value that does not fit its type; `where` grows as it leaves nested loaders, so the
    path is built only when something is wrong."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        self.where = ""

    def at(self, step: str) -> _Misfit:
        self.where = step + self.where
        return self


Loader = typing.Callable[[Any], Any]


@cache
def _loader(kind: Any) -> Loader:
    """How to load a value of `kind`, worked out once per type: a page of a hundred
    schedules is thousands of values, and reading the type hints for each was most of the
    client's time."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any or kind is JsonValue:
        return _same
    if origin in (typing.Union, types.UnionType):
        chosen_all = [a for a in args if a is not type(None)]
        if len(chosen_all) > 1:
            # JSON itself (engine.domain.values.JsonValue: a payload): it came as JSON and
            # travels on as it is.
            return _json
        (chosen,) = chosen_all
        inner = _loader(chosen)
        if type(None) not in args:
            return inner
        return lambda value: None if value is None else inner(value)
    if kind is type(None):
        return _checked(lambda v: v is None, "null")
    if kind is bool:
        return _checked(lambda v: isinstance(v, bool), "true or false")
    if kind is int:
        return _checked(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
    if kind is float:
        number = _checked(
            lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"
        )
        return lambda value: float(number(value))
    if kind is str:
        return _checked(lambda v: isinstance(v, str), "text")
    if kind is Trigger:
        return _trigger
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum(kind)
    generic = isinstance(origin, type) and dataclasses.is_dataclass(origin)
    if generic or (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        target = origin if generic else kind
        return _dataclass(target, _bound(origin, args) if generic else _hints(kind))
    if origin in (dict, Mapping, typing.Mapping) or kind in (dict, Mapping):
        return _mapping(_loader(args[1] if len(args) == 2 else Any))
    if origin in (list, tuple, frozenset):
        return _sequence(origin, _loader(args[0] if args else Any))
    raise TypeError(f"{kind!r} does not travel on the control socket")


def _same(value: Any) -> Any:
    return value


def _json(value: Any) -> Any:
    if value is not None and not isinstance(value, str | int | float | bool | list | dict):
        raise _Misfit(f"{value!r} is not JSON")
    return value


def _checked(fits: typing.Callable[[Any], bool], what: str) -> Loader:
    def load(value: Any) -> Any:
        if not fits(value):
            raise _Misfit(f"{value!r} is not {what}")
        return value

    return load


def _trigger(value: Any) -> Trigger:
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise _Misfit("not a trigger")
    try:
        return trigger_from_json(value)
    except InvalidInput as exc:
        raise _Misfit(f"not a trigger ({exc})") from None


def _enum(kind: type[enum.Enum]) -> Loader:
    def load(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise _Misfit(f"{value!r} is not a {kind.__name__}") from None

    return load


def _dataclass(kind: type, hints: Mapping[str, Any]) -> Loader:
    fields = [(f.name, _loader(hints[f.name])) for f in _fields(kind)]

    def load(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _Misfit("not an object")
        given = {}
        for name, field_loader in fields:
            if name in value:
                try:
                    given[name] = field_loader(value[name])
                except _Misfit as exc:
                    raise exc.at(f".{name}") from None
        try:
            return kind(**given)
        except TypeError as exc:  # a required field missing
            raise _Misfit(str(exc)) from None

    return load


def _mapping(inner: Loader) -> Loader:
    def load(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _Misfit("not an object")
        loaded = {}
        for key, item in value.items():
            try:
                loaded[str(key)] = inner(item)
            except _Misfit as exc:
                raise exc.at(f"[{key}]") from None
        return loaded

    return load


def _sequence(origin: type, inner: Loader) -> Loader:
    def load(value: Any) -> Any:
        if not isinstance(value, list):
            raise _Misfit("not a list")
        items = []
        for index, item in enumerate(value):
            try:
                items.append(inner(item))
            except _Misfit as exc:
                raise exc.at(f"[{index}]") from None
        return origin(items)

    return load


@cache
def _fields(kind: type) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(f for f in dataclasses.fields(kind) if f.init)


@cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _bound(kind: type, args: tuple[Any, ...]) -> dict[str, Any]:
    """The field types of a generic dataclass (Page[T]) with its type variables bound."""
    bound = dict(zip(getattr(kind, "__parameters__", ()), args, strict=True))
    found = {}
    for name, hint in _hints(kind).items():
        params = getattr(hint, "__parameters__", ())
        found[name] = hint[tuple(bound[p] for p in params)] if params else bound.get(hint, hint)
    return found
