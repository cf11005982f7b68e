"""One control request as its handler sees it: who asked, what serves it, and its arguments,
each checked (type and bounds) with a message that says what is wrong."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.domain.audit import KeyRing
from engine.domain.errors import InvalidInput
from engine.governance.doctor import Report
from engine.ports.audit import AuditLog
from engine.ports.read_model import ReadModel
from engine.service import ScheduleService

Args = Mapping[str, Any]
TEXT_MAX = 1000  # characters in one text argument (names, tenants, ids, reasons, filters)


class ControlContext:
    """One request: the service, who asked (as the kernel says), the audit log and keys (for
    verification, which needs the key the operators cannot read), the console's read model
    narrowed to an operator (`read_model(actor)`) and the service's own doctor, when served."""

    def __init__(
        self,
        service: ScheduleService,
        actor: str,
        audit: AuditLog | None,
        keys: Callable[[], KeyRing] | None,
        read_model: Callable[[str], ReadModel] | None = None,
        doctor: Callable[[], Report] | None = None,
    ) -> None:
        self.service = service
        self.actor = actor
        self.audit = audit
        self.keys = keys
        self.read_model = read_model
        self.doctor = doctor


Handler = Callable[[ControlContext, Args], dict[str, Any]]


def text(args: Args, key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str):
        raise InvalidInput(f"the request's {key!r} must be text")
    return _short(key, value)


def maybe_text(args: Args, key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"the request's {key!r} must be text")
    return None if value is None else _short(key, value)


def _short(key: str, value: str) -> str:
    if len(value) > TEXT_MAX:
        raise InvalidInput(f"the request's {key!r} is longer than {TEXT_MAX} characters")
    return value


def maybe_int(args: Args, key: str) -> int | None:
    value = args.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidInput(f"the request's {key!r} must be an integer")
    return value


def bounded(args: Args, key: str, low: int, high: int, default: int) -> int:
    """An integer argument within [low, high] (`default` when not given)."""
    value = maybe_int(args, key)
    if value is None:
        return default
    if not low <= value <= high:
        raise InvalidInput(f"the request's {key!r} is {value}: use {low} to {high}")
    return value


def flag(args: Args, key: str) -> bool:
    value = args.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"the request's {key!r} must be true or false")
    return value


def names(args: Args, key: str, most: int = 1000) -> list[str] | None:
    """A list of text arguments (chain names, say), or None when not given."""
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"the request's {key!r} must be a list of names")
    if len(value) > most:
        raise InvalidInput(f"the request's {key!r} names more than {most}")
    return [_short(key, v) for v in value]
