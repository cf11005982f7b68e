"""Durations, instants and zones as users type them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine.domain.errors import InvalidInput
from engine.domain.timeutil import (
    format_duration,
    iso_local,
    iso_utc,
    parse_duration,
    parse_instant,
    zone,
)


def _ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, ms: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()) * 1000 + ms


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90", 90_000),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("1w", 604_800_000),
        ("250ms", 250),
        ("1m30s250ms", 90_250),
        ("0", 0),
    ],
)
def test_duration_is_parsed_to_milliseconds(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


def test_duration_bare_number_is_seconds() -> None:
    assert parse_duration("3600") == parse_duration("1h")


def test_duration_ignores_case_and_surrounding_space() -> None:
    assert parse_duration("  1H30M ") == 5_400_000


@pytest.mark.parametrize(
    "text", ["", "   ", "abc", "5x", "-5s", "1.5s", "s", "5 s", "m5", "5m5", "1h-30m", "+5s"]
)
def test_malformed_duration_is_rejected(text: str) -> None:
    with pytest.raises(InvalidInput, match="is not a duration"):
        parse_duration(text)


def test_duration_error_names_the_value_and_shows_examples() -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_duration("5x", what="jitter")
    message = str(raised.value)
    assert message.startswith("jitter '5x' is not a duration")
    assert "30s, 5m, 1h" in message


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (250, "250ms"),
        (1_000, "1s"),
        (90_000, "1m30s"),
        (3_600_000, "1h"),
        (5_400_000, "1h30m"),
        (172_800_000, "2d"),
        (90_061_001, "1d1h1m1s1ms"),
    ],
)
def test_duration_is_formatted_in_its_shortest_exact_spelling(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@pytest.mark.parametrize(
    "ms", [0, 1, 999, 1_000, 59_999, 60_000, 86_399_999, 86_400_000, 1_234_567_890, 7 * 86_400_000]
)
def test_formatted_duration_parses_back_to_itself(ms: int) -> None:
    assert parse_duration(format_duration(ms)) == ms


# --------------------------------------------------------------------------- instants


def test_instant_with_z_is_utc() -> None:
    assert parse_instant("2026-03-01T12:00:00Z") == _ms(2026, 3, 1, 12)


def test_instant_with_lowercase_z_is_utc() -> None:
    assert parse_instant("2026-03-01T12:00:00z") == _ms(2026, 3, 1, 12)


@pytest.mark.parametrize(
    ("text", "utc_hour", "utc_minute"),
    [
        ("2026-03-01T12:00:00+01:00", 11, 0),
        ("2026-03-01T12:00:00-05:00", 17, 0),
        ("2026-03-01T12:00:00+10:30", 1, 30),
        ("2026-03-01T12:00:00+00:00", 12, 0),
    ],
)
def test_instant_with_an_offset_is_that_offset(text: str, utc_hour: int, utc_minute: int) -> None:
    assert parse_instant(text) == _ms(2026, 3, 1, utc_hour, utc_minute)


def test_instant_keeps_milliseconds() -> None:
    assert parse_instant("2026-03-01T12:00:00.250Z") == _ms(2026, 3, 1, 12, ms=250)


def test_instant_with_an_offset_ignores_the_zone_argument() -> None:
    assert parse_instant("2026-03-01T12:00:00+01:00", "America/New_York") == _ms(2026, 3, 1, 11)


def test_naive_instant_is_read_in_the_given_zone() -> None:
    assert parse_instant("2026-01-15T09:00:00", "Europe/Berlin") == _ms(2026, 1, 15, 8)


def test_naive_instant_is_read_in_summer_time_when_in_force() -> None:
    assert parse_instant("2026-07-15T09:00:00", "Europe/Berlin") == _ms(2026, 7, 15, 7)


def test_naive_instant_defaults_to_utc() -> None:
    assert parse_instant("2026-01-15T09:00:00") == _ms(2026, 1, 15, 9)


def test_naive_instant_in_a_repeated_hour_is_refused_as_ambiguous() -> None:
    with pytest.raises(InvalidInput, match="ambiguous or does not exist"):
        parse_instant("2026-10-25T02:30:00", "Europe/Berlin")


def test_naive_instant_in_a_skipped_hour_is_refused_as_nonexistent() -> None:
    with pytest.raises(InvalidInput, match="ambiguous or does not exist"):
        parse_instant("2026-03-29T02:30:00", "Europe/Berlin")


def test_ambiguous_wall_time_with_an_offset_is_accepted() -> None:
    first = parse_instant("2026-10-25T02:30:00+02:00")
    second = parse_instant("2026-10-25T02:30:00+01:00")
    assert (first, second) == (_ms(2026, 10, 25, 0, 30), _ms(2026, 10, 25, 1, 30))


def test_dst_refusal_says_to_add_the_offset() -> None:
    with pytest.raises(InvalidInput, match=r"add the UTC offset"):
        parse_instant("2026-11-01T01:30:00", "America/New_York")


@pytest.mark.parametrize(
    "text", ["", "tomorrow", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "12:00", "now"]
)
def test_garbage_instant_is_rejected(text: str) -> None:
    with pytest.raises(InvalidInput, match="is not an instant: use ISO 8601"):
        parse_instant(text)


def test_naive_instant_in_an_unknown_zone_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="unknown time zone"):
        parse_instant("2026-01-15T09:00:00", "Mars/Olympus_Mons")


def test_local_iso_carries_the_offset_in_force() -> None:
    assert iso_local(_ms(2026, 10, 25, 0, 30), "Europe/Berlin") == "2026-10-25T02:30:00+02:00"
    assert iso_local(_ms(2026, 10, 25, 1, 30), "Europe/Berlin") == "2026-10-25T02:30:00+01:00"


def test_local_iso_shows_milliseconds_only_when_there_are_some() -> None:
    assert iso_local(_ms(2026, 1, 1, ms=250), "UTC") == "2026-01-01T00:00:00.250+00:00"


def test_utc_iso_ends_in_z() -> None:
    assert iso_utc(_ms(2026, 1, 1, 12)) == "2026-01-01T12:00:00Z"


# --------------------------------------------------------------------------- zones


@pytest.mark.parametrize(
    "name", ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
)
def test_known_zone_is_returned_by_its_iana_name(name: str) -> None:
    assert zone(name).key == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Mars/Olympus_Mons",
        "Europe/Berln",
        " Europe/Berlin",
        "Europe/Berlin ",
        "../etc/passwd",
        "/etc/localtime",
        "Europe/../UTC",
        "CEST+2",
    ],
)
def test_unknown_zone_is_rejected_with_an_example(name: str) -> None:
    with pytest.raises(InvalidInput, match=r"unknown time zone .*use an IANA name such as"):
        zone(name)
