"""Property tests of cron triggers against the brute-force oracle (tests/oracle/cron_oracle.py).

Random expressions over the whole grammar of /work/notes/cron-spec.md, in every zone with an
unusual transition since 1970 (tests/oracle/zones.py) and the ordinary zones of both
hemispheres, from instants 1970-2040 drawn mostly near a transition of the zone, under every
combination of the DST rules. For each, the engine's next fires must:

- be strictly increasing, and each after the instant asked about;
- equal the oracle's;
- each be a wall time the cron matches, at an allowed pass, or a documented DST result (a gap
  wall time shifted by the gap, or the transition instant), as its note says;
- have unique slot keys, each the local ISO time with offset of the instant.

And the daemon fires, over a DST transition, exactly the slots `preview` shows and
`slot_after` iterates (and the oracle computes).

Examples are derandomized (the same every run). `VORTOS_PROPERTY_EXAMPLES=N` raises the number
of examples per test for a longer run.
"""

from __future__ import annotations

import calendar
import functools
import os
from dataclasses import dataclass
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine.domain.errors import InvalidInput
from engine.domain.slots import slot_key
from engine.domain.triggers import CronTrigger, MissingHour, RepeatedHour, Slot, SlotNote
from tests.oracle import cron_oracle as oracle
from tests.oracle.zones import ALL_TEST_ZONES, UNUSUAL_ZONES, derive_unusual_zones, is_unusual

EXAMPLES = int(os.environ.get("VORTOS_PROPERTY_EXAMPLES", "0") or 0)
PROPERTY = settings(
    max_examples=EXAMPLES or 25,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no explain: it writes patch files
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# How many next fires each example compares, and how far ahead the oracle looks for them.
FIRES = 5
HORIZON_YEARS = 10
HORIZON_MS = HORIZON_YEARS * 366 * oracle.DAY * 1000
RULES = [(r, m) for r in oracle.REPEATED_RULES for m in oracle.MISSING_RULES]
START_YEAR, END_YEAR = 1970, 2040


# ---------------------------------------------------------------------------- strategies

MONTHS = {number: name for name, number in oracle.MONTH_NAMES.items()}
DAYS = {number: name for name, number in oracle.DAY_NAMES.items()}


def _cased(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.upper(), name.capitalize()])


@st.composite
def _value(draw: st.DrawFn, low: int, high: int, favourites: tuple[int, ...]) -> int:
    favoured = draw(st.booleans())
    if favourites and favoured:
        return draw(st.sampled_from(favourites))
    return draw(st.integers(low, high))


