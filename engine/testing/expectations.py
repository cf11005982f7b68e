"""What the testing kit compares, and how it says what differed.

Pure functions over what the harness read from the store: no I/O, no clock. Instants are
compared as instants (the same moment written with two offsets is equal) and shown in the
schedule's zone with the UTC offset, so the two passes of a repeated DST hour read apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from engine.domain.errors import InvalidInput
from engine.domain.run import RunKind, RunState
from engine.domain.timeutil import iso_local, parse_duration, parse_instant, to_ms

# An instant as a test writes it: an ISO 8601 string or a datetime. Without an offset (a
# naive datetime, or a string without one) it is read as a wall time in the zone at hand.
Instant = str | datetime
# A length of time: `30s`, `1h30m`, `7d`, a number of seconds, or a timedelta.
Duration = str | int | timedelta

_ONE_MS = timedelta(milliseconds=1)
# Runs listed one by one in a message; a week of minutely runs would bury the point.
LISTED_RUNS = 10
LISTED_INSTANTS = 20


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run of the ledger, with the command and payload its fire carried.

    `state` is where the run ended up (or is: a retry waiting is `dispatched`); `attempts`
    counts the attempts made, so a run that failed once and then completed has 2; `error` is
    the last failed attempt's; `slot_at` is the slot instant, in UTC.
    """

    id: int
    schedule: str
    tenant: str
    kind: RunKind
    state: RunState
    command: str
    payload: dict[str, Any]
    slot_at: datetime
    attempts: int
    error: str | None = None
    output: str | None = None

    def describe(self) -> str:
        """One line for an assertion message."""
        error = f", error: {self.error}" if self.error else ""
        return (
            f"run {self.id} of {self.tenant}/{self.schedule} ({self.kind.value}, slot "
            f"{self.slot_at.isoformat()}): {self.state.value} after {self.attempts} "
            f"attempt(s), payload {self.payload!r}{error}"
        )


def instant_ms(value: Instant, tz: str = "UTC") -> int:
    """`value` as epoch milliseconds; a wall time without an offset is read in `tz` (one that
    a DST transition makes ambiguous or skips is refused, as everywhere in Vortos)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return parse_instant(value.isoformat(), tz)
        return to_ms(value)
    if isinstance(value, str):
        return parse_instant(value, tz)
    raise TypeError(
        f"an instant is an ISO 8601 string or a datetime, not {type(value).__name__}: "
        "e.g. '2026-01-05T02:00:00+01:00'"
    )


def duration_ms(value: Duration, *, what: str = "duration") -> int:
    """`value` as milliseconds: a duration string, a number of seconds, or a timedelta."""
    if isinstance(value, timedelta):
        ms = value // _ONE_MS
    elif isinstance(value, bool):  # an int to Python, never a duration to a reader
        raise TypeError(f"{what} {value!r} is not a duration: write e.g. '1h' or 3600")
    elif isinstance(value, int):
        if value < 0:
            raise InvalidInput(f"{what} {value} is negative: time only moves forward")
        ms = parse_duration(str(value), what=what)
    elif isinstance(value, str):
        ms = parse_duration(value, what=what)
    else:
        raise TypeError(
            f"{what} is a duration string ('7d'), a number of seconds or a timedelta, "
            f"not {type(value).__name__}"
        )
    if ms < 0:
        raise InvalidInput(f"{what} {value!r} is negative: time only moves forward")
    return ms


def fires_mismatch(
    label: str,
    tz: str,
    window: tuple[int, int],
    expected: Sequence[int],
    actual: Sequence[int],
) -> str | None:
    """None when `actual` holds the instants of `expected` (as a multiset: order aside, a
    repeated instant must repeat); else a message listing both, what is missing and what was
    not expected, in `tz`."""
    want, got = Counter(expected), Counter(actual)
    if want == got:
        return None
    missing = sorted((want - got).elements())
    unexpected = sorted((got - want).elements())
    start, end = window
    lines = [
        f"schedule {label} ({tz}) fired {len(actual)} time(s) between {_at(start, tz)} and "
        f"{_at(end, tz)}, expected {len(expected)}:",
    ]
    if missing:
        lines.append(f"  missing (expected, did not fire): {_list(missing, tz)}")
    if unexpected:
        lines.append(f"  unexpected (fired, not expected): {_list(unexpected, tz)}")
    lines.append(f"  expected: {_list(sorted(expected), tz)}")
    lines.append(f"  actual:   {_list(sorted(actual), tz)}")
    return "\n".join(lines)


def ran_once_mismatch(
    command: str,
    payload: Mapping[str, Any] | None,
    runs: Sequence[RunRecord],
    commands_run: Iterable[str],
) -> str | None:
    """None when exactly one of `runs` (the runs of `command`) completed with `payload`
    (None: any payload); else a message saying how many did, counting the command's runs by
    outcome and payload, and listing the first of them."""
    matching = [r for r in runs if completed_with(r, payload)]
    if len(matching) == 1:
        return None
    wanted = "" if payload is None else f" with payload {dict(payload)!r}"
    head = f"command {command!r} completed {len(matching)} time(s){wanted}, expected exactly once"
    if not runs:
        others = sorted(set(commands_run) - {command})
        ran = f"commands that ran: {', '.join(others)}" if others else "no command ran at all"
        return f"{head}: it never ran ({ran})"
    outcomes = Counter((r.state.value, _payload_text(r.payload)) for r in runs)
    lines = [f"{head}; its {len(runs)} run(s), by outcome and payload:"]
    lines.extend(f"  {n} {state} with {text}" for (state, text), n in outcomes.most_common())
    lines.append("the runs:")
    lines.extend(f"  {r.describe()}" for r in runs[:LISTED_RUNS])
    if len(runs) > LISTED_RUNS:
        lines.append(f"  ... and {len(runs) - LISTED_RUNS} more")
    return "\n".join(lines)


def _payload_text(payload: Mapping[str, Any]) -> str:
    return repr(dict(payload))


def completed_with(run: RunRecord, payload: Mapping[str, Any] | None) -> bool:
    """Whether `run` completed, with `payload` unless that is None."""
    return run.state is RunState.COMPLETED and (payload is None or run.payload == dict(payload))


def _at(ms: int, tz: str) -> str:
    return iso_local(ms, tz)


def _list(instants: Sequence[int], tz: str) -> str:
    if not instants:
        return "(none)"
    shown = ", ".join(_at(ms, tz) for ms in instants[:LISTED_INSTANTS])
    more = len(instants) - LISTED_INSTANTS
    return f"{shown}, ... and {more} more" if more > 0 else shown
