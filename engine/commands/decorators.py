"""`@schedulable` marks a function as a command; `@scheduled` declares a static schedule for it.

    @scheduled(cron="0 3 * * *", timezone="Europe/Berlin", payload={"region": "eu"})
    @schedulable("billing.send-invoices")
    def send_invoices(region: str, dry_run: bool = False, *, fire: FireContext) -> None: ...

Both leave the function as it is (it can still be called directly) and attach what they
declare; `load_app` collects it from the app module. Mistakes (a bad name, a parameter a JSON
payload cannot carry, a payload that does not fit) are raised at import time, as InvalidInput.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar, overload

from engine.commands.registry import Command, command_from
from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.schedule import (
    DEFAULT_TENANT,
    TIMEOUT_MAX_MS,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    ScheduleSpec,
    validate_jitter,
    validate_metadata,
    validate_name,
    validate_timeout,
)
from engine.domain.timeutil import parse_duration, zone
from engine.domain.triggers import CronTrigger, IntervalTrigger, MissingHour, RepeatedHour, Trigger

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
    paused: bool = False  # declared paused: it fires once an operator resumes it
    # The code named the cron's DST rules. When it did not, a schedule already stored keeps
    # the rules it was stored with (the default for new ones changed to `auto`; a deploy must
    # not change how an existing schedule fires on the night the clocks change).
    dst_declared: bool = True


@overload
def schedulable(fn: F, /) -> F: ...


@overload
def schedulable(
    fn: str | None = None,
    /,
    *,
    name: str | None = None,
    description: str = "",
    sensitive: bool = False,
    timeout: str | float | None = None,
) -> Callable[[F], F]: ...


def schedulable(
    fn: F | str | None = None,
    /,
    *,
    name: str | None = None,
    description: str = "",
    sensitive: bool = False,
    timeout: str | float | None = None,
) -> F | Callable[[F], F]:
    """Mark a callable as a command, named `name` (default: the function's name, with '_'
    as '-'). Its type-hinted parameters are the payload's fields; a parameter annotated
    FireContext receives the fire's identity instead. Put it below any @scheduled.

    `sensitive=True`: every schedule that runs it, whatever its own flag, needs a second
    operator's approval to be created, edited, resumed, triggered, backfilled or deleted.

    `timeout` (a duration such as "30s", or seconds): how long one run may take; a schedule's
    own timeout overrides it. On expiry the run ends timed_out (a failed attempt, retried per
    the schedule's policy) and the command is asked to stop (`fire.cancelled`,
    `fire.check_cancelled()`, `fire.wait_cancelled()`; an async command is cancelled). A
    Python thread cannot be killed: a command that ignores the request keeps its worker
    thread busy until it returns, and is reported (log, metric, doctor)."""
    timeout_ms = _command_timeout(timeout)

    def mark(target: F, command_name: str | None) -> F:
        if command_name is not None and not command_name.strip():
            raise InvalidInput("@schedulable was given an empty name: give a name or none")
        chosen = command_name or target.__name__.strip("_").replace("_", "-").lower()
        command = command_from(
            chosen, target, description, sensitive=sensitive, timeout_ms=timeout_ms
        )
        earlier = command_of(target)
        setattr(target, COMMAND_ATTR, command)
        if earlier is not None and earlier.name != command.name:
            # @schedulable above @scheduled: the static schedules were declared under the
            # default name; point them at the name given here.
            setattr(
                target,
                SCHEDULES_ATTR,
                [_renamed(s, earlier.name, command) for s in schedules_of(target)],
            )
        return target

    if callable(fn):
        return mark(fn, name)
    return lambda target: mark(target, fn if fn is not None else name)


def _command_timeout(timeout: str | float | None, what: str = "@schedulable") -> int | None:
    """`timeout=` of @schedulable or @scheduled in ms: a duration such as '30s', or seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, bool):
        raise InvalidInput(f"{what}(timeout=) must be a duration such as '30s', or seconds")
    if isinstance(timeout, int | float):
        if not math.isfinite(timeout) or timeout <= 0:
            raise InvalidInput(
                f"{what}(timeout={timeout!r}) is out of range: use more than 0 and at most 7d"
            )
        return validate_timeout(max(1, round(timeout * 1000)), what=f"{what}(timeout=)")
    text = str(timeout)
    if text.strip().startswith("-"):
        raise InvalidInput(f"{what}(timeout={text!r}) is negative: use more than 0 and at most 7d")
    return validate_timeout(
        parse_duration(text, what=f"{what} timeout", longest_ms=TIMEOUT_MAX_MS),
        what=f"{what}(timeout=)",
    )


