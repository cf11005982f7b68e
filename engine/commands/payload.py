"""A command's payload schema, read from its type-hinted parameters.

Payloads are JSON objects, so only JSON-shaped types are accepted: str, int, float, bool, None,
Any, list[T], dict[str, T], Literal[...] and unions of these. A schema is checked when a schedule
is created (so a bad payload never reaches a fire) and again before each run (the code may have
changed since).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.commands.context import FireContext
from engine.domain.errors import InvalidInput

_MISSING = inspect.Parameter.empty


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    annotation: Any  # a JSON-shaped type (see the module docstring)
    required: bool


@dataclass(frozen=True, slots=True)
class PayloadSchema:
    fields: tuple[Field, ...]
    extra_allowed: bool  # the command takes **kwargs
    context_parameter: str | None  # the parameter that receives the FireContext

    def validate(self, command: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        known = {f.name: f for f in self.fields}
        if not self.extra_allowed:
            unknown = sorted(set(payload) - set(known))
            if unknown:
                raise InvalidInput(
                    f"payload of command {command!r} has unknown field(s) {', '.join(unknown)}: "
                    f"it takes {_describe(self.fields)}"
                )
        missing = [f.name for f in self.fields if f.required and f.name not in payload]
        if missing:
            raise InvalidInput(
                f"payload of command {command!r} is missing required field(s) "
                f"{', '.join(missing)}: it takes {_describe(self.fields)}"
            )
        for name, value in payload.items():
            spec = known.get(name)
            if spec is not None and not conforms(value, spec.annotation):
                raise InvalidInput(
                    f"payload field {name!r} of command {command!r} must be "
                    f"{type_name(spec.annotation)}, not {_json_type(value)} ({value!r:.60})"
                )
        return dict(payload)

    def describe(self) -> str:
        return _describe(self.fields)


def schema_of(fn: Callable[..., Any]) -> PayloadSchema:
    """Read the payload schema from `fn`'s signature; refuse what a payload cannot carry."""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # noqa: BLE001 (any failure to resolve hints is the user's to fix)
        raise InvalidInput(f"cannot read the type hints of {where}: {exc}") from None
    fields: list[Field] = []
    extra = False
    context: str | None = None
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is FireContext:
            context = param.name
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise InvalidInput(
                f"{where}: parameter {param.name!r} cannot be given by name; a command's "
                "parameters must be nameable (the payload is a JSON object)"
            )
        _check_annotation(where, param.name, annotation)
        fields.append(Field(param.name, annotation, param.default is _MISSING))
    return PayloadSchema(tuple(fields), extra, context)


def _check_annotation(where: str, name: str, annotation: Any) -> None:
    if annotation in (str, int, float, bool, type(None), None, Any, list, dict):
        return
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        if all(isinstance(a, str | int | bool) or a is None for a in args):
            return
    elif origin is list:
        for arg in args:
            _check_annotation(where, name, arg)
        return
    elif origin is dict:
        if args and args[0] is not str:
            raise InvalidInput(f"{where}: parameter {name!r}: JSON object keys are always str")
        for arg in args[1:]:
            _check_annotation(where, name, arg)
        return
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            _check_annotation(where, name, arg)
        return
    raise InvalidInput(
        f"{where}: parameter {name!r} has type {annotation!r}, which a JSON payload cannot "
        "carry: use str, int, float, bool, None, list[...], dict[str, ...], Literal[...] or a "
        "union of these"
    )


def conforms(value: Any, annotation: Any) -> bool:
    if annotation is Any:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation is list:
        return isinstance(value, list)
    if annotation is dict:
        return isinstance(value, dict)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is list:
        return isinstance(value, list) and (not args or all(conforms(v, args[0]) for v in value))
    if origin is dict:
        return isinstance(value, dict) and (
            len(args) < 2 or all(conforms(v, args[1]) for v in value.values())
        )
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    return False


def type_name(annotation: Any) -> str:
    if annotation is Any:
        return "any JSON value"
    if annotation is None or annotation is type(None):
        return "null"
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return {
            "str": "a string",
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "list": "a list",
            "dict": "an object",
        }.get(annotation.__name__, annotation.__name__)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is list:
        return f"a list (each item {type_name(args[0])})" if args else "a list"
    if origin is dict:
        return f"an object (each value {type_name(args[1])})" if len(args) == 2 else "an object"
    return " or ".join(type_name(a) for a in args)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _describe(fields: tuple[Field, ...]) -> str:
    if not fields:
        return "no fields"
    return ", ".join(
        f"{f.name}: {type_name(f.annotation)}{'' if f.required else ' (optional)'}" for f in fields
    )
