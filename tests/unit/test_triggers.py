"""Interval and one-shot triggers, slot ordering across DST for cron triggers, stored specs.

The exact DST instants are in `test_dst_table.py`; here every rule is swept for the weaker
property that must hold everywhere: each slot is strictly after the one before (no duplicate
slot, never going backwards). slot_after costs some 30 us, so the year-long sweeps use crons with
a few slots a day at the hours where transitions happen, and the busier crons (every 7 minutes,
hourly, every 20 seconds) are swept in windows around every 2026 transition of each zone.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from engine.domain.cron import CronSpec
from engine.domain.errors import InvalidInput
from engine.domain.slots import slot_key
from engine.domain.timeutil import iso_local, parse_instant
from engine.domain.triggers import (
    CronTrigger,
    IntervalTrigger,
    MissingHour,
    OneShotTrigger,
    RepeatedHour,
    Slot,
    Trigger,
    next_after,
    trigger_from_spec,
)

ANCHOR = int(datetime(2026, 1, 5, 9, 0, tzinfo=UTC).timestamp() * 1000)
MINUTE = 60_000
HOUR = 60 * MINUTE
YEAR_START = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
YEAR_END = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000)

# Whole-hour, half-hour (Lord Howe: a 30-minute shift) and 45-minute (Chatham) offsets, both
# hemispheres.
DST_ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
]
RULES = [
    pytest.param(repeated, missing, id=f"{repeated.value}+{missing.value}")
    for repeated in RepeatedHour
    for missing in MissingHour
]


def _iso(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).isoformat()


def _slots(trigger: Trigger, after_ms: int, until_ms: int, zone: str) -> list[Slot]:
    found: list[Slot] = []
    cursor = after_ms
    while (slot := trigger.slot_after(cursor, zone)) is not None and slot.at_ms < until_ms:
        found.append(slot)
        cursor = slot.at_ms
    return found


def _transitions_2026(zone: str) -> list[int]:
    """The instants at which `zone` changes its UTC offset in 2026 (to the minute), via zoneinfo."""
    local = ZoneInfo(zone)
    found = []
    day = datetime(2026, 1, 1, tzinfo=UTC)
    while day.year == 2026:
        nxt = day + timedelta(days=1)
        if day.astimezone(local).utcoffset() != nxt.astimezone(local).utcoffset():
            lo, hi = day, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(local).utcoffset() == lo.astimezone(local).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(int(hi.timestamp() * 1000))
        day = nxt
    return found


def _assert_strictly_increasing(slots: list[Slot], after_ms: int, zone: str) -> None:
    previous = after_ms
    for slot in slots:
        assert slot.at_ms > previous, (_iso(previous, zone), _iso(slot.at_ms, zone))
        previous = slot.at_ms


# --------------------------------------------------------------------------- interval


def test_interval_first_slot_is_the_anchor() -> None:
    trigger = IntervalTrigger(every_ms=MINUTE, anchor_ms=ANCHOR)
    assert trigger.slot_after(ANCHOR - 1, "UTC") == Slot(ANCHOR)


def test_interval_has_no_slot_before_its_anchor() -> None:
    trigger = IntervalTrigger(every_ms=MINUTE, anchor_ms=ANCHOR)
    assert trigger.slot_after(ANCHOR - 30 * 24 * HOUR, "UTC") == Slot(ANCHOR)


def test_interval_slot_after_the_anchor_itself_is_one_period_later() -> None:
    trigger = IntervalTrigger(every_ms=MINUTE, anchor_ms=ANCHOR)
    assert next_after(trigger, ANCHOR, "UTC") == ANCHOR + MINUTE


def test_interval_slot_after_is_strictly_after_a_slot() -> None:
    trigger = IntervalTrigger(every_ms=MINUTE, anchor_ms=ANCHOR)
    assert next_after(trigger, ANCHOR + 5 * MINUTE, "UTC") == ANCHOR + 6 * MINUTE


def test_interval_slot_after_between_slots_is_the_next_multiple() -> None:
    trigger = IntervalTrigger(every_ms=90_000, anchor_ms=ANCHOR)
    assert next_after(trigger, ANCHOR + 90_000 * 1000 + 1, "UTC") == ANCHOR + 90_000 * 1001


def test_interval_slots_are_anchor_plus_whole_periods() -> None:
    trigger = IntervalTrigger(every_ms=7_000, anchor_ms=ANCHOR)
    slots = _slots(trigger, ANCHOR - 1, ANCHOR + 70_000, "UTC")
    assert [s.at_ms for s in slots] == [ANCHOR + k * 7_000 for k in range(10)]


def test_interval_counts_elapsed_time_across_a_dst_transition() -> None:
    anchor = int(datetime.fromisoformat("2026-10-25T01:00:00+02:00").timestamp() * 1000)
    trigger = IntervalTrigger(every_ms=HOUR, anchor_ms=anchor)
    slots = _slots(trigger, anchor - 1, anchor + 4 * HOUR, "Europe/Berlin")
    assert [slot_key("hourly", s.at_ms, "Europe/Berlin") for s in slots] == [
        "hourly@2026-10-25T01:00:00+02:00",
        "hourly@2026-10-25T02:00:00+02:00",
        "hourly@2026-10-25T02:00:00+01:00",
        "hourly@2026-10-25T03:00:00+01:00",
    ]


def test_interval_does_not_depend_on_the_zone() -> None:
    trigger = IntervalTrigger(every_ms=HOUR, anchor_ms=ANCHOR)
    assert {next_after(trigger, ANCHOR, zone) for zone in DST_ZONES} == {ANCHOR + HOUR}


def test_interval_of_exactly_one_second_is_accepted() -> None:
    assert next_after(IntervalTrigger(every_ms=1_000, anchor_ms=ANCHOR), ANCHOR, "UTC") == (
        ANCHOR + 1_000
    )


@pytest.mark.parametrize("every_ms", [0, -1_000, 1, 999])
def test_interval_shorter_than_a_second_is_rejected(every_ms: int) -> None:
    with pytest.raises(InvalidInput, match="at least 1s"):
        IntervalTrigger(every_ms=every_ms, anchor_ms=ANCHOR)


@pytest.mark.parametrize("every_ms", [1_500, 60_001, 90_250])
def test_interval_of_a_fraction_of_a_second_is_rejected(every_ms: int) -> None:
    with pytest.raises(InvalidInput, match="whole number of seconds"):
        IntervalTrigger(every_ms=every_ms, anchor_ms=ANCHOR)


# --------------------------------------------------------------------------- one-shot


def test_one_shot_slot_is_its_instant() -> None:
    assert OneShotTrigger(at_ms=ANCHOR).slot_after(ANCHOR - 1, "UTC") == Slot(ANCHOR)


def test_one_shot_has_no_slot_after_its_instant() -> None:
    trigger = OneShotTrigger(at_ms=ANCHOR)
    assert trigger.slot_after(ANCHOR, "UTC") is None
    assert next_after(trigger, ANCHOR + HOUR, "UTC") is None


def test_one_shot_is_found_from_long_before() -> None:
    assert next_after(OneShotTrigger(at_ms=ANCHOR), 0, "Europe/Berlin") == ANCHOR


# --------------------------------------------------------------------------- cron basics


def test_cron_slot_is_the_matching_wall_time_in_the_zone() -> None:
    after = int(datetime.fromisoformat("2026-01-05T00:00:00+01:00").timestamp() * 1000)
    slot = CronTrigger("30 9 * * *").slot_after(after, "Europe/Berlin")
    assert slot is not None
    assert _iso(slot.at_ms, "Europe/Berlin") == "2026-01-05T09:30:00+01:00"
    assert slot.wall == datetime(2026, 1, 5, 9, 30)


def test_cron_slot_after_is_strictly_after_a_slot() -> None:
    at = int(datetime.fromisoformat("2026-01-05T09:30:00+01:00").timestamp() * 1000)
    slot = CronTrigger("30 9 * * *").slot_after(at, "Europe/Berlin")
    assert slot is not None
    assert _iso(slot.at_ms, "Europe/Berlin") == "2026-01-06T09:30:00+01:00"


def test_cron_slot_after_rejects_an_unknown_zone() -> None:
    with pytest.raises(InvalidInput, match="unknown time zone"):
        CronTrigger("* * * * *").slot_after(ANCHOR, "Mars/Olympus_Mons")


def test_cron_trigger_defaults_to_auto_and_shift() -> None:
    trigger = CronTrigger("0 * * * *")
    assert (trigger.repeated, trigger.missing) == (RepeatedHour.AUTO, MissingHour.SHIFT)


@pytest.mark.parametrize(
    ("expression", "rule"),
    [
        ("0 * * * *", RepeatedHour.BOTH),  # the hour field is a wildcard: elapsed time
        ("0 */2 * * *", RepeatedHour.BOTH),
        ("* 2 * * *", RepeatedHour.BOTH),  # cron(8): a minute wildcard makes a wildcard job too
        ("*/10 * * * * *", RepeatedHour.BOTH),
        ("*/10 30 2 * * *", RepeatedHour.BOTH),  # six fields: the seconds field counts
        ("30 2 * * *", RepeatedHour.FIRST),  # a fixed time of day fires once
        ("0 30 2 * * *", RepeatedHour.FIRST),
        ("0 1-3 * * *", RepeatedHour.FIRST),  # a range is not a wildcard
        ("@hourly", RepeatedHour.BOTH),
        ("@daily", RepeatedHour.FIRST),
    ],
)
def test_auto_follows_elapsed_time_for_wildcard_crons_and_fires_fixed_ones_once(
    expression: str, rule: RepeatedHour
) -> None:
    assert CronTrigger(expression).repeated_rule is rule
    assert CronTrigger(expression, RepeatedHour.LAST).repeated_rule is RepeatedHour.LAST


def test_cron_trigger_normalises_its_expression() -> None:
    assert CronTrigger("  30   2 * * * ").expression == "30 2 * * *"


# --------------------------------------------------------------------------- ordering sweeps

# A spring-forward transition depends only on the missing-hour rule and a fall-back one only on
# the repeated-hour rule, so these three combinations put every rule through both transitions.
COVERING_RULES = [
    pytest.param(RepeatedHour.FIRST, MissingHour.SHIFT, id="first+shift"),
    pytest.param(RepeatedHour.LAST, MissingHour.SKIP, id="last+skip"),
    pytest.param(RepeatedHour.BOTH, MissingHour.SHIFT, id="both+shift"),
]


@pytest.mark.parametrize("zone", DST_ZONES)
def test_sweep_zone_has_two_transitions_in_2026(zone: str) -> None:
    assert len(_transitions_2026(zone)) == 2


@pytest.mark.parametrize("zone", DST_ZONES)
@pytest.mark.parametrize(("repeated", "missing"), COVERING_RULES)
def test_cron_slots_strictly_increase_over_a_whole_year(
    zone: str, repeated: RepeatedHour, missing: MissingHour
) -> None:
    # 01:00, 01:45, 02:00 and 02:45 every day: each 2026 transition of these zones skips or
    # repeats at least one of them (Lord Howe repeats 01:30-01:59; Chatham skips 02:45-03:44).
    slots = _slots(CronTrigger("0,45 1,2 * * *", repeated, missing), YEAR_START, YEAR_END, zone)
    assert len(slots) >= 364 * 4
    _assert_strictly_increasing(slots, YEAR_START, zone)


@pytest.mark.parametrize(
    ("cron", "reach_ms"),
    [
        pytest.param("0 * * * *", 24 * HOUR, id="hourly"),
        pytest.param("*/7 * * * *", 3 * HOUR, id="every-7-minutes"),
    ],
)
@pytest.mark.parametrize("zone", DST_ZONES)
@pytest.mark.parametrize(("repeated", "missing"), COVERING_RULES)
def test_cron_slots_strictly_increase_around_every_transition_of_the_year(
    cron: str, reach_ms: int, zone: str, repeated: RepeatedHour, missing: MissingHour
) -> None:
    trigger = CronTrigger(cron, repeated, missing)
    for transition in _transitions_2026(zone):
        after = transition - reach_ms
        slots = _slots(trigger, after, transition + reach_ms, zone)
        assert slots
        _assert_strictly_increasing(slots, after, zone)


@pytest.mark.parametrize("zone", ["Europe/Berlin", "Australia/Lord_Howe"])
@pytest.mark.parametrize(("repeated", "missing"), COVERING_RULES)
def test_seconds_cron_slots_strictly_increase_across_each_transition(
    zone: str, repeated: RepeatedHour, missing: MissingHour
) -> None:
    # A short window: near a transition each slot_after of a seconds cron costs milliseconds
    # (see test_slot_after_near_a_transition_examines_few_wall_times).
    trigger = CronTrigger("*/20 * * * * *", repeated, missing)
    for transition in _transitions_2026(zone):
        after = transition - MINUTE
        slots = _slots(trigger, after, transition + MINUTE, zone)
        assert slots
        _assert_strictly_increasing(slots, after, zone)


@pytest.mark.parametrize(
    "after",
    [
        pytest.param("2026-03-29T01:59:30+01:00", id="before-the-gap"),
        pytest.param("2026-03-29T03:10:00+02:00", id="after-the-gap"),
        pytest.param("2026-10-25T02:10:00+02:00", id="first-pass"),
        pytest.param("2026-10-25T02:10:00+01:00", id="second-pass"),
    ],
)
def test_slot_after_near_a_transition_examines_few_wall_times(
    monkeypatch: pytest.MonkeyPatch, after: str
) -> None:
    # Far from a transition one wall time is examined. Near one, the search may look at a
    # few more, but not at every matching wall time of the hour the offsets differ by: for an
    # every-second cron that is thousands of candidates, ~0.1 s per slot on this machine.
    examined = 0
    next_wall = CronSpec.next_wall

    def counting(spec: CronSpec, wall: datetime) -> datetime | None:
        nonlocal examined
        examined += 1
        return next_wall(spec, wall)

    monkeypatch.setattr(CronSpec, "next_wall", counting)
    at = int(datetime.fromisoformat(after).timestamp() * 1000)
    assert CronTrigger("* * * * * *").slot_after(at, "Europe/Berlin")
    assert examined <= 100


# --------------------------------------------------------------------------- stored specs

ROUND_TRIP = [
    *(
        pytest.param(CronTrigger("30 2 * * *", r, m), id=f"cron-{r.value}+{m.value}")
        for r in RepeatedHour
        for m in MissingHour
    ),
    pytest.param(CronTrigger("*/20 5 * * * *"), id="cron-seconds"),
    pytest.param(CronTrigger("0 9 * jan,jul mon-fri"), id="cron-names"),
    pytest.param(IntervalTrigger(every_ms=90_000, anchor_ms=ANCHOR), id="interval"),
    pytest.param(OneShotTrigger(at_ms=ANCHOR), id="once"),
]


@pytest.mark.parametrize("trigger", ROUND_TRIP)
def test_trigger_round_trips_through_its_spec(trigger: Trigger) -> None:
    assert trigger_from_spec(trigger.kind, trigger.to_spec()) == trigger


@pytest.mark.parametrize("trigger", ROUND_TRIP)
def test_trigger_spec_survives_json(trigger: Trigger) -> None:
    stored = json.loads(json.dumps(trigger.to_spec()))
    assert trigger_from_spec(trigger.kind, stored) == trigger


def test_trigger_kinds_are_cron_interval_and_once() -> None:
    kinds = [
        CronTrigger("* * * * *").kind,
        IntervalTrigger(every_ms=1_000, anchor_ms=0).kind,
        OneShotTrigger(at_ms=0).kind,
    ]
    assert kinds == ["cron", "interval", "once"]


def test_unknown_trigger_kind_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="unknown trigger kind"):
        trigger_from_spec("weekly", {})


def test_stored_cron_spec_with_a_malformed_expression_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="malformed cron"):
        trigger_from_spec(
            "cron", {"cron": "61 * * * *", "dst_repeated": "first", "dst_missing": "shift"}
        )


def test_a_real_slot_after_a_gap_comes_before_a_later_shifted_one() -> None:
    # Lord Howe skips 02:00-02:30 on 2026-10-04. 02:15 shifts to 02:45; the real 02:30 is
    # earlier, though it follows 02:15 in wall order. Start a day before, far from the gap.
    trigger = CronTrigger("15,30 2 * * *")
    tz = "Australia/Lord_Howe"
    cursor = parse_instant("2026-10-03T02:30:00+10:30")
    seen = []
    for _ in range(3):
        slot = trigger.slot_after(cursor, tz)
        assert slot is not None
        cursor = slot.at_ms
        seen.append(iso_local(cursor, tz))
    assert seen == [
        "2026-10-04T02:30:00+11:00",
        "2026-10-04T02:45:00+11:00",
        "2026-10-05T02:15:00+11:00",
    ]
