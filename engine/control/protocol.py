"""The control socket's change verbs, each declared once.

A verb is a ScheduleService method an operator may call through the socket: its name on the
wire is the method's name, its request is the method's parameters (less `actor`: the server
asks the kernel who is on the other end) and its result the method's return value, both read
from the method's own type hints, and the operation it is authorised as. The server's handlers
(`handler`) and the client's calls (`RemoteService`) are derived from this table, so a verb
is written once: in the service.

Every public ScheduleService method is a verb here, a read the client serves in its own way
(paged, through reads.py), or local only (`LOCAL_ONLY`, with the reason): a test keeps the
three in step with the service, and the client raises NotRemote for anything local only.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from engine.control.codec import from_wire, to_wire
from engine.control.request import TEXT_MAX, Args, ControlContext, Handler
from engine.control.wire import ProtocolError
from engine.domain.access import Operation
from engine.domain.errors import InvalidInput, VortosError
from engine.domain.schedule import ScheduleSpec
from engine.service import ScheduleService

NO_DEFAULT = inspect.Parameter.empty


class NotRemote(VortosError):
    """A service call that the control socket does not carry: made through the socket it
    would run in this process, against no database, instead of as the service account."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class Verb:
    """A change an operator may ask for through the socket."""

    name: str  # the ScheduleService method, and the op on the wire
    operation: Operation  # what the service authorises it as
    local: tuple[str, ...] = ()  # parameters only an in-process caller may give

    def method(self) -> Callable[..., Any]:
        return typing.cast("Callable[..., Any]", getattr(ScheduleService, self.name))

    def params(self) -> tuple[Param, ...]:
        return _params(self)

    def result(self) -> Any:
        return _hints(self.name)["return"]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    hint: Any
    default: Any


VERBS: dict[str, Verb] = {
    verb.name: verb
    for verb in (
        Verb("create", Operation.CREATE),
        Verb("update", Operation.UPDATE),
        Verb("patch", Operation.UPDATE),
        Verb("pause", Operation.PAUSE),
        Verb("resume", Operation.RESUME),
        Verb("delete", Operation.DELETE),
        Verb("clear_override", Operation.PAUSE),
        Verb("trigger", Operation.TRIGGER),
        Verb("backfill", Operation.BACKFILL),
        Verb("requeue", Operation.REQUEUE),
        Verb("purge", Operation.REQUEUE),
        Verb("approve", Operation.APPROVE),
        Verb("reject", Operation.APPROVE),
        Verb("grant_role", Operation.MANAGE_OPERATORS),
        Verb("revoke_role", Operation.MANAGE_OPERATORS),
        Verb("set_retention", Operation.MANAGE_RETENTION),
        Verb("remove_retention", Operation.MANAGE_RETENTION),
        Verb("prune", Operation.MANAGE_RETENTION, local=("settings", "wait")),
    )
}

# Service methods the socket does not carry, and why (what a caller of the socket does instead).
LOCAL_ONLY: dict[str, str] = {
    "sync_static": "static schedules are synced by the service itself, from its --app at start",
    "scope": "the server narrows every read to what your account may view",
    "listing_scope": "the server narrows every read to what your account may view",
    "protection": "the server decides what needs a second operator's approval",
    "audit_chains_to_verify": "verification runs on the server (audit_verification)",
}


@cache
def _hints(name: str) -> dict[str, Any]:
    return typing.get_type_hints(getattr(ScheduleService, name))


@cache
def _params(verb: Verb) -> tuple[Param, ...]:
    hints = _hints(verb.name)
    signature = inspect.signature(verb.method())
    return tuple(
        Param(p.name, hints[p.name], p.default)
        for p in signature.parameters.values()
        if p.name not in ("self", "actor") and p.name not in verb.local
    )


# -- the server's side --------------------------------------------------------------------------


def handler(verb: Verb) -> Handler:
    """The server's handler of `verb`: each argument read as its parameter's type, the
    service called as the account on the other end, the result sent as `value`."""

    def handle(c: ControlContext, a: Args) -> dict[str, Any]:
        call = getattr(c.service, verb.name)
        return {"value": to_wire(call(**request_args(verb, a), actor=c.actor))}

    return handle


