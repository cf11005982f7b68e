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
from engine.domain.triggers import Trigger, trigger_from_spec

T = TypeVar("T")


def to_wire(value: Any) -> Any:
    """`value` as JSON-ready data (dataclasses as objects of their constructor's fields)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "to_spec") and hasattr(value, "kind"):  # a Trigger
        return {"kind": value.kind, **value.to_spec()}
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
        return typing.cast("T", _load(kind, value, kind.__name__))
    except InvalidInput as exc:  # a value the domain type itself refuses
        raise ProtocolError(f"the server sent a {kind.__name__} that is not valid: {exc}") from None


def _load(kind: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (chosen,) = [a for a in args if a is not type(None)]
        return _load(chosen, value, where)
    if kind is type(None):
        return _expect(value is None, value, where, "null")
    if kind is bool:
        return _expect(isinstance(value, bool), value, where, "true or false")
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return _expect(ok, value, where, "an integer")
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(_expect(ok, value, where, "a number"))
    if kind is str:
        return _expect(isinstance(value, str), value, where, "text")
    if kind is Trigger:
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            raise ProtocolError(f"{where}: not a trigger")
        spec = {k: v for k, v in value.items() if k != "kind"}
        try:
            return trigger_from_spec(value["kind"], spec)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{where}: not a trigger ({exc})") from None
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            raise ProtocolError(f"{where}: {value!r} is not a {kind.__name__}") from None
    generic = isinstance(origin, type) and dataclasses.is_dataclass(origin)
    if generic or (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: not an object")
        hints = _hints(kind) if not generic else _bound(origin, args)
        kind = origin if generic else kind
        given = {
            f.name: _load(hints[f.name], value[f.name], f"{where}.{f.name}")
            for f in _fields(kind)
            if f.name in value
        }
        try:
            return kind(**given)
        except TypeError as exc:  # a required field missing
            raise ProtocolError(f"{where}: {exc}") from None
    if origin in (dict, Mapping, typing.Mapping) or kind in (dict, Mapping):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: not an object")
        inner = args[1] if len(args) == 2 else Any
        return {str(k): _load(inner, v, f"{where}[{k}]") for k, v in value.items()}
    if origin in (list, tuple, frozenset):
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: not a list")
        inner = args[0] if args else Any
        items = [_load(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return origin(items)
    raise TypeError(f"{where}: {kind!r} does not travel on the control socket")


def _expect(ok: bool, value: Any, where: str, what: str) -> Any:
    if not ok:
        raise ProtocolError(f"{where}: {value!r} is not {what}")
    return value


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
