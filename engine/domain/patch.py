"""An edit of a schedule: only what is given changes.

`SchedulePatch` holds each thing an operator may change on its own (the CLI's `schedule edit`
options, the control socket's `patch`, Python's `ScheduleService.patch`); `apply_patch` turns it
and the current definition into the new definition. The rules live here once, so every front
end gives the same answer: a new cron keeps the DST rules it is not given, a new interval of
the same period and no start keeps its slots where they are, a catch-up cap needs misfire
`each`, a metadata key given no value is removed.

Messages name the parameters as keywords (`catch_up_cap=`, `every_ms=`), not a front end's
spelling of them; the CLI translates them to its flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, TypeVar

from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.schedule import (
    DEFAULT_TENANT,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    ScheduleSpec,
)
from engine.domain.timeutil import SECOND_MS
from engine.domain.triggers import (
    CronTrigger,
    IntervalTrigger,
    MissingHour,
    OneShotTrigger,
    RepeatedHour,
    Trigger,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SchedulePatch:
    """What to change; None leaves a field as it is. At most one new trigger (`cron`,
    `every_ms` or `at_ms`); `dst_repeated`/`dst_missing` alone change a cron's DST rules;
    `start_ms` is the first slot of a new interval. A `metadata` value of None removes
    its key; `timeout_ms=0` removes the schedule's time limit (the command's applies)."""

    command: str | None = None
    cron: str | None = None
    every_ms: int | None = None
    start_ms: int | None = None
    at_ms: int | None = None
    dst_repeated: RepeatedHour | None = None
    dst_missing: MissingHour | None = None
    payload: Mapping[str, Any] | None = None
    timezone: str | None = None
    misfire: MisfireKind | None = None
    catch_up_cap: int | None = None
    max_age_ms: int | None = None
    grace_ms: int | None = None
    overlap: OverlapPolicy | None = None
    jitter_ms: int | None = None
    sensitive: bool | None = None
    metadata: Mapping[str, str | None] | None = None
    max_attempts: int | None = None
    backoff_ms: int | None = None
    backoff_cap_ms: int | None = None
    timeout_ms: int | None = None  # 0 removes the schedule's own time limit

    def __post_init__(self) -> None:
        # Python callers may pass anything: each field is refused by name when it is not
        # what it says (a True stored as max_attempts printed "True attempt(s)"), and an
        # enum's text ("each") is taken as the enum.
        for name, want in _KINDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(want, type) and issubclass(want, Enum):
                object.__setattr__(self, name, _member(name, want, value))
            elif not _fits(value, want):
                raise InvalidInput(
                    f"{name}= must be {_WHAT[want]}, not {type(value).__name__} {value!r}"
                )
        if self.metadata is not None and not all(
            isinstance(k, str) and (v is None or isinstance(v, str))
            for k, v in self.metadata.items()
        ):
            raise InvalidInput("metadata= must map text keys to text (None removes a key)")

    def given(self) -> list[str]:
        """The names of the fields this patch sets."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


_KINDS: dict[str, Any] = {
    "command": str,
    "cron": str,
    "every_ms": int,
    "start_ms": int,
    "at_ms": int,
    "dst_repeated": RepeatedHour,
    "dst_missing": MissingHour,
    "payload": Mapping,
    "timezone": str,
    "misfire": MisfireKind,
    "catch_up_cap": int,
    "max_age_ms": int,
    "grace_ms": int,
    "overlap": OverlapPolicy,
    "jitter_ms": int,
    "sensitive": bool,
    "metadata": Mapping,
    "max_attempts": int,
    "backoff_ms": int,
    "backoff_cap_ms": int,
    "timeout_ms": int,
}
_WHAT: dict[Any, str] = {
    str: "text",
    int: "a whole number",
    bool: "True or False",
    Mapping: "a mapping",
}


def _fits(value: object, want: Any) -> bool:
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def _member(name: str, kind: type[Enum], value: object) -> Enum:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise InvalidInput(f"{name}= is {value!r}: one of {allowed}") from None


