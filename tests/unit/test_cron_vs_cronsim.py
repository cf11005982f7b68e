"""CronTrigger against cronsim, an independent cron library (test-only dependency).

Where the two should agree, random expressions are compared fire for fire: 5- and 6-field crons
(both read six fields seconds first), names, steps, ranges, `N/S`, the day-field rule (AND
when a day field starts with `*`, else OR), `L`, `LW`, `D#k` and `DL`, in UTC, in fixed zones
with 30- and 45-minute offsets, and in DST zones away from their transitions (the fires are
compared up to the next transition).

Every known divergence is asserted explicitly below (test_divergence_<n>):

| #  | case                             | ours                        | cronsim                    |
|----|----------------------------------|-----------------------------|----------------------------|
| 1  | `NW` (`0 0 15W * *`)             | the Mon-Fri day nearest N   | refused: Bad day-of-month  |
| 2  | `?` (`0 0 ? * *`)                | same as `*`                 | refused: Bad day-of-month  |
| 3  | `LD` (`0 0 * * L5`)              | last Friday (as `5L`)       | refused: Bad day-of-week   |
| 4  | aliases (`@daily`)               | `0 0 * * *`                 | refused: number of fields  |
| 5  | `mon-sun`                        | all week (sun as end is 7)  | refused: Bad day-of-week   |
| 6  | no such day (`0 0 30 2 *`)       | parses; slot_after None     | refused: Bad day-of-month  |
| 7  | never fires (`0 0 */29 2 1#5`)   | None (400-year search)      | StopIteration (50 years)   |
| 8  | gap, fixed (Berlin `30 2 * * *`) | shift 03:30 / trans. 03:00  | 03:00 (our transition)     |
| 9  | 30-min gap (Lord Howe `15 2`)    | shift 02:45 / trans. 02:30  | 02:30 (our transition)     |
| 10 | gap, wildcard (`15 */2 * * *`)   | shift 03:15 / trans. 03:00  | none (our skip)            |
| 11 | fall, 6-field (`0 30 2 * * *`)   | auto: first pass only       | both passes (our both)     |
| 12 | spring, 6-field (`0 30 2 * * *`) | auto/shift: 03:30           | none (our skip)            |
| 13 | gap off the minute (Monrovia     | transition: 00:44:30        | 00:45:00, the first whole  |
|    | 1972-01-07 -00:44:30 -> +00:00)  |                             | minute after the gap       |
| 14 | 24-h gap, wildcard (Apia         | shift: 24 slots on the 31st | one, at the transition, as |
|    | 2011-12-30, `0 * 30 12 *`)       | transition: one             | 2011-12-30T00:00-10:00     |
| 15 | `N-N/S` (`0 9-9/2 * * *`)        | {9}: the range, stepped     | 9/2: 9, 11, ... 23         |

(8-10, 13, 14: ours under shift, the default, and transition ("trans."); 11, 12: under
auto, the default. The wall time cronsim names in 14 never existed: it is the transition
instant read at the old offset.)

Agreements around transitions that are easy to take for divergences (asserted too): in the
autumn a fixed-time 5-field cron fires once, in the first pass (our `auto` and `first`), and a
wildcard-hour 5-field cron fires in both passes (our `auto` and `both`).
"""

from __future__ import annotations

import calendar
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from engine.domain.errors import InvalidInput
from engine.domain.triggers import CronTrigger, MissingHour, RepeatedHour
from tests.oracle import cron_oracle as oracle
from tests.unit.test_cron_properties import EXAMPLES, _transitions