def request_args(verb: Verb, args: Args) -> dict[str, Any]:
    """The keyword arguments a request gives `verb`, each checked against its parameter's
    type; InvalidInput names what is wrong (an unknown, a missing or a malformed one)."""
    params = {p.name: p for p in verb.params()}
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise InvalidInput(
            f"the request's {unknown[0]!r} is not an argument of {verb.name}: it takes "
            f"{', '.join(params) or 'none'}"
        )
    found: dict[str, Any] = {}
    for name, param in params.items():
        if name in args:
            found[name] = load_arg(name, param.hint, args[name])
        elif param.default is NO_DEFAULT:
            raise InvalidInput(f"the request needs {name!r}")
    return found


_SIMPLE: dict[Any, tuple[Callable[[Any], bool], str]] = {
    str: (lambda v: isinstance(v, str), "text"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
}


def load_arg(name: str, hint: Any, value: Any) -> Any:
    """One argument as its parameter's type."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
    if hint in _SIMPLE:
        fits, what = _SIMPLE[hint]
        if not fits(value):
            raise InvalidInput(f"the request's {name!r} must be {what}")
        if isinstance(value, str) and len(value) > TEXT_MAX:
            raise InvalidInput(f"the request's {name!r} is longer than {TEXT_MAX} characters")
        return value
    if hint is ScheduleSpec:
        if not isinstance(value, Mapping):
            raise InvalidInput(f"the request's {name!r} must be a schedule definition")
        return ScheduleSpec.from_json(value)
    if typing.get_origin(hint) is Sequence:
        return _list(name, typing.get_args(hint)[0], value)
    fields = getattr(hint, "__dataclass_fields__", None)
    if fields is not None and isinstance(value, Mapping):
        unknown = sorted(set(value) - set(fields))
        if unknown:  # a typo would otherwise be a change that silently changes nothing
            raise InvalidInput(
                f"the request's {name!r} has no field {unknown[0]!r}: its fields are "
                f"{', '.join(sorted(fields))}"
            )
    try:
        return from_wire(hint, value)
    except ProtocolError as exc:
        raise InvalidInput(f"the request's {name!r} is malformed: {exc}") from None


def _list(name: str, item: Any, value: Any) -> list[Any]:
    fits, what = _SIMPLE[item]
    if not isinstance(value, list) or not all(fits(v) for v in value):
        plural = {"an integer": "integers", "text": "texts", "true or false": "flags"}[what]
        raise InvalidInput(f"the request's {name!r} must be a list of {plural}")
    return value


# -- the client's side --------------------------------------------------------------------------


def request_of(verb: Verb, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The request's arguments for a call `method(*args, **kwargs)` of `verb` (its `actor`
    dropped: the server knows who asks). A local-only parameter given is refused."""
    bound = inspect.signature(verb.method()).bind_partial(None, *args, **kwargs)
    given = dict(bound.arguments)
    given.pop("self", None)
    given.pop("actor", None)
    for name in verb.local:
        if given.pop(name, None) is not None:
            raise NotRemote(
                f"{verb.name}(..., {name}=...) cannot go through the control socket: the "
                "server uses its own"
            )
    return {name: to_wire(value) for name, value in given.items()}


def result_of(verb: Verb, answer: Mapping[str, Any]) -> Any:
    """The value the server sent back for `verb`, as the service's own return type."""
    return from_wire(verb.result(), answer.get("value"))


def not_remote(name: str) -> NotRemote:
    return NotRemote(
        f"{name} is not available through the control socket ({LOCAL_ONLY[name]}); "
        "as the service account, unset VORTOS_CONTROL_SOCKET to open the database itself"
    )


__all__ = [
    "LOCAL_ONLY",
    "VERBS",
    "NotRemote",
    "Verb",
    "handler",
    "not_remote",
    "request_args",
    "request_of",
    "result_of",
]
