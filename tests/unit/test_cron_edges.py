"""Edge cases of the cron grammar and DST rules named by issue 17 (/work/notes/cron-spec.md).

Expectations are literals; the oracle (tests/oracle) is only used to double-check counts.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from engine.domain.cron import parse_cron
from engine.domain.errors import InvalidInput
from engine.domain.triggers import CronTrigger, MissingHour, RepeatedHour
from tests.oracle import cron_oracle as oracle


def ms(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def fires(trigger: CronTrigger, zone: str, after: str, until: str) -> list[str]:
    """The local ISO times of the slots in (after, until]."""
    out: list[str] = []
    cursor, end = ms(after), ms(until)
    while (slot := trigger.slot_after(cursor, zone)) is not None and slot.at_ms <= end:
        out.append(oracle.local_iso(slot.at_ms, zone))
        cursor = slot.at_ms
    return out


def test_a_cron_whose_every_slot_is_in_the_gap_has_none_and_says_so_fast() -> None:
    # Every last Sunday of March, 02:30 Berlin does not exist; skipped, nothing is left.
    trigger = CronTrigger("30 2 * 3 L0", RepeatedHour.AUTO, MissingHour.SKIP)
    started = time.process_time()
    assert trigger.slot_after(ms("2026-01-01T00:00:00+01:00"), "Europe/Berlin") is None
    assert time.process_time() - started < 2.0
    # Shifted, it fires each year at 03:30 CEST.
    shifted = CronTrigger("30 2 * 3 L0", RepeatedHour.AUTO, MissingHour.SHIFT)
    slot = shifted.slot_after(ms("2026-01-01T00:00:00+01:00"), "Europe/Berlin")
    assert slot is not None
    assert oracle.local_iso(slot.at_ms, "Europe/Berlin") == "2026-03-29T03:30:00+02:00"


def test_a_day_no_month_has_never_fires_and_says_so_fast() -> None:
    started = time.process_time()
    assert CronTrigger("0 0 30 2 *").slot_after(ms("2026-01-01T00:00:00+00:00"), "UTC") is None
    assert time.process_time() - started < 2.0


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Australia/Lord_Howe"])
def test_an_hour_range_of_one_value_fires_once_a_day(zone: str) -> None:
    got = fires(
        CronTrigger("0 9-9 * * *"), zone, "2026-03-25T00:00:00+00:00", "2026-04-08T00:00:00+00:00"
    )
    assert len(got) == 14
    assert all(text[11:19] == "09:00:00" for text in got)
    assert len({text[:10] for text in got}) == 14


def test_a_minute_range_of_one_value_fires_once_an_hour() -> None:
    got = fires(
        CronTrigger("5-5 * * * *"), "UTC", "2026-01-05T00:00:00+00:00", "2026-01-06T00:00:00+00:00"
    )
    assert got == [f"2026-01-05T{h:02d}:05:00+00:00" for h in range(24)]


def test_named_ranges_of_one_value() -> None:
    got = fires(
        CronTrigger("0 0 * jan-jan mon-mon"),
        "UTC",
        "2025-12-31T00:00:00+00:00",
        "2027-01-01T00:00:00+00:00",
    )
    assert got == [f"2026-01-{d:02d}T00:00:00+00:00" for d in (5, 12, 19, 26)]


@pytest.mark.parametrize("expression", ["0 12 * * 1#2,5", "0 12 * * L1,3", "0 12 * * 5L,0"])
def test_nth_and_last_weekdays_mix_with_plain_ones(expression: str) -> None:
    parse_cron(expression)
    CronTrigger(expression)


@pytest.mark.parametrize(
    ("expression", "hint"),
    [("0 23-1 * * *", "23,0-1"), ("50-10 * * * *", "50-59,0-10")],
)
def test_a_backwards_range_is_refused_with_its_split(expression: str, hint: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_cron(expression)
    assert hint in str(refused.value)


@pytest.mark.parametrize("expression", ["0 0 * * fri-mon", "0 0 * * 5-1", "0 0 * dec-jan *"])
def test_backwards_named_ranges_are_refused(expression: str) -> None:
    with pytest.raises(InvalidInput):
        parse_cron(expression)


@pytest.mark.parametrize("expression", ["H * * * *", "0 H * * *", "0 0 H * *", "0 0 * * H"])
def test_hashed_fields_are_refused(expression: str) -> None:
    with pytest.raises(InvalidInput):
        parse_cron(expression)


def test_mon_sun_is_all_week() -> None:
    # The spec's own example of a day-of-week list covering all seven days.
    assert fires(
        CronTrigger("0 0 13 * mon-sun"),
        "UTC",
        "2026-04-01T00:00:00+00:00",
        "2026-04-04T00:00:00+00:00",
    ) == [f"2026-04-0{d}T00:00:00+00:00" for d in (2, 3, 4)]


def test_apia_fires_the_24_hours_of_its_missing_day_under_shift() -> None:
    trigger = CronTrigger("0 * 30 12 *", RepeatedHour.AUTO, MissingHour.SHIFT)
    got = fires(trigger, "Pacific/Apia", "2011-12-29T00:00:00-10:00", "2012-01-02T00:00:00+14:00")
    assert got == [f"2011-12-31T{h:02d}:00:00+14:00" for h in range(24)]
    assert len(set(got)) == 24
    expected = oracle.oracle_slots(
        "0 * 30 12 *", "Pacific/Apia", ms("2011-12-29T00:00:00-10:00"), "auto", "shift", 24
    )
    assert [oracle.local_iso(t, "Pacific/Apia") for t in expected] == got


def test_apia_fires_its_missing_day_once_under_transition_and_not_under_skip() -> None:
    window = ("2011-12-29T00:00:00-10:00", "2012-01-02T00:00:00+14:00")
    transition = CronTrigger("0 * 30 12 *", RepeatedHour.AUTO, MissingHour.TRANSITION)
    assert fires(transition, "Pacific/Apia", *window) == ["2011-12-31T00:00:00+14:00"]
    skip = CronTrigger("0 * 30 12 *", RepeatedHour.AUTO, MissingHour.SKIP)
    assert fires(skip, "Pacific/Apia", *window) == []


@pytest.mark.parametrize(
    ("zone", "after"),
    [
        ("Europe/Berlin", "2026-03-29T03:00:05+02:00"),
        ("Antarctica/Casey", "2009-10-18T05:00:05+11:00"),
        ("Pacific/Apia", "2011-12-31T00:00:05+14:00"),
    ],
)
def test_a_gap_already_behind_costs_nothing_under_transition(zone: str, after: str) -> None:
    # Every wall time of a gap fires at its transition: once that instant is past, the gap
    # has nothing more to give, whatever its width (under shift the same call costs ~0 ms).
    trigger = CronTrigger("* * * * * *", RepeatedHour.AUTO, MissingHour.TRANSITION)
    cursor = ms(after)
    started = time.process_time()
    for _ in range(10):
        slot = trigger.slot_after(cursor, zone)
        assert slot is not None
        assert slot.at_ms == cursor - cursor % 1000 + 1000
        cursor = slot.at_ms
    assert time.process_time() - started < 0.1, "10 next-second slots took over 0.1 s of CPU"