DIFFERENTIAL = settings(
    max_examples=EXAMPLES or 150,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
FIRES = 8
# Zones without a transition after 1996; and DST zones, compared up to their next transition.
FIXED_ZONES = (
    "UTC",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Australia/Darwin",
    "Pacific/Marquesas",
    "Asia/Tokyo",
    "Pacific/Kiritimati",
)
DST_ZONES = ("Europe/Berlin", "America/New_York", "Australia/Sydney", "America/St_Johns")
FIRST_YEAR, LAST_YEAR = 1996, 2040
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


# ---------------------------------------------------------------------------- strategies


@st.composite
def _item(draw: st.DrawFn, low: int, high: int, names: tuple[str, ...] = (), first: int = 0) -> str:
    def show(n: int) -> str:
        if names and 0 <= n - first < len(names) and draw(st.integers(0, 2)) == 0:
            return draw(st.sampled_from([names[n - first], names[n - first].upper()]))
        return str(n)

    n = draw(st.integers(low, high))
    kind = draw(st.sampled_from(["n", "range", "range", "star-step", "range-step", "n-step"]))
    if kind == "n":
        return show(n)
    if kind == "range":
        return f"{show(n)}-{show(draw(st.integers(n, high)))}"
    step = draw(st.integers(1, max(1, (high - low) // 2)))
    if kind == "star-step":
        return f"*/{step}"
    if kind == "range-step":  # N-N/S is divergence 15
        return f"{show(n)}-{show(draw(st.integers(min(n + 1, high), high)))}/{step}"
    return f"{n}/{step}"


def _field(
    low: int, high: int, names: tuple[str, ...] = (), first: int = 0
) -> st.SearchStrategy[str]:
    item = _item(low, high, names, first)
    return st.one_of(item, st.lists(item, min_size=2, max_size=3).map(",".join), st.just("*"))


def _dom() -> st.SearchStrategy[str]:
    special = st.one_of(st.just("L"), st.just("LW"), _item(1, 31))
    return st.one_of(
        st.just("*"),
        st.integers(1, 10).map(lambda s: f"*/{s}"),
        special,
        st.lists(special, min_size=2, max_size=3).map(",".join),
    )


def _dow() -> st.SearchStrategy[str]:
    day = st.one_of(st.integers(0, 7).map(str), st.sampled_from(DAYS))
    special = st.one_of(
        st.tuples(day, st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"),
        st.integers(0, 7).map(lambda d: f"{d}L"),
        _item(0, 7, DAYS),
    )
    return st.one_of(
        st.just("*"),
        st.sampled_from(["*/2", "*/3", "0-6", "1-5", "mon-fri", "1-7", "0-7"]),
        special,
        st.lists(special, min_size=2, max_size=3).map(",".join),
    )


@st.composite
def cronsim_expressions(draw: st.DrawFn) -> str:
    """Crons in the part of the grammar cronsim reads: no `?`, `W`, `LD`, aliases."""
    fields = [
        draw(_field(0, 59)),
        draw(_field(0, 23)),
        draw(st.one_of(st.just("*"), _dom())),
        draw(st.one_of(st.just("*"), st.just("*"), _field(1, 12, MONTHS, 1))),
        draw(st.one_of(st.just("*"), _dow())),
    ]
    if draw(st.integers(0, 3)) == 3:
        fields.insert(0, draw(_field(0, 59)))
    return " ".join(fields)


# ------------------------------------------------------------------------------- helpers


def ours(
    expression: str,
    zone: str,
    after_ms: int,
    count: int,
    repeated: str = "auto",
    missing: str = "shift",
) -> list[int]:
    trigger = CronTrigger(expression, RepeatedHour(repeated), MissingHour(missing))
    out: list[int] = []
    cursor = after_ms
    while len(out) < count:
        slot = trigger.slot_after(cursor, zone)
        if slot is None:
            break
        out.append(slot.at_ms)
        cursor = slot.at_ms
    return out


def theirs(expression: str, zone: str, after_ms: int, count: int) -> list[int] | str:
    """cronsim's next fires (epoch ms), or "stop" when it gives up (50 years)."""
    it = CronSim(expression, datetime.fromtimestamp(after_ms / 1000, ZoneInfo(zone)))
    out = []
    try:
        for _ in range(count):
            out.append(round(next(it).timestamp() * 1000))
    except StopIteration:
        return out if out else "stop"
    return out


def cronsim_wall(expression: str, zone: str, after: str) -> str:
    """cronsim's first fire as its own local ISO text (it can name a wall time that never was)."""
    start = datetime.fromisoformat(after).astimezone(ZoneInfo(zone))
    return next(CronSim(expression, start)).isoformat()


def local(instants: list[int], zone: str) -> list[str]:
    return [oracle.local_iso(t, zone) for t in instants]


def ms(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


# -------------------------------------------------------------------------- where they agree


@st.composite
def agreeing_cases(draw: st.DrawFn) -> tuple[str, str, int]:
    zone = draw(st.sampled_from(FIXED_ZONES + DST_ZONES))
    start = calendar.timegm((FIRST_YEAR, 1, 1, 0, 0, 0))
    end = calendar.timegm((LAST_YEAR, 1, 1, 0, 0, 0))
    seconds = draw(st.integers(start, end))
    millis = draw(st.sampled_from([0, 0, 500]))
    return draw(cronsim_expressions()), zone, seconds * 1000 + millis


@DIFFERENTIAL
@given(case=agreeing_cases())
def test_fires_agree_with_cronsim_away_from_transitions(case: tuple[str, str, int]) -> None:
    expression, zone, after_ms = case
    # No transition shortly before (a gap's shifted slots) and compare up to the next one.
    after = after_ms // 1000
    near = [t.at for t in _transitions(zone) if t.at > after - 2 * oracle.DAY]
    assume(not near or near[0] > after)
    until = near[0] * 1000 if near else None
    try:
        expected = theirs(expression, zone, after_ms, FIRES)
    except CronSimError:
        # cronsim refuses a day no month has when both day fields must match (divergence 6):
        # ours parses it, and it never fires.
        parsed = oracle.parse(expression)
        assert parsed.day_and, expression
        assert ours(expression, zone, after_ms, 1) == [], expression
        return
    try:
        got = ours(expression, zone, after_ms, FIRES)
    except InvalidInput as exc:
        pytest.fail(f"ours refuses {expression!r}, cronsim does not: {exc}")
    if expected == "stop":
        # cronsim found nothing within 50 years (divergence 7): neither may ours.
        fifty_years = after_ms + 50 * 365 * oracle.DAY * 1000
        assert not got or got[0] > fifty_years, (expression, local(got, zone))
        return
    assert isinstance(expected, list)
    if until is not None:
        got = [t for t in got if t < until]
        expected = [t for t in expected if t < until]
    else:
        got = got[: len(expected)]
    assert local(got, zone) == local(expected, zone), (
        f"{expression!r} in {zone} after {oracle.utc_iso(after_ms)}"
    )


def test_six_fields_are_seconds_first_in_both() -> None:
    after = ms("2026-01-05T00:00:00+00:00")
    expected = ["2026-01-05T10:05:00+00:00", "2026-01-05T10:05:20+00:00"]
    assert local(ours("*/20 5 10 * * *", "UTC", after, 2), "UTC") == expected
    their = theirs("*/20 5 10 * * *", "UTC", after, 2)
    assert isinstance(their, list)
    assert local(their, "UTC") == expected


def test_the_day_rule_is_the_same_or_and_and() -> None:
    after = ms("2025-12-31T12:00:00+00:00")
    for expression, days in [
        ("0 0 13 * 5", ["2026-01-02", "2026-01-09", "2026-01-13"]),  # OR: the 13th or Fridays
        ("0 0 */1 * 5", ["2026-01-02", "2026-01-09", "2026-01-16"]),  # AND: Fridays
        ("0 0 13 * 0-6", ["2026-01-01", "2026-01-02", "2026-01-03"]),  # OR with all seven days
        ("0 0 */2 * 1", ["2026-01-05", "2026-01-19", "2026-02-09"]),  # AND: odd-day Mondays
    ]:
        their = theirs(expression, "UTC", after, 3)
        assert isinstance(their, list)
        for side in (ours(expression, "UTC", after, 3), their):
            assert [text[:10] for text in local(side, "UTC")] == days, expression


# ------------------------------------------------------------------------------- divergences


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 0 15W * *", "Bad day-of-month"),  # 1
        ("0 0 ? * *", "Bad day-of-month"),  # 2
        ("0 0 * * L5", "Bad day-of-week"),  # 3
        ("@daily", "Wrong number of fields"),  # 4
        ("0 0 * * mon-sun", "Bad day-of-week"),  # 5
        ("0 0 30 2 *", "Bad day-of-month"),  # 6
    ],
)
def test_cronsim_refuses_what_ours_reads(expression: str, message: str) -> None:
    with pytest.raises(CronSimError, match=message):
        CronSim(expression, datetime(2026, 1, 1, tzinfo=UTC))
    CronTrigger(expression)  # ours reads it


def test_divergence_1_nearest_weekday() -> None:
    # 2026-02-15 is a Sunday: the Monday after; 2026-08-15 a Saturday: the Friday before.
    got = local(ours("0 0 15W * *", "UTC", ms("2026-02-01T00:00:00+00:00"), 7), "UTC")
    assert [t[:10] for t in got] == [
        "2026-02-16",
        "2026-03-16",
        "2026-04-15",
        "2026-05-15",
        "2026-06-15",
        "2026-07-15",
        "2026-08-14",
    ]


def test_divergence_2_3_4_5_read_as_their_plain_forms() -> None:
    after = ms("2026-01-01T00:00:00+00:00")
    assert ours("0 0 ? * *", "UTC", after, 5) == ours("0 0 * * *", "UTC", after, 5)
    their = theirs("0 0 * * 5L", "UTC", after, 5)
    assert ours("0 0 * * L5", "UTC", after, 5) == their
    assert ours("@daily", "UTC", after, 5) == ours("0 0 * * *", "UTC", after, 5)
    assert ours("0 0 * * mon-sun", "UTC", after, 9) == ours("0 0 * * *", "UTC", after, 9)


def test_divergence_6_7_never_fires() -> None:
    after = ms("2026-01-01T00:00:00+00:00")
    assert ours("0 0 30 2 *", "UTC", after, 1) == []
    assert ours("0 0 */29 2 1#5", "UTC", after, 1) == []  # the 1st or 30th, a fifth Monday
    assert theirs("0 0 */29 2 1#5", "UTC", after, 1) == "stop"


def test_divergence_8_spring_gap_fixed_time() -> None:
    after = ms("2026-03-28T12:00:00+01:00")
    their = theirs("30 2 * * *", "Europe/Berlin", after, 1)
    assert isinstance(their, list)
    assert local(their, "Europe/Berlin") == ["2026-03-29T03:00:00+02:00"]
    shift = ours("30 2 * * *", "Europe/Berlin", after, 1)
    transition = ours("30 2 * * *", "Europe/Berlin", after, 1, missing="transition")
    assert local(shift, "Europe/Berlin") == ["2026-03-29T03:30:00+02:00"]
    assert transition == their


def test_divergence_9_thirty_minute_gap() -> None:
    zone, after = "Australia/Lord_Howe", ms("2026-10-03T12:00:00+10:30")
    their = theirs("15 2 * * *", zone, after, 1)
    assert isinstance(their, list)
    assert local(their, zone) == ["2026-10-04T02:30:00+11:00"]
    assert local(ours("15 2 * * *", zone, after, 1), zone) == ["2026-10-04T02:45:00+11:00"]
    assert ours("15 2 * * *", zone, after, 1, missing="transition") == their


def test_divergence_10_spring_gap_wildcard_hour() -> None:
    zone, after = "Europe/Berlin", ms("2026-03-29T00:30:00+01:00")
    their = theirs("15 */2 * * *", zone, after, 2)
    assert isinstance(their, list)
    assert local(their, zone) == ["2026-03-29T04:15:00+02:00", "2026-03-29T06:15:00+02:00"]
    assert ours("15 */2 * * *", zone, after, 2, missing="skip") == their
    assert local(ours("15 */2 * * *", zone, after, 1), zone) == ["2026-03-29T03:15:00+02:00"]
    transition = ours("15 */2 * * *", zone, after, 1, missing="transition")
    assert local(transition, zone) == ["2026-03-29T03:00:00+02:00"]


def test_divergence_11_autumn_six_field_fixed_time() -> None:
    zone, after = "Europe/Berlin", ms("2026-10-24T12:00:00+02:00")
    their = theirs("0 30 2 * * *", zone, after, 2)
    assert isinstance(their, list)
    assert local(their, zone) == ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"]
    assert local(ours("0 30 2 * * *", zone, after, 2), zone) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    assert ours("0 30 2 * * *", zone, after, 2, repeated="both") == their


def test_divergence_12_spring_six_field_fixed_time() -> None:
    zone, after = "Europe/Berlin", ms("2026-03-28T12:00:00+01:00")
    their = theirs("0 30 2 * * *", zone, after, 1)
    assert isinstance(their, list)
    assert local(their, zone) == ["2026-03-30T02:30:00+02:00"]
    assert local(ours("0 30 2 * * *", zone, after, 1), zone) == ["2026-03-29T03:30:00+02:00"]
    assert ours("0 30 2 * * *", zone, after, 1, missing="skip") == their


def test_divergence_13_transition_off_the_minute() -> None:
    zone, after = "Africa/Monrovia", ms("1972-01-06T12:00:00+00:00")
    their = theirs("30 0 * * *", zone, after, 1)
    assert isinstance(their, list)
    assert local(their, zone) == ["1972-01-07T00:45:00+00:00"]
    transition = ours("30 0 * * *", zone, after, 1, missing="transition")
    assert local(transition, zone) == ["1972-01-07T00:44:30+00:00"]
    assert local(ours("30 0 * * *", zone, after, 1), zone) == ["1972-01-07T01:14:30+00:00"]


def test_divergence_14_a_day_long_gap_with_a_wildcard_hour() -> None:
    zone, after = "Pacific/Apia", "2011-12-29T12:00:00-10:00"
    assert cronsim_wall("0 * 30 12 *", zone, after) == "2011-12-30T00:00:00-10:00"
    their = theirs("0 * 30 12 *", zone, ms(after), 2)
    assert isinstance(their, list)
    assert local(their, zone) == ["2011-12-31T00:00:00+14:00", "2012-12-30T00:00:00+14:00"]
    assert ours("0 * 30 12 *", zone, ms(after), 2, missing="transition") == their
    shifted = local(ours("0 * 30 12 *", zone, ms(after), 25), zone)
    assert shifted[:24] == [f"2011-12-31T{h:02d}:00:00+14:00" for h in range(24)]
    assert shifted[24] == "2012-12-30T00:00:00+14:00"


def test_autumn_agreements() -> None:
    zone, after = "Europe/Berlin", ms("2026-10-24T12:00:00+02:00")
    fixed = theirs("30 2 * * *", zone, after, 2)
    assert isinstance(fixed, list)
    assert local(fixed, zone) == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    assert ours("30 2 * * *", zone, after, 2) == fixed
    assert ours("30 2 * * *", zone, after, 2, repeated="first") == fixed
    after = ms("2026-10-25T00:30:00+02:00")
    hourly = theirs("0 * * * *", zone, after, 4)
    assert isinstance(hourly, list)
    assert local(hourly, zone) == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    assert ours("0 * * * *", zone, after, 4) == hourly
    assert ours("0 * * * *", zone, after, 4, repeated="both") == hourly


def test_divergence_15_a_one_value_range_with_a_step() -> None:
    after = ms("2026-01-05T00:00:00+00:00")
    their = theirs("0 9-9/2 * * *", "UTC", after, 2)
    assert isinstance(their, list)
    cron_reads = ["2026-01-05T09:00:00+00:00", "2026-01-06T09:00:00+00:00"]
    # cronsim before 2.9 read the range as "from 9 on" (9, 11, 13, ...); 2.9 reads it as
    # cron(8) does. Either way, ours is cron(8)'s.
    assert local(their, "UTC") in (
        ["2026-01-05T09:00:00+00:00", "2026-01-05T11:00:00+00:00"],
        cron_reads,
    )
    assert local(ours("0 9-9/2 * * *", "UTC", after, 2), "UTC") == cron_reads
