"""`@schedulable` marks a function as a command; `@scheduled` declares a static schedule for it.

    @scheduled(cron="0 3 * * *", timezone="Europe/Berlin", payload={"region": "eu"})
    @schedulable("billing.send-invoices")
    def send_invoices(region: str, dry_run: bool = False, *, fire: FireContext) -> None: ...

Both leave the function as it is (it can still be called directly) and attach what they
declare; `load_app` collects it from the app module. Mistakes (a bad name, a parameter a JSON
payload cannot carry, a payload that does not fit) are raised at import time, as InvalidInput.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from engine.commands.registry import Command, command_from
from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.schedule import (
    DEFAULT_TENANT,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    ScheduleSpec,
)
from engine.domain.timeutil import parse_duration, zone
from engine.domain.triggers import CronTrigger, IntervalTrigger, Trigger

F = TypeVar("F", bound=Callable[..., Any])

COMMAND_ATTR = "__vortos_command__"
SCHEDULES_ATTR = "__vortos_schedules__"
# Metadata key naming where a static schedule is declared.
SOURCE_KEY = "vortos.source"


@dataclass(frozen=True, slots=True)
class StaticSchedule:
    """A schedule declared in code; synced into the store at start."""

    spec: ScheduleSpec
    source: str  # module.function, for operators


@overload
def schedulable(fn: F, /) -> F: ...


@overload
def schedulable(name: str | None = None, /, *, description: str = "") -> Callable[[F], F]: ...


def schedulable(
    fn: F | str | None = None, /, *, name: str | None = None, description: str = ""
) -> F | Callable[[F], F]:
    """Mark a callable as a command, named `name` (default: the function's name, with '_'
    as '-'). Its type-hinted parameters are the payload's fields; a parameter annotated
    FireContext receives the fire's identity instead."""

    def mark(target: F, command_name: str | None) -> F:
        chosen = command_name or target.__name__.replace("_", "-").lower()
        setattr(target, COMMAND_ATTR, command_from(chosen, target, description))
        return target

    if callable(fn):
        return mark(fn, name)
    return lambda target: mark(target, fn or name)


def command_of(fn: Any) -> Command | None:
    found = getattr(fn, COMMAND_ATTR, None)
    return found if isinstance(found, Command) else None


def scheduled(
    cron: str | None = None,
    *,
    every: str | int | None = None,
    name: str | None = None,
    timezone: str = "UTC",
    payload: Mapping[str, Any] | None = None,
    tenant: str = DEFAULT_TENANT,
    misfire: str = MisfireKind.LATEST.value,
    overlap: str = OverlapPolicy.SKIP.value,
    jitter: str | None = None,
    max_attempts: int | None = None,
    retry_backoff: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Declare a static schedule of the command below it: `cron` (5 fields, or 6 with seconds
    first) or `every` (a duration such as '5m', slots aligned to the Unix epoch). It is created
    or updated at start (`vortos run --app`), and at runtime can only be paused and resumed."""
    if (cron is None) == (every is None):
        raise InvalidInput("@scheduled needs exactly one of cron=... or every=...")
    trigger: Trigger
    if cron is not None:
        trigger = CronTrigger(cron)
    else:
        every_ms = parse_duration(str(every), what="every")
        trigger = IntervalTrigger(every_ms, 0)
    zone(timezone)
    policy = RetryPolicy()
    retry = RetryPolicy(
        max_attempts=policy.max_attempts if max_attempts is None else max_attempts,
        backoff_ms=policy.backoff_ms
        if retry_backoff is None
        else parse_duration(retry_backoff, what="retry backoff"),
        backoff_cap_ms=policy.backoff_cap_ms,
    )

    def declare(target: F) -> F:
        command = command_of(target) or command_of(schedulable(target))
        assert command is not None
        checked = command.validate(payload or {})
        source = command.source
        spec = ScheduleSpec(
            name=name or command.name,
            trigger=trigger,
            command=command.name,
            payload=checked,
            timezone=timezone,
            tenant=tenant,
            misfire=MisfirePolicy(kind=MisfireKind(misfire)),
            overlap=OverlapPolicy(overlap),
            jitter_ms=0 if jitter is None else parse_duration(jitter, what="jitter"),
            metadata={**(metadata or {}), SOURCE_KEY: source},
            retry=retry,
        )
        declared: list[StaticSchedule] = list(getattr(target, SCHEDULES_ATTR, []))
        if any(s.spec.name == spec.name and s.spec.tenant == tenant for s in declared):
            raise InvalidInput(
                f"{source} declares two static schedules named {spec.name!r}: pass name=..."
            )
        declared.append(StaticSchedule(spec, source))
        setattr(target, SCHEDULES_ATTR, declared)
        return target

    return declare


def schedules_of(fn: Any) -> list[StaticSchedule]:
    found = getattr(fn, SCHEDULES_ATTR, [])
    return [s for s in found if isinstance(s, StaticSchedule)]
