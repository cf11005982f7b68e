"""Triggers: which instants are slots of a schedule.

A cron trigger matches its fields against local wall-clock times in the schedule's zone and turns
each matching wall time into instants under explicit DST rules:

- a wall time the autumn transition repeats is fired at its first occurrence, its last, or both;
  or, under `auto` (the default for new schedules, and cron(8)'s behaviour), in both passes for
  a cron whose minute or hour field (or seconds, with six fields) starts with `*`, which follows
  elapsed time, and in the first pass for a cron naming a fixed time of day;
- a wall time the spring transition skips is shifted forward by the length of the gap (02:30 in
  Europe/Berlin becomes 03:30 CEST: the instant the clock would have shown 02:30 had it not
  jumped), fired at the transition itself (03:00 CEST, as cron(8) runs what the jump skipped),
  or skipped. A moved slot that lands on an instant another wall time already names (hourly
  crons: 02:00 shifted is 03:00) is one slot, fired once.

An interval trigger measures elapsed time from its anchor and ignores wall clocks. A one-shot
trigger has a single slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from engine.domain.cron import CronSpec, parse_cron
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import SECOND_MS, format_duration, iso_utc, to_ms, zone
from engine.domain.values import JsonValue
from engine.domain.wallclock import Resolved, SlotNote, first_slot_after, transition_in


class RepeatedHour(StrEnum):
    """What to do with a wall time that occurs twice (autumn transition)."""

    AUTO = "auto"  # both passes for a wildcard-time cron, else the first (cron(8))
    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class MissingHour(StrEnum):
    """What to do with a wall time that does not occur (spring transition)."""

    SHIFT = "shift"  # by the length of the gap
    TRANSITION = "transition"  # to the instant the clock jumped (cron(8))
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Slot:
    """One slot of a trigger: its instant and, for cron, the wall time that named it."""

    at_ms: int
    note: SlotNote = SlotNote.NONE
    wall: datetime | None = None


class Trigger(Protocol):
    """Yields a schedule's slots. Pure: no clock, no I/O."""

    @property
    def kind(self) -> str:
        """The name it is registered under ('cron', 'interval', 'once', ...)."""
        ...

    def slot_after(self, after_ms: int, tz: str) -> Slot | None:
        """The first slot strictly after `after_ms`, or None when there is none."""
        ...

    def to_spec(self) -> dict[str, JsonValue]:
        """A JSON-able description from which its registered loader rebuilds the trigger."""
        ...

    def describe(self) -> str:
        """A short human description."""
        ...


def next_after(trigger: Trigger, after_ms: int, tz: str) -> int | None:
    """The instant of the first slot strictly after `after_ms`."""
    slot = trigger.slot_after(after_ms, tz)
    return None if slot is None else slot.at_ms