def new_trigger(
    *,
    cron: str | None = None,
    every_ms: int | None = None,
    start_ms: int | None = None,
    at_ms: int | None = None,
    repeated: RepeatedHour | None = None,
    missing: MissingHour | None = None,
    now_ms: int,
) -> Trigger:
    """The trigger of exactly one of `cron`, `every_ms` or `at_ms`. An interval without
    `start_ms` has its first slot one period from now, on a whole second (its anchor left
    open in a four-eyes request: see IntervalTrigger.anchored)."""
    chosen = [
        name
        for name, value in (("cron=", cron), ("every_ms=", every_ms), ("at_ms=", at_ms))
        if value is not None
    ]
    if len(chosen) != 1:
        raise InvalidInput(
            "give exactly one trigger: cron=, every_ms= or at_ms="
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    if (repeated or missing) and cron is None:
        raise InvalidInput("dst_repeated= and dst_missing= apply only to a cron trigger (cron=)")
    if start_ms is not None and every_ms is None:
        raise InvalidInput("start_ms= applies only to an interval trigger (every_ms=)")
    if cron is not None:
        return CronTrigger(cron, repeated or RepeatedHour.AUTO, missing or MissingHour.SHIFT)
    if every_ms is not None:
        if every_ms <= 0:
            raise InvalidInput(
                f"an interval of {every_ms} ms is not positive: every_ms= must be at least 1s"
            )
        if start_ms is not None:
            return IntervalTrigger(every_ms, start_ms)
        first = (now_ms // SECOND_MS) * SECOND_MS + every_ms
        return IntervalTrigger(every_ms, first, anchored=False)
    assert at_ms is not None
    return OneShotTrigger(at_ms)


def apply_patch(current: ScheduleSpec, patch: SchedulePatch, now_ms: int) -> ScheduleSpec:
    """`current` with what `patch` gives changed, and nothing else. Raises InvalidInput for
    a patch that contradicts itself or the schedule (the caller validates the result as it
    would a new definition)."""
    misfire = _misfire(current.misfire, patch)
    return replace(
        current,
        trigger=_trigger(current.trigger, patch, now_ms),
        command=_given(patch.command, current.command),
        payload=current.payload if patch.payload is None else dict(patch.payload),
        timezone=_given(patch.timezone, current.timezone),
        misfire=misfire,
        overlap=_given(patch.overlap, current.overlap),
        jitter_ms=_given(patch.jitter_ms, current.jitter_ms),
        sensitive=_given(patch.sensitive, current.sensitive),
        metadata=_metadata(current.metadata, patch.metadata),
        retry=RetryPolicy(
            max_attempts=_given(patch.max_attempts, current.retry.max_attempts),
            backoff_ms=_given(patch.backoff_ms, current.retry.backoff_ms),
            backoff_cap_ms=_given(patch.backoff_cap_ms, current.retry.backoff_cap_ms),
        ),
        timeout_ms=(
            current.timeout_ms
            if patch.timeout_ms is None
            else (patch.timeout_ms if patch.timeout_ms != 0 else None)
        ),
    )


def _given(value: T | None, current: T) -> T:
    return current if value is None else value


def _trigger(current: Trigger, patch: SchedulePatch, now_ms: int) -> Trigger:
    if any(v is not None for v in (patch.cron, patch.every_ms, patch.at_ms)):
        was = current if isinstance(current, CronTrigger) else None
        keeps = was is not None and patch.cron is not None  # a new cron keeps its DST rules
        made = new_trigger(
            cron=patch.cron,
            every_ms=patch.every_ms,
            start_ms=patch.start_ms,
            at_ms=patch.at_ms,
            repeated=patch.dst_repeated or (was.repeated if keeps and was else None),
            missing=patch.dst_missing or (was.missing if keeps and was else None),
            now_ms=now_ms,
        )
        same_period = (
            isinstance(made, IntervalTrigger)
            and isinstance(current, IntervalTrigger)
            and made.every_ms == current.every_ms
        )
        # The same interval again, with no new start: its slots stay where they are.
        return current if same_period and patch.start_ms is None else made
    if patch.start_ms is not None:
        raise InvalidInput("start_ms= applies only with a new interval (every_ms=)")
    if patch.dst_repeated or patch.dst_missing:
        if not isinstance(current, CronTrigger):
            raise InvalidInput(
                "dst_repeated= and dst_missing= apply only to cron schedules (cron=)"
            )
        return CronTrigger(
            current.expression,
            patch.dst_repeated or current.repeated,
            patch.dst_missing or current.missing,
        )
    return current


def _misfire(current: MisfirePolicy, patch: SchedulePatch) -> MisfirePolicy:
    kind = _given(patch.misfire, current.kind)
    if patch.catch_up_cap is not None and kind is not MisfireKind.EACH:
        raise InvalidInput(
            "catch_up_cap= applies only to misfire each (the schedule's is "
            f"{kind.value}): give misfire=each with it"
        )
    return MisfirePolicy(
        kind,
        _given(patch.catch_up_cap, current.catch_up_cap),
        _given(patch.max_age_ms, current.max_age_ms),
        _given(patch.grace_ms, current.grace_ms),
    )


def _metadata(
    current: Mapping[str, str], changes: Mapping[str, str | None] | None
) -> Mapping[str, str]:
    if not changes:
        return current
    merged = dict(current)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def new_spec(
    name: str,
    command: str,
    given: SchedulePatch,
    *,
    tenant: str = DEFAULT_TENANT,
    now_ms: int,
) -> ScheduleSpec:
    """A new definition: ScheduleSpec's defaults with what `given` sets, under the rules of
    an edit (so `add` and `edit` refuse the same things the same way). `given` must name a
    trigger."""
    trigger = new_trigger(
        cron=given.cron,
        every_ms=given.every_ms,
        start_ms=given.start_ms,
        at_ms=given.at_ms,
        repeated=given.dst_repeated,
        missing=given.dst_missing,
        now_ms=now_ms,
    )
    rest = replace(
        given,
        cron=None,
        every_ms=None,
        start_ms=None,
        at_ms=None,
        dst_repeated=None,
        dst_missing=None,
    )
    return apply_patch(ScheduleSpec(name, trigger, command, tenant=tenant), rest, now_ms)