def _renamed(static: StaticSchedule, old: str, command: Command) -> StaticSchedule:
    spec = static.spec
    return StaticSchedule(
        replace(
            spec,
            command=command.name,
            name=command.name if spec.name == old else spec.name,
        ),
        static.source,
        static.paused,
        static.dst_declared,  # the rules the code left unnamed stay unnamed
    )


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
    retry_backoff_cap: str | None = None,
    metadata: Mapping[str, str] | None = None,
    paused: bool = False,
    dst_repeated: str | None = None,
    dst_missing: str | None = None,
    timeout: str | float | None = None,
) -> Callable[[F], F]:
    """Declare a static schedule of the command below it: `cron` (5 fields, or 6 with seconds
    first) or `every` (a duration such as '5m', slots aligned to the Unix epoch). It is created
    or updated at start (`vortos run --app`), and at runtime can only be paused and resumed:
    an operator's pause or resume is an override that outlives deploys until cleared. With
    `paused=True` the code declares it paused (it fires once an operator resumes it).
    `dst_repeated` (auto, first, last, both) and `dst_missing` (shift, transition, skip) are
    the cron's DST rules; unnamed, a new schedule gets auto and shift and a stored one keeps
    its own. `timeout` (a duration, or seconds): this schedule's time limit for each run,
    overriding the command's @schedulable(timeout=)."""
    trigger = _trigger(cron, every, dst_repeated, dst_missing)
    zone(timezone)
    validate_name(tenant, what="tenant")
    if name is not None:
        validate_name(name)
    policies = _policies(misfire, overlap)
    jitter_ms = validate_jitter(0 if jitter is None else parse_duration(jitter, what="jitter"))
    validate_metadata(metadata or {})
    return _Declaration(
        name=name,
        trigger=trigger,
        timezone=timezone,
        payload=payload,
        tenant=tenant,
        misfire=policies[0],
        overlap=policies[1],
        jitter_ms=jitter_ms,
        metadata=metadata,
        retry=_retry(max_attempts, retry_backoff, retry_backoff_cap),
        timeout_ms=_command_timeout(timeout, what="@scheduled"),
        paused=paused,
        dst_declared=dst_repeated is not None or dst_missing is not None,
    )


def _trigger(
    cron: str | None, every: str | int | None, dst_repeated: str | None, dst_missing: str | None
) -> Trigger:
    if (cron is None) == (every is None):
        raise InvalidInput("@scheduled needs exactly one of cron=... or every=...")
    if cron is not None:
        return CronTrigger(
            cron,
            _choice(RepeatedHour, dst_repeated, "dst_repeated", RepeatedHour.AUTO),
            _choice(MissingHour, dst_missing, "dst_missing", MissingHour.SHIFT),
        )
    if dst_repeated is not None or dst_missing is not None:
        raise InvalidInput("@scheduled: dst_repeated and dst_missing apply only to cron=...")
    return IntervalTrigger(parse_duration(str(every), what="every"), 0)


@dataclass(frozen=True, slots=True)
class _Declaration:
    """What one @scheduled declares, checked at import time (a mistake fails the import, not
    the first sync); applied to the function below it, whose command it needs."""

    name: str | None  # None: the command's name
    trigger: Trigger
    timezone: str
    payload: Mapping[str, Any] | None
    tenant: str
    misfire: MisfireKind
    overlap: OverlapPolicy
    jitter_ms: int
    metadata: Mapping[str, str] | None
    retry: RetryPolicy
    timeout_ms: int | None
    paused: bool
    dst_declared: bool  # the code named the cron's DST rules (see StaticSchedule)

    def __call__(self, target: F) -> F:
        command = command_of(target) or command_of(schedulable(target))
        assert command is not None
        checked = command.validate(self.payload or {})
        source = command.source
        spec = ScheduleSpec(
            name=self.name or command.name,
            trigger=self.trigger,
            command=command.name,
            payload=checked,
            timezone=self.timezone,
            tenant=self.tenant,
            misfire=MisfirePolicy(kind=self.misfire),
            overlap=self.overlap,
            jitter_ms=self.jitter_ms,
            metadata={**(self.metadata or {}), SOURCE_KEY: source},
            retry=self.retry,
            timeout_ms=self.timeout_ms,
        )
        declared: list[StaticSchedule] = list(getattr(target, SCHEDULES_ATTR, []))
        if any(s.spec.name == spec.name and s.spec.tenant == self.tenant for s in declared):
            raise InvalidInput(
                f"{source} declares two static schedules named {spec.name!r}: pass name=..."
            )
        declared.append(StaticSchedule(spec, source, self.paused, dst_declared=self.dst_declared))
        setattr(target, SCHEDULES_ATTR, declared)
        return target


_Rule = TypeVar("_Rule", RepeatedHour, MissingHour)


def _choice(rules: type[_Rule], value: str | None, what: str, default: _Rule) -> _Rule:
    if value is None:
        return default
    try:
        return rules(value)
    except ValueError:
        known = ", ".join(r.value for r in rules)
        raise InvalidInput(f"@scheduled: {what} {value!r} is unknown: use one of {known}") from None


def _policies(misfire: str, overlap: str) -> tuple[MisfireKind, OverlapPolicy]:
    try:
        kind = MisfireKind(misfire)
    except ValueError:
        known = ", ".join(k.value for k in MisfireKind)
        raise InvalidInput(f"misfire {misfire!r} is unknown: use one of {known}") from None
    try:
        policy = OverlapPolicy(overlap)
    except ValueError:
        known = ", ".join(p.value for p in OverlapPolicy)
        raise InvalidInput(f"overlap {overlap!r} is unknown: use one of {known}") from None
    return kind, policy


def _retry(max_attempts: int | None, backoff: str | None, cap: str | None) -> RetryPolicy:
    default = RetryPolicy()
    backoff_ms = (
        default.backoff_ms if backoff is None else parse_duration(backoff, what="retry backoff")
    )
    cap_ms = (
        max(default.backoff_cap_ms, backoff_ms)
        if cap is None
        else parse_duration(cap, what="retry backoff cap")
    )
    return RetryPolicy(
        max_attempts=default.max_attempts if max_attempts is None else max_attempts,
        backoff_ms=backoff_ms,
        backoff_cap_ms=cap_ms,
    )


def schedules_of(fn: Any) -> list[StaticSchedule]:
    found = getattr(fn, SCHEDULES_ATTR, [])
    return [s for s in found if isinstance(s, StaticSchedule)]