@dataclass(frozen=True, slots=True)
class CronTrigger:
    """A cron expression evaluated in the schedule's zone under explicit DST rules."""

    expression: str
    repeated: RepeatedHour = RepeatedHour.AUTO
    missing: MissingHour = MissingHour.SHIFT
    kind: str = field(default="cron", init=False)

    def __post_init__(self) -> None:
        spec = parse_cron(self.expression)
        object.__setattr__(self, "expression", spec.expression)

    @property
    def spec(self) -> CronSpec:
        return parse_cron(self.expression)

    def slot_after(self, after_ms: int, tz: str) -> Slot | None:
        local = zone(tz)
        found = first_slot_after(
            after_ms,
            local,
            self.spec.next_wall,
            lambda wall: self._resolve(wall, local),
            shift_gaps=self.missing is not MissingHour.SKIP,
        )
        if found is None:
            return None
        at_ms, wall, resolved = found
        return Slot(at_ms, resolved.note, wall)

    def _resolve(self, wall: datetime, local: ZoneInfo) -> list[Resolved]:
        first = wall.replace(tzinfo=local, fold=0)
        second = wall.replace(tzinfo=local, fold=1)
        if first.utcoffset() == second.utcoffset():
            return [Resolved(to_ms(first))]
        first_ms, second_ms = to_ms(first), to_ms(second)
        exists = datetime.fromtimestamp(first_ms / 1000, local).replace(tzinfo=None) == wall
        if exists:  # the wall time occurs twice; fold 0 is the earlier pass
            repeated = self.repeated_rule
            if repeated is RepeatedHour.FIRST:
                return [Resolved(first_ms, SlotNote.REPEATED_FIRST)]
            if repeated is RepeatedHour.LAST:
                return [Resolved(second_ms, SlotNote.REPEATED_SECOND)]
            return [
                Resolved(first_ms, SlotNote.REPEATED_FIRST),
                Resolved(second_ms, SlotNote.REPEATED_SECOND),
            ]
        if self.missing is MissingHour.SKIP:
            return []
        if self.missing is MissingHour.TRANSITION:
            # fold 1 reads the wall time with the offset after the gap, fold 0 with the one
            # before: the jump lies between the two readings.
            jumped = transition_in(second_ms, first_ms, local)
            return [Resolved(first_ms if jumped is None else jumped, SlotNote.TRANSITION)]
        # fold 0 reads a skipped wall time with the offset in force before the gap.
        return [Resolved(first_ms, SlotNote.SHIFTED)]

    @property
    def repeated_rule(self) -> RepeatedHour:
        """The rule in force for repeated wall times: `auto` resolved for this cron."""
        if self.repeated is not RepeatedHour.AUTO:
            return self.repeated
        return RepeatedHour.BOTH if self.spec.wildcard_time else RepeatedHour.FIRST

    def dst_rules(self) -> str:
        """The DST rules in words, `auto` resolved: what `schedule show` and the console say."""
        if self.repeated is RepeatedHour.AUTO:
            why = "wildcard time" if self.spec.wildcard_time else "fixed time"
            repeated = f"auto ({self.repeated_rule.value}: {why})"
        else:
            repeated = self.repeated.value
        return f"repeated hour {repeated}, skipped hour {self.missing.value}"

    def to_spec(self) -> dict[str, JsonValue]:
        return {
            "cron": self.expression,
            "dst_repeated": self.repeated.value,
            "dst_missing": self.missing.value,
        }

    def describe(self) -> str:
        return f"cron {self.expression}"


@dataclass(frozen=True, slots=True)
class IntervalTrigger:
    """Slots at `anchor + k * every` for k >= 0: elapsed time, whatever the wall clock does."""

    every_ms: int
    anchor_ms: int
    kind: str = field(default="interval", init=False)
    # False: the operator gave no start, and `anchor_ms` is "one period from now" as computed
    # when asked. A four-eyes request binds to the change as written, so it leaves the anchor
    # out and fixes it in the request (else each retry would be a new change). Not stored.
    anchored: bool = field(default=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.every_ms < SECOND_MS:
            raise InvalidInput(
                f"interval {format_duration(self.every_ms) if self.every_ms > 0 else self.every_ms}"
                " is too short: an interval must be at least 1s"
            )
        if self.every_ms % SECOND_MS:
            raise InvalidInput("an interval must be a whole number of seconds (e.g. 90s, 2m)")

    def slot_after(self, after_ms: int, tz: str) -> Slot | None:
        if after_ms < self.anchor_ms:
            return Slot(self.anchor_ms)
        steps = (after_ms - self.anchor_ms) // self.every_ms + 1
        return Slot(self.anchor_ms + steps * self.every_ms)

    def to_spec(self) -> dict[str, JsonValue]:
        return {"every_ms": self.every_ms, "anchor_ms": self.anchor_ms}

    def describe(self) -> str:
        return f"every {format_duration(self.every_ms)}"


@dataclass(frozen=True, slots=True)
class OneShotTrigger:
    """A single slot at one instant."""

    at_ms: int
    kind: str = field(default="once", init=False)

    def slot_after(self, after_ms: int, tz: str) -> Slot | None:
        return Slot(self.at_ms) if self.at_ms > after_ms else None

    def to_spec(self) -> dict[str, JsonValue]:
        return {"at_ms": self.at_ms}

    def describe(self) -> str:
        return f"once at {iso_utc(self.at_ms)}"


# -- the registry: kind -> how to rebuild a trigger of that kind --------------------------------
# Storage keeps the kind as data (no CHECK list), the wire and audit entries spell a trigger as
# `trigger_to_json`: a new trigger type is one module whose class has `kind`, `slot_after`,
# `to_spec` and `describe`, plus one `register_trigger` call.

TriggerLoader = Callable[[Mapping[str, JsonValue]], Trigger]
_LOADERS: dict[str, TriggerLoader] = {}


def register_trigger(kind: str, loader: TriggerLoader) -> None:
    """Make `kind` a trigger kind: `loader(spec)` rebuilds one from its `to_spec()`. Raises
    ValueError for a kind already registered to another loader (two modules claiming one
    name would silently swap each other's stored schedules)."""
    if not kind or not kind.isidentifier():
        raise ValueError(f"trigger kind {kind!r} must be a word (letters, digits, '_')")
    known = _LOADERS.get(kind)
    if known is not None and known is not loader:
        raise ValueError(f"trigger kind {kind!r} is already registered")
    _LOADERS[kind] = loader


def trigger_kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_LOADERS)


