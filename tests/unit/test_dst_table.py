"""Acceptance 5: the documented DST behaviour of cron triggers, as an explicit table.

Every row is one cron in one zone around one 2026 transition (dates from zoneinfo):

| zone                | spring forward (wall-clock gap)   | fall back (wall times repeated)     |
|---------------------|-----------------------------------|-------------------------------------|
| Europe/Berlin       | 03-29 02:00 +01 -> 03:00 +02      | 10-25 03:00 +02 -> 02:00 +01        |
| America/New_York    | 03-08 02:00 -05 -> 03:00 -04      | 11-01 02:00 -04 -> 01:00 -05        |
| Australia/Sydney    | 10-04 02:00 +10 -> 03:00 +11      | 04-05 03:00 +11 -> 02:00 +10        |
| Australia/Lord_Howe | 10-04 02:00 +10:30 -> 02:30 +11   | 04-05 02:00 +11 -> 01:30 +10:30     |

A fall-back row lists the slots for each repeated-hour rule (first/last/both); it must hold under
either missing-hour rule. A spring-forward row lists the slots for each missing-hour rule
(shift/skip); it must hold under every repeated-hour rule. Slots are written as local ISO times
with their UTC offset, which is also what a slot key carries.

The expectations are literals; instants are rendered with the standard library only, so nothing
here is computed by the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from engine.domain.slots import slot_key
from engine.domain.triggers import CronTrigger, MissingHour, RepeatedHour, Slot, SlotNote

SPRING = "spring-forward"
FALL = "fall-back"

DAILY = "30 2 * * *"
HOURLY = "0 * * * *"


@dataclass(frozen=True)
class Window:
    """The slots of one cron, in one zone, strictly after `after` and before `until`."""

    zone: str
    cron: str
    transition: str  # SPRING or FALL, with the date
    after: str
    until: str
    expected: dict[str, tuple[str, ...]]  # rule -> slot instants, local ISO with offset

    @property
    def kind(self) -> str:
        return SPRING if self.transition.startswith(SPRING) else FALL


TABLE: tuple[Window, ...] = (
    # ---------------------------------------------------------------- Europe/Berlin
    Window(
        "Europe/Berlin",
        DAILY,
        f"{SPRING} 2026-03-29",
        after="2026-03-28T00:00:00+01:00",
        until="2026-03-31T00:00:00+02:00",
        expected={
            # 02:30 does not exist: shifted by the 1 h gap to 03:30 CEST, or skipped.
            "shift": (
                "2026-03-28T02:30:00+01:00",
                "2026-03-29T03:30:00+02:00",
                "2026-03-30T02:30:00+02:00",
            ),
            "skip": ("2026-03-28T02:30:00+01:00", "2026-03-30T02:30:00+02:00"),
        },
    ),
    Window(
        "Europe/Berlin",
        HOURLY,
        f"{SPRING} 2026-03-29",
        after="2026-03-28T23:30:00+01:00",
        until="2026-03-29T04:30:00+02:00",
        expected={
            # 02:00 shifted is 03:00 CEST, which the 03:00 wall time already names: one slot.
            "shift": (
                "2026-03-29T00:00:00+01:00",
                "2026-03-29T01:00:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-29T04:00:00+02:00",
            ),
            "skip": (
                "2026-03-29T00:00:00+01:00",
                "2026-03-29T01:00:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-29T04:00:00+02:00",
            ),
        },
    ),
    Window(
        "Europe/Berlin",
        DAILY,
        f"{FALL} 2026-10-25",
        after="2026-10-24T00:00:00+02:00",
        until="2026-10-27T00:00:00+01:00",
        expected={
            "first": (
                "2026-10-24T02:30:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-26T02:30:00+01:00",
            ),
            "last": (
                "2026-10-24T02:30:00+02:00",
                "2026-10-25T02:30:00+01:00",
                "2026-10-26T02:30:00+01:00",
            ),
            "both": (
                "2026-10-24T02:30:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-25T02:30:00+01:00",
                "2026-10-26T02:30:00+01:00",
            ),
        },
    ),
    Window(
        "Europe/Berlin",
        HOURLY,
        f"{FALL} 2026-10-25",
        after="2026-10-24T23:30:00+02:00",
        until="2026-10-25T04:30:00+01:00",
        expected={
            "first": (
                "2026-10-25T00:00:00+02:00",
                "2026-10-25T01:00:00+02:00",
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T04:00:00+01:00",
            ),
            "last": (
                "2026-10-25T00:00:00+02:00",
                "2026-10-25T01:00:00+02:00",
                "2026-10-25T02:00:00+01:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T04:00:00+01:00",
            ),
            "both": (
                "2026-10-25T00:00:00+02:00",
                "2026-10-25T01:00:00+02:00",
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T02:00:00+01:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T04:00:00+01:00",
            ),
        },
    ),
    # ---------------------------------------------------------------- America/New_York
    Window(
        "America/New_York",
        DAILY,
        f"{SPRING} 2026-03-08",
        after="2026-03-07T00:00:00-05:00",
        until="2026-03-10T00:00:00-04:00",
        expected={
            "shift": (
                "2026-03-07T02:30:00-05:00",
                "2026-03-08T03:30:00-04:00",
                "2026-03-09T02:30:00-04:00",
            ),
            "skip": ("2026-03-07T02:30:00-05:00", "2026-03-09T02:30:00-04:00"),
        },
    ),
    Window(
        "America/New_York",
        HOURLY,
        f"{SPRING} 2026-03-08",
        after="2026-03-07T23:30:00-05:00",
        until="2026-03-08T04:30:00-04:00",
        expected={
            "shift": (
                "2026-03-08T00:00:00-05:00",
                "2026-03-08T01:00:00-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-08T04:00:00-04:00",
            ),
            "skip": (
                "2026-03-08T00:00:00-05:00",
                "2026-03-08T01:00:00-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-08T04:00:00-04:00",
            ),
        },
    ),
    Window(
        "America/New_York",
        DAILY,
        f"{FALL} 2026-11-01",
        after="2026-10-31T00:00:00-04:00",
        until="2026-11-03T00:00:00-05:00",
        expected={
            # New York repeats 01:00-01:59; 02:30 happens once, so no rule changes anything.
            "first": (
                "2026-10-31T02:30:00-04:00",
                "2026-11-01T02:30:00-05:00",
                "2026-11-02T02:30:00-05:00",
            ),
            "last": (
                "2026-10-31T02:30:00-04:00",
                "2026-11-01T02:30:00-05:00",
                "2026-11-02T02:30:00-05:00",
            ),
            "both": (
                "2026-10-31T02:30:00-04:00",
                "2026-11-01T02:30:00-05:00",
                "2026-11-02T02:30:00-05:00",
            ),
        },
    ),
    Window(
        "America/New_York",
        HOURLY,
        f"{FALL} 2026-11-01",
        after="2026-10-31T23:30:00-04:00",
        until="2026-11-01T04:30:00-05:00",
        expected={
            "first": (
                "2026-11-01T00:00:00-04:00",
                "2026-11-01T01:00:00-04:00",
                "2026-11-01T02:00:00-05:00",
                "2026-11-01T03:00:00-05:00",
                "2026-11-01T04:00:00-05:00",
            ),
            "last": (
                "2026-11-01T00:00:00-04:00",
                "2026-11-01T01:00:00-05:00",
                "2026-11-01T02:00:00-05:00",
                "2026-11-01T03:00:00-05:00",
                "2026-11-01T04:00:00-05:00",
            ),
            "both": (
                "2026-11-01T00:00:00-04:00",
                "2026-11-01T01:00:00-04:00",
                "2026-11-01T01:00:00-05:00",
                "2026-11-01T02:00:00-05:00",
                "2026-11-01T03:00:00-05:00",
                "2026-11-01T04:00:00-05:00",
            ),
        },
    ),
    # ---------------------------------------------------------------- Australia/Sydney
    Window(
        "Australia/Sydney",
        DAILY,
        f"{FALL} 2026-04-05",
        after="2026-04-04T00:00:00+11:00",
        until="2026-04-07T00:00:00+10:00",
        expected={
            "first": (
                "2026-04-04T02:30:00+11:00",
                "2026-04-05T02:30:00+11:00",
                "2026-04-06T02:30:00+10:00",
            ),
            "last": (
                "2026-04-04T02:30:00+11:00",
                "2026-04-05T02:30:00+10:00",
                "2026-04-06T02:30:00+10:00",
            ),
            "both": (
                "2026-04-04T02:30:00+11:00",
                "2026-04-05T02:30:00+11:00",
                "2026-04-05T02:30:00+10:00",
                "2026-04-06T02:30:00+10:00",
            ),
        },
    ),
    Window(
        "Australia/Sydney",
        HOURLY,
        f"{FALL} 2026-04-05",
        after="2026-04-04T23:30:00+11:00",
        until="2026-04-05T04:30:00+10:00",
        expected={
            "first": (
                "2026-04-05T00:00:00+11:00",
                "2026-04-05T01:00:00+11:00",
                "2026-04-05T02:00:00+11:00",
                "2026-04-05T03:00:00+10:00",
                "2026-04-05T04:00:00+10:00",
            ),
            "last": (
                "2026-04-05T00:00:00+11:00",
                "2026-04-05T01:00:00+11:00",
                "2026-04-05T02:00:00+10:00",
                "2026-04-05T03:00:00+10:00",
                "2026-04-05T04:00:00+10:00",
            ),
            "both": (
                "2026-04-05T00:00:00+11:00",
                "2026-04-05T01:00:00+11:00",
                "2026-04-05T02:00:00+11:00",
                "2026-04-05T02:00:00+10:00",
                "2026-04-05T03:00:00+10:00",
                "2026-04-05T04:00:00+10:00",
            ),
        },
    ),
    Window(
        "Australia/Sydney",
        DAILY,
        f"{SPRING} 2026-10-04",
        after="2026-10-03T00:00:00+10:00",
        until="2026-10-06T00:00:00+11:00",
        expected={
            "shift": (
                "2026-10-03T02:30:00+10:00",
                "2026-10-04T03:30:00+11:00",
                "2026-10-05T02:30:00+11:00",
            ),
            "skip": ("2026-10-03T02:30:00+10:00", "2026-10-05T02:30:00+11:00"),
        },
    ),
    Window(
        "Australia/Sydney",
        HOURLY,
        f"{SPRING} 2026-10-04",
        after="2026-10-03T23:30:00+10:00",
        until="2026-10-04T04:30:00+11:00",
        expected={
            "shift": (
                "2026-10-04T00:00:00+10:00",
                "2026-10-04T01:00:00+10:00",
                "2026-10-04T03:00:00+11:00",
                "2026-10-04T04:00:00+11:00",
            ),
            "skip": (
                "2026-10-04T00:00:00+10:00",
                "2026-10-04T01:00:00+10:00",
                "2026-10-04T03:00:00+11:00",
                "2026-10-04T04:00:00+11:00",
            ),
        },
    ),
    # ---------------------------------------------------------------- Australia/Lord_Howe
    # A 30-minute shift: the repeated range is 01:30-01:59 and the gap is 02:00-02:29.
    Window(
        "Australia/Lord_Howe",
        DAILY,
        f"{FALL} 2026-04-05",
        after="2026-04-04T00:00:00+11:00",
        until="2026-04-07T00:00:00+10:30",
        expected={
            "first": (
                "2026-04-04T02:30:00+11:00",
                "2026-04-05T02:30:00+10:30",
                "2026-04-06T02:30:00+10:30",
            ),
            "last": (
                "2026-04-04T02:30:00+11:00",
                "2026-04-05T02:30:00+10:30",
                "2026-04-06T02:30:00+10:30",
            ),
            "both": (
                "2026-04-04T02:30:00+11:00",
                "2026-04-05T02:30:00+10:30",
                "2026-04-06T02:30:00+10:30",
            ),
        },
    ),
    Window(
        "Australia/Lord_Howe",
        HOURLY,
        f"{FALL} 2026-04-05",
        after="2026-04-04T23:30:00+11:00",
        until="2026-04-05T04:30:00+10:30",
        expected={
            # No full hour is repeated; 01:00 +11 to 02:00 +10:30 is 90 minutes of elapsed time.
            "first": (
                "2026-04-05T00:00:00+11:00",
                "2026-04-05T01:00:00+11:00",
                "2026-04-05T02:00:00+10:30",
                "2026-04-05T03:00:00+10:30",
                "2026-04-05T04:00:00+10:30",
            ),
            "last": (
                "2026-04-05T00:00:00+11:00",
                "2026-04-05T01:00:00+11:00",
                "2026-04-05T02:00:00+10:30",
                "2026-04-05T03:00:00+10:30",
                "2026-04-05T04:00:00+10:30",
            ),
            "both": (
                "2026-04-05T00:00:00+11:00",
                "2026-04-05T01:00:00+11:00",
                "2026-04-05T02:00:00+10:30",
                "2026-04-05T03:00:00+10:30",
                "2026-04-05T04:00:00+10:30",
            ),
        },
    ),
    Window(
        "Australia/Lord_Howe",
        "30 1 * * *",
        f"{FALL} 2026-04-05",
        after="2026-04-04T00:00:00+11:00",
        until="2026-04-07T00:00:00+10:30",
        expected={
            # 01:30 is repeated: the two passes are only 30 minutes apart.
            "first": (
                "2026-04-04T01:30:00+11:00",
                "2026-04-05T01:30:00+11:00",
                "2026-04-06T01:30:00+10:30",
            ),
            "last": (
                "2026-04-04T01:30:00+11:00",
                "2026-04-05T01:30:00+10:30",
                "2026-04-06T01:30:00+10:30",
            ),
            "both": (
                "2026-04-04T01:30:00+11:00",
                "2026-04-05T01:30:00+11:00",
                "2026-04-05T01:30:00+10:30",
                "2026-04-06T01:30:00+10:30",
            ),
        },
    ),
    Window(
        "Australia/Lord_Howe",
        DAILY,
        f"{SPRING} 2026-10-04",
        after="2026-10-03T00:00:00+10:30",
        until="2026-10-06T00:00:00+11:00",
        expected={
            # 02:30 is the first wall time after the gap: it exists, no rule applies.
            "shift": (
                "2026-10-03T02:30:00+10:30",
                "2026-10-04T02:30:00+11:00",
                "2026-10-05T02:30:00+11:00",
            ),
            "skip": (
                "2026-10-03T02:30:00+10:30",
                "2026-10-04T02:30:00+11:00",
                "2026-10-05T02:30:00+11:00",
            ),
        },
    ),
    Window(
        "Australia/Lord_Howe",
        HOURLY,
        f"{SPRING} 2026-10-04",
        after="2026-10-03T23:30:00+10:30",
        until="2026-10-04T04:30:00+11:00",
        expected={
            # 02:00 does not exist: shifted by the 30-minute gap to 02:30 +11:00, or skipped.
            "shift": (
                "2026-10-04T00:00:00+10:30",
                "2026-10-04T01:00:00+10:30",
                "2026-10-04T02:30:00+11:00",
                "2026-10-04T03:00:00+11:00",
                "2026-10-04T04:00:00+11:00",
            ),
            "skip": (
                "2026-10-04T00:00:00+10:30",
                "2026-10-04T01:00:00+10:30",
                "2026-10-04T03:00:00+11:00",
                "2026-10-04T04:00:00+11:00",
            ),
        },
    ),
    Window(
        "Australia/Lord_Howe",
        "*/15 2 * * *",
        f"{SPRING} 2026-10-04",
        after="2026-10-04T00:00:00+10:30",
        until="2026-10-04T04:00:00+11:00",
        expected={
            # 02:00 and 02:15 shifted are 02:30 and 02:45, which real wall times name:
            # one slot each.
            "shift": ("2026-10-04T02:30:00+11:00", "2026-10-04T02:45:00+11:00"),
            "skip": ("2026-10-04T02:30:00+11:00", "2026-10-04T02:45:00+11:00"),
        },
    ),
)


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def _iso(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).isoformat()


def _slots(trigger: CronTrigger, zone: str, after: str, until: str) -> list[Slot]:
    """Every slot in (after, until), by calling slot_after from the previous slot."""
    found: list[Slot] = []
    cursor, end = _ms(after), _ms(until)
    while (slot := trigger.slot_after(cursor, zone)) is not None and slot.at_ms < end:
        found.append(slot)
        cursor = slot.at_ms
        assert len(found) < 100, "runaway iteration"
    return found


def _triggers(window: Window, rule: str) -> list[CronTrigger]:
    """The rule under test, combined with every value of the rule that must not matter."""
    if window.kind == FALL:
        return [CronTrigger(window.cron, RepeatedHour(rule), missing) for missing in MissingHour]
    return [CronTrigger(window.cron, repeated, MissingHour(rule)) for repeated in RepeatedHour]


CASES = [
    pytest.param(
        window,
        rule,
        id=f"{window.zone}|{window.cron.replace(' ', '_')}|{window.transition}|{rule}",
    )
    for window in TABLE
    for rule in window.expected
]


def test_table_covers_every_zone_cron_transition_and_rule() -> None:
    zones = ("Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe")
    for zone in zones:
        for cron in (DAILY, HOURLY):
            for kind, rules in ((SPRING, {"shift", "skip"}), (FALL, {"first", "last", "both"})):
                rows = [w for w in TABLE if (w.zone, w.cron, w.kind) == (zone, cron, kind)]
                assert len(rows) == 1, (zone, cron, kind)
                assert set(rows[0].expected) == rules, (zone, cron, kind)


@pytest.mark.parametrize(("window", "rule"), CASES)
def test_cron_slots_around_transition_are_the_documented_instants(
    window: Window, rule: str
) -> None:
    for trigger in _triggers(window, rule):
        slots = _slots(trigger, window.zone, window.after, window.until)
        actual = tuple(_iso(slot.at_ms, window.zone) for slot in slots)
        assert actual == window.expected[rule], trigger


@pytest.mark.parametrize(("window", "rule"), CASES)
def test_slot_after_from_any_instant_in_the_window_is_the_next_documented_slot(
    window: Window, rule: str
) -> None:
    expected_ms = [_ms(iso) for iso in window.expected[rule]]
    start, end = _ms(window.after), _ms(window.until)
    probes = set(range(start, end, 15 * 60_000))
    probes |= {ms + delta for ms in expected_ms for delta in (-1, 0, 1)}
    for trigger in _triggers(window, rule):
        for probe in sorted(probes):
            want = next((ms for ms in expected_ms if ms > probe), None)
            slot = trigger.slot_after(probe, window.zone)
            got = None if slot is None or slot.at_ms >= end else slot.at_ms
            if want is None:
                assert got is None, (trigger, _iso(probe, window.zone))
            else:
                assert got == want, (trigger, _iso(probe, window.zone), _iso(want, window.zone))


REPEATED_PASSES = [
    # zone, cron, an instant before the first pass, the two slot keys
    ("Europe/Berlin", DAILY, "2026-10-25T02:00:00+02:00",
     "nightly@2026-10-25T02:30:00+02:00", "nightly@2026-10-25T02:30:00+01:00"),
    ("Europe/Berlin", HOURLY, "2026-10-25T01:30:00+02:00",
     "nightly@2026-10-25T02:00:00+02:00", "nightly@2026-10-25T02:00:00+01:00"),
    ("America/New_York", HOURLY, "2026-11-01T00:30:00-04:00",
     "nightly@2026-11-01T01:00:00-04:00", "nightly@2026-11-01T01:00:00-05:00"),
    ("Australia/Sydney", DAILY, "2026-04-05T02:00:00+11:00",
     "nightly@2026-04-05T02:30:00+11:00", "nightly@2026-04-05T02:30:00+10:00"),
    ("Australia/Sydney", HOURLY, "2026-04-05T01:30:00+11:00",
     "nightly@2026-04-05T02:00:00+11:00", "nightly@2026-04-05T02:00:00+10:00"),
    ("Australia/Lord_Howe", "30 1 * * *", "2026-04-05T01:00:00+11:00",
     "nightly@2026-04-05T01:30:00+11:00", "nightly@2026-04-05T01:30:00+10:30"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("zone", "cron", "after", "first_key", "second_key"),
    REPEATED_PASSES,
    ids=[f"{row[0]}|{row[1].replace(' ', '_')}" for row in REPEATED_PASSES],
)
def test_two_passes_of_a_repeated_hour_have_different_slot_keys(
    zone: str, cron: str, after: str, first_key: str, second_key: str
) -> None:
    trigger = CronTrigger(cron, RepeatedHour.BOTH)
    first = trigger.slot_after(_ms(after), zone)
    assert first is not None
    second = trigger.slot_after(first.at_ms, zone)
    assert second is not None
    keys = (slot_key("nightly", first.at_ms, zone), slot_key("nightly", second.at_ms, zone))
    assert keys == (first_key, second_key)
    assert keys[0] != keys[1]


def test_passes_of_a_repeated_hour_are_noted_first_and_second() -> None:
    trigger = CronTrigger(DAILY, RepeatedHour.BOTH)
    slots = _slots(
        trigger, "Europe/Berlin", "2026-10-25T00:00:00+02:00", "2026-10-25T04:00:00+01:00"
    )
    assert [s.note for s in slots] == [SlotNote.REPEATED_FIRST, SlotNote.REPEATED_SECOND]
    assert [s.wall for s in slots] == [datetime(2026, 10, 25, 2, 30)] * 2


def test_shifted_slot_is_noted_shifted_and_keeps_its_wall_time() -> None:
    trigger = CronTrigger(DAILY, missing=MissingHour.SHIFT)
    slots = _slots(
        trigger, "Europe/Berlin", "2026-03-29T00:00:00+01:00", "2026-03-29T12:00:00+02:00"
    )
    assert [(s.note, s.wall) for s in slots] == [(SlotNote.SHIFTED, datetime(2026, 3, 29, 2, 30))]


def test_shifted_slot_that_a_real_wall_time_names_is_the_real_one() -> None:
    trigger = CronTrigger(HOURLY, missing=MissingHour.SHIFT)
    slot = trigger.slot_after(_ms("2026-03-29T01:00:00+01:00"), "Europe/Berlin")
    assert slot is not None
    assert (_iso(slot.at_ms, "Europe/Berlin"), slot.note, slot.wall) == (
        "2026-03-29T03:00:00+02:00",
        SlotNote.NONE,
        datetime(2026, 3, 29, 3, 0),
    )