@st.composite
def _plain_item(
    draw: st.DrawFn, low: int, high: int, favourites: tuple[int, ...], names: dict[int, str]
) -> str:
    """One of N, N-M (N <= M, so also 9-9), */S, N-M/S, N/S; values sometimes by name."""

    def show(n: int) -> str:
        if n in names and draw(st.integers(0, 3)) == 0:
            return draw(_cased(names[n]))
        return str(n)

    n = draw(_value(low, high, favourites))
    kind = draw(st.sampled_from(["n", "n", "range", "range", "star-step", "range-step", "n-step"]))
    span = max(1, (high - low) // 3)
    if kind == "n":
        return show(n)
    if kind == "range":
        m = draw(st.integers(n, min(high, n + span)))
        return f"{show(n)}-{show(m)}"
    step = draw(st.integers(1, max(1, (high - low) // 2)))
    if kind == "star-step":
        return f"*/{step}"
    if kind == "range-step":
        m = draw(st.integers(n, min(high, n + 2 * span)))
        return f"{show(n)}-{show(m)}/{step}"
    return f"{n}/{step}"


def _plain_field(
    low: int, high: int, favourites: tuple[int, ...] = (), names: dict[int, str] | None = None
) -> st.SearchStrategy[str]:
    item = _plain_item(low, high, favourites, names or {})
    return st.one_of(
        item,
        item,
        st.lists(item, min_size=2, max_size=3).map(",".join),
        st.just("*"),
    )


def _dom_field() -> st.SearchStrategy[str]:
    special = st.one_of(
        st.just("L"),
        st.just("LW"),
        st.integers(1, 31).map(lambda n: f"{n}W"),
        _plain_item(1, 31, (1, 15, 28, 29, 30, 31), {}),
    )
    return st.one_of(
        st.just("*"),
        st.just("*"),
        st.just("?"),
        st.integers(1, 10).map(lambda s: f"*/{s}"),
        special,
        st.lists(special, min_size=2, max_size=3).map(",".join),
    )


def _dow_field() -> st.SearchStrategy[str]:
    names = st.sampled_from(sorted(DAYS.values())).flatmap(_cased)
    weekday = st.one_of(st.integers(0, 7).map(str), names)
    numeric = st.integers(0, 7).map(str)
    special = st.one_of(
        st.tuples(weekday, st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"),
        numeric.map(lambda d: f"{d}L"),
        numeric.map(lambda d: f"L{d}"),
        _plain_item(0, 7, (0, 1, 5, 6, 7), DAYS),
    )
    return st.one_of(
        st.just("*"),
        st.just("*"),
        st.just("?"),
        st.sampled_from(["*/2", "*/3", "0-6", "1-5", "mon-fri", "1-7"]),
        special,
        st.lists(special, min_size=2, max_size=3).map(",".join),
    )


def _month_field(kind: str) -> st.SearchStrategy[str]:
    return st.just("*") if kind == "*" else _plain_field(1, 12, (1, 3, 4, 10, 11, 12), MONTHS)


@st.composite
def expressions(draw: st.DrawFn, hours: tuple[int, ...] = (), minutes: tuple[int, ...] = ()) -> str:
    """A cron of the grammar: 5 fields, 6 with seconds first, or an alias. `hours` and
    `minutes` are favoured values (the wall times around a transition)."""
    if draw(st.integers(0, 19)) == 19:
        return draw(st.sampled_from(sorted(oracle.ALIASES)))
    fields = [
        draw(_plain_field(0, 59, (*minutes, 0, 1, 15, 30, 45, 59))),
        draw(_plain_field(0, 23, (*hours, 0, 1, 2, 3, 23))),
        draw(st.one_of(st.just("*"), st.just("*"), _dom_field())),
        draw(st.sampled_from(["*", "*", "*", "month"]).flatmap(_month_field)),
        draw(st.one_of(st.just("*"), st.just("*"), _dow_field())),
    ]
    if draw(st.integers(0, 3)) == 3:
        fields.insert(0, draw(_plain_field(0, 59, (0, 30, 59))))
    return " ".join(fields)


@dataclass(frozen=True)
class Case:
    expression: str
    zone: str
    after_ms: int

    def __str__(self) -> str:
        return f"{self.expression!r} in {self.zone} after {oracle.utc_iso(self.after_ms)}"


@functools.cache
def _transitions(zone: str) -> list[oracle.Transition]:
    """The zone's transitions in 1970-2040, roughly: offsets read once a day, a change bisected
    (for choosing instants only; the oracle reads them hour by hour)."""
    tz = oracle.zone_of(zone)
    out = []
    here = calendar.timegm((START_YEAR, 1, 1, 0, 0, 0))
    end = calendar.timegm((END_YEAR + 1, 1, 1, 0, 0, 0))
    while here < end:
        there = here + oracle.DAY
        if tz.offset(here) != tz.offset(there):
            low, high = here, there
            while high - low > 1:
                middle = (low + high) // 2
                if tz.offset(middle) == tz.offset(here):
                    low = middle
                else:
                    high = middle
            out.append(oracle.Transition(high, tz.offset(low), tz.offset(high)))
        here = there
    return out


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A zone; an instant in 1970-2040, mostly a few hours or days before one of the zone's
    transitions; a cron favouring the wall times on either side of that transition."""
    zone = draw(st.sampled_from(ALL_TEST_ZONES))
    year = draw(st.integers(START_YEAR, END_YEAR))
    transitions = _transitions(zone)
    hours: tuple[int, ...] = ()
    minutes: tuple[int, ...] = ()
    if transitions and draw(st.integers(0, 4)) > 0:
        unusual = [t for t in transitions if is_unusual(t)]
        prefer_unusual = draw(st.booleans())
        near = draw(st.sampled_from(unusual if unusual and prefer_unusual else transitions))
        walls = (near.at + near.before, near.at + near.after)
        hours = tuple(sorted({w % oracle.DAY // oracle.HOUR for w in walls}))
        minutes = tuple(sorted({w % oracle.HOUR // 60 for w in walls}))
        reach = draw(st.sampled_from([10 * 60, 4 * oracle.HOUR, 3 * oracle.DAY]))
        seconds = near.at + draw(st.integers(-reach, reach // 4))
    else:
        start = calendar.timegm((year, 1, 1, 0, 0, 0))
        seconds = start + draw(st.integers(0, 365 * oracle.DAY))
    millis = draw(st.sampled_from([0, 0, 0, 999, 1]))
    expression = draw(expressions(hours, minutes))
    return Case(expression, zone, seconds * 1000 + millis)


# ------------------------------------------------------------------------------- helpers


def trigger(expression: str, repeated: str, missing: str) -> CronTrigger:
    return CronTrigger(expression, repeated=RepeatedHour(repeated), missing=MissingHour(missing))


def engine_slots(case: Case, repeated: str, missing: str, count: int = FIRES) -> list[Slot]:
    try:
        cron = trigger(case.expression, repeated, missing)
    except InvalidInput as exc:
        pytest.fail(f"the engine refuses a cron of the grammar, {case}: {exc}")
    out: list[Slot] = []
    cursor = case.after_ms
    while len(out) < count:
        slot = cron.slot_after(cursor, case.zone)
        if slot is None:
            break
        out.append(slot)
        cursor = slot.at_ms
    return out


def explain(
    cron: oracle.OracleCron, zone: oracle.Zone, slot: Slot, repeated: str, missing: str
) -> list[str]:
    """Why the oracle's rules allow an instant as a slot: 'real' (a matching wall time at an
    allowed pass), 'shifted' (a matching gap wall time plus the gap), 'transition' (the
    transition instant of a gap holding a matching wall time). Empty: not a slot."""
    assert slot.at_ms % 1000 == 0, f"a slot at a fraction of a second: {slot}"
    at = slot.at_ms // 1000
    why = []
    wall = zone.wall(at)
    if cron.matches(wall) and at in oracle.slot_instants(cron, zone, wall, repeated, missing):
        why.append("real")
    for gap in zone.transitions(at - oracle.WIDEST_GAP, at + 1):
        if not gap.is_gap:
            continue
        gap_walls = [
            w
            for w in oracle.matching_walls(cron, gap.at + gap.before, gap.at + gap.after)
            if not oracle.passes(zone, w)
        ]
        if missing == oracle.SHIFT and at + gap.before in gap_walls:
            why.append("shifted")
        if missing == oracle.TRANSITION and at == gap.at and gap_walls:
            why.append("transition")
    return why


# ------------------------------------------------------------------------------- properties


@pytest.mark.parametrize(("repeated", "missing"), RULES)
@PROPERTY
@given(case=cases())
def test_next_fires_increase_are_explained_and_have_unique_keys(
    repeated: str, missing: str, case: Case
) -> None:
    slots = engine_slots(case, repeated, missing)
    instants_ms = [s.at_ms for s in slots]
    assert all(b > a for a, b in zip([case.after_ms, *instants_ms], instants_ms, strict=False)), (
        f"{case} {repeated}/{missing}: not strictly increasing: "
        f"{[oracle.local_iso(t, case.zone) for t in instants_ms]}"
    )
    cron = oracle.parse(case.expression)
    zone = oracle.zone_of(case.zone)
    for slot in slots:
        why = explain(cron, zone, slot, repeated, missing)
        where = f"{case} {repeated}/{missing}: {oracle.local_iso(slot.at_ms, case.zone)} {slot}"
        assert why, f"{where} is no slot of the cron under the rules"
        if slot.note is SlotNote.SHIFTED:
            assert "shifted" in why, f"{where}: noted shifted, but is {why}"
        elif slot.note.value == "DST gap: at the transition" or slot.note.name == "TRANSITION":
            assert "transition" in why, f"{where}: noted transition, but is {why}"
        else:
            assert "real" in why, f"{where}: noted {slot.note.name}, but is {why}"
            found = oracle.passes(zone, zone.wall(slot.at_ms // 1000))
            if slot.note is SlotNote.REPEATED_FIRST:
                assert len(found) == 2, where
                assert found[0] * 1000 == slot.at_ms, where
            if slot.note is SlotNote.REPEATED_SECOND:
                assert len(found) == 2, where
                assert found[1] * 1000 == slot.at_ms, where
        if slot.wall is not None:
            named = calendar.timegm(slot.wall.timetuple())
            assert cron.matches(named), f"{where}: its wall time is not one the cron names"
            assert slot.at_ms // 1000 in oracle.slot_instants(
                cron, zone, named, repeated, missing
            ), f"{where}: its wall time {slot.wall} does not give this instant"
    keys = [slot_key("s1", t, case.zone) for t in instants_ms]
    assert len(set(keys)) == len(keys), f"{case}: repeated slot keys {keys}"
    assert keys == [f"s1@{oracle.local_iso(t, case.zone)}" for t in instants_ms]


@pytest.mark.parametrize(("repeated", "missing"), RULES)
@PROPERTY
@given(case=cases())
def test_next_fires_equal_the_oracle(repeated: str, missing: str, case: Case) -> None:
    expected = oracle.oracle_slots(
        case.expression,
        case.zone,
        case.after_ms,
        repeated,
        missing,
        FIRES,
        horizon_years=HORIZON_YEARS,
    )
    got = [s.at_ms for s in engine_slots(case, repeated, missing, len(expected) + 1)]

    def show(xs: list[int]) -> list[str]:
        return [oracle.local_iso(t, case.zone) for t in xs]

    assert got[: len(expected)] == expected, (
        f"{case} {repeated}/{missing}: engine {show(got)} oracle {show(expected)}"
    )
    if len(expected) < FIRES and len(got) > len(expected):
        # The oracle found no further slot within its horizon: the engine's must be beyond it.
        last = expected[-1] if expected else case.after_ms
        assert got[len(expected)] >= (last // 1000) * 1000 + HORIZON_MS, (
            f"{case} {repeated}/{missing}: engine {show(got)}, oracle none after {show(expected)}"
        )


def test_the_frozen_zone_list_is_still_the_derived_one() -> None:
    if not os.environ.get("VORTOS_DERIVE_ZONES"):
        pytest.skip("reads every zone hour by hour for 71 years: set VORTOS_DERIVE_ZONES=1")
    assert tuple(derive_unusual_zones()) == UNUSUAL_ZONES


# ------------------------------------------------------------- the daemon against the preview


@dataclass(frozen=True)
class Window:
    expression: str
    zone: str
    start: str  # UTC, off any slot
    hours: int
    repeated: str
    missing: str


DAEMON_WINDOWS = [
    # Berlin spring 2026-03-29 02:00 +01 -> 03:00 +02, under each gap rule.
    Window("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:07Z", 96, "auto", "shift"),
    Window("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:07Z", 96, "auto", "skip"),
    Window("*/20 1-3 * * *", "Europe/Berlin", "2026-03-28T12:00:07Z", 24, "first", "transition"),
    # Berlin autumn 2026-10-25 03:00 +02 -> 02:00 +01, under each repeat rule.
    Window("0 * * * *", "Europe/Berlin", "2026-10-24T20:00:07Z", 10, "auto", "shift"),
    Window("30 2 * * *", "Europe/Berlin", "2026-10-23T20:00:07Z", 72, "auto", "shift"),
    Window("30 2 * * *", "Europe/Berlin", "2026-10-23T20:00:07Z", 72, "last", "shift"),
    Window("*/30 2 * * *", "Europe/Berlin", "2026-10-24T20:00:07Z", 10, "both", "skip"),
    # Lord Howe's 30-minute changes (2026-04-05 back, 2026-10-04 forward).
    Window("*/15 1-2 * * *", "Australia/Lord_Howe", "2026-04-04T10:00:07Z", 12, "auto", "shift"),
    Window("*/15 2 * * *", "Australia/Lord_Howe", "2026-10-03T10:00:07Z", 12, "first", "shift"),
    # Apia skips 2011-12-30 whole: under shift its 24 hours fire on the 31st.
    Window("0 * 30 12 *", "Pacific/Apia", "2011-12-29T00:00:07Z", 72, "auto", "shift"),
    # Casey's three-hour gap (2009-10-18 02:00 +08 -> 05:00 +11).
    Window("0 */2 * * *", "Antarctica/Casey", "2009-10-17T00:00:07Z", 36, "auto", "transition"),
]


@pytest.mark.parametrize("window", DAEMON_WINDOWS, ids=lambda w: f"{w.zone}:{w.expression}")
def test_the_daemon_fires_what_preview_shows(window: Window) -> None:
    from engine.domain.schedule import ScheduleSpec  # noqa: PLC0415 - the harness's own types
    from engine.domain.timeutil import parse_instant  # noqa: PLC0415
    from engine.testing import scheduler_harness  # noqa: PLC0415

    start = parse_instant(window.start)
    end = start + window.hours * oracle.HOUR * 1000
    expected = [
        t
        for t in oracle.oracle_slots(
            window.expression, window.zone, start, window.repeated, window.missing, 500
        )
        if t <= end
    ]
    assert expected, "a window with no slot tells nothing"
    cron = trigger(window.expression, window.repeated, window.missing)
    iterated = [
        s.at_ms
        for s in engine_slots(
            Case(window.expression, window.zone, start),
            window.repeated,
            window.missing,
            len(expected) + 1,
        )
    ]
    with scheduler_harness(start=window.start) as h:
        h.service.create(
            ScheduleSpec(name="w", trigger=cron, command="noop", timezone=window.zone),
            actor="test",
        )
        previewed = [p.at_ms for p in h.service.preview("w", count=len(expected) + 1)]
        h.advance(timedelta(milliseconds=end - start))
        fired = [int(d.timestamp() * 1000) for d in h.fires("w")]

    def show(xs: list[int]) -> list[str]:
        return [oracle.local_iso(t, window.zone) for t in xs]

    assert show(fired) == show(expected), "the daemon's fires are not the oracle's"
    assert show(previewed[: len(expected)]) == show(expected), "preview is not the oracle's"
    assert show([t for t in previewed if t <= end]) == show(fired)
    assert show([t for t in iterated if t <= end]) == show(fired)