def trigger_from_spec(kind: str, spec: Mapping[str, Any]) -> Trigger:
    """Rebuild a trigger from its kind and `to_spec()`; InvalidInput for an unknown kind or a
    spec its loader cannot read."""
    loader = _LOADERS.get(kind)
    if loader is None:
        raise InvalidInput(
            f"unknown trigger kind {kind!r}: one of {', '.join(_LOADERS)} (a trigger type "
            "from a plug-in must be registered in every process that reads it)"
        )
    try:
        return loader(spec)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"a {kind} trigger that cannot be read ({exc!r})") from None


def trigger_to_json(trigger: Trigger) -> dict[str, JsonValue]:
    """The one JSON spelling of a trigger: its kind and its spec, side by side (and, for an
    interval given no start, `anchored: false`: a four-eyes request leaves its anchor open)."""
    spelled: dict[str, JsonValue] = {"kind": trigger.kind, **trigger.to_spec()}
    if isinstance(trigger, IntervalTrigger) and not trigger.anchored:
        spelled["anchored"] = False
    return spelled


def trigger_from_json(value: Mapping[str, Any]) -> Trigger:
    """The inverse of `trigger_to_json`."""
    kind = value.get("kind")
    if not isinstance(kind, str):
        raise InvalidInput("a trigger needs its 'kind'")
    return trigger_from_spec(kind, {k: v for k, v in value.items() if k != "kind"})


def _only(spec: Mapping[str, JsonValue], kind: str, *keys: str) -> None:
    unknown = sorted(set(spec) - set(keys))
    if unknown:  # dst_repeated on an interval would be silently dropped
        raise InvalidInput(
            f"a {kind} trigger has no {unknown[0]!r}: its fields are {', '.join(keys)}"
        )


def _cron(spec: Mapping[str, JsonValue]) -> Trigger:
    _only(spec, "cron", "cron", "dst_repeated", "dst_missing")
    return CronTrigger(
        _text(spec["cron"]),
        RepeatedHour(_text(spec["dst_repeated"])),
        MissingHour(_text(spec["dst_missing"])),
    )


def _interval(spec: Mapping[str, JsonValue]) -> Trigger:
    _only(spec, "interval", "every_ms", "anchor_ms", "anchored")
    anchored = spec.get("anchored", True) is not False
    return IntervalTrigger(_whole(spec["every_ms"]), _whole(spec["anchor_ms"]), anchored=anchored)


def _once(spec: Mapping[str, JsonValue]) -> Trigger:
    _only(spec, "once", "at_ms")
    return OneShotTrigger(_whole(spec["at_ms"]))


def _text(value: JsonValue) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not a whole number of milliseconds")
    return value


register_trigger("cron", _cron)
register_trigger("interval", _interval)
register_trigger("once", _once)


__all__ = [
    "CronTrigger",
    "IntervalTrigger",
    "MissingHour",
    "OneShotTrigger",
    "RepeatedHour",
    "Slot",
    "SlotNote",
    "Trigger",
    "next_after",
    "register_trigger",
    "trigger_from_json",
    "trigger_from_spec",
    "trigger_kinds",
    "trigger_to_json",
]
