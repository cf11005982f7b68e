"""Instants, zones and durations as users type them and as the engine stores them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.domain.errors import InvalidInput

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DURATION_MAX_MS = 3660 * DAY_MS  # ten years: longer is a typo, and would overflow dates
# Instants users may give: the epoch up to the year 3000 (far enough, and every zone converts).
INSTANT_MIN = datetime(1970, 1, 1, tzinfo=UTC)
INSTANT_MAX = datetime(3000, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)

_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": SECOND_MS, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS, "w": 7 * DAY_MS}


@lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone called `name`, or a clear error. Cached: zone objects are immutable."""
    if not name or name != name.strip() or ".." in name or name.startswith("/"):
        raise InvalidInput(f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin or UTC"
        ) from None


def parse_duration(text: str, *, what: str = "duration", longest_ms: int = DURATION_MAX_MS) -> int:
    """`90`, `30s`, `5m`, `1h`, `1h30m`, `1d`, `250ms` to milliseconds. A bare number is seconds.
    One longer than `longest_ms` is refused, naming that bound."""
    raw = text.strip().lower()
    value: int | None = None
    if re.fullmatch(r"\d+", raw):
        value = int(raw) * SECOND_MS
    elif raw and _DURATION_PART.sub("", raw) == "" and _DURATION_PART.match(raw):
        value = sum(int(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(raw))
    if value is not None:
        if value > longest_ms:
            raise InvalidInput(
                f"{what} {text!r} is too long: at most {format_duration(longest_ms)}"
            )
        return value
    raise InvalidInput(
        f"{what} {text!r} is not a duration: write seconds (90) or a number with a unit "
        "(30s, 5m, 1h, 1h30m, 2d)"
    )


def format_duration(ms: int) -> str:
    """The shortest exact spelling of a duration: 90000 -> '1m30s'."""
    if ms == 0:
        return "0s"
    parts = []
    rest = ms
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    if rest:
        parts.append(f"{rest}ms")
    return "".join(parts)


def parse_instant(text: str, tz: str = "UTC") -> int:
    """An ISO-8601 instant to milliseconds. Without an offset it is read in the zone `tz`.

    A wall time that a DST transition makes ambiguous or skipped is refused rather than guessed.
    """
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(
            f"{text!r} is not an instant: use ISO 8601, e.g. 2026-12-01T09:00:00+01:00 "
            "or 2026-12-01T08:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        local = zone(tz)
        first = parsed.replace(tzinfo=local, fold=0)
        second = parsed.replace(tzinfo=local, fold=1)
        if first.utcoffset() != second.utcoffset():
            raise InvalidInput(
                f"{text!r} is ambiguous or does not exist in {tz} (a DST transition): "
                "add the UTC offset, e.g. +01:00"
            )
        parsed = first
    if not INSTANT_MIN <= parsed < INSTANT_MAX:
        raise InvalidInput(f"{text!r} is out of range: give an instant from 1970 to 2999")
    return to_ms(parsed)


def to_ms(moment: datetime) -> int:
    """An aware datetime to epoch milliseconds."""
    return (moment - _EPOCH) // _ONE_MS


def utc(ms: int) -> datetime:
    """Epoch milliseconds to an aware UTC datetime (exact: no float seconds in between)."""
    return _EPOCH + timedelta(milliseconds=ms)


def local(ms: int, tz: str) -> datetime:
    """Epoch milliseconds to an aware datetime in the zone `tz`."""
    return utc(ms).astimezone(zone(tz))


def iso_local(ms: int, tz: str) -> str:
    """The instant in its zone with its offset, to the second or the millisecond."""
    moment = local(ms, tz)
    return moment.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")


def iso_utc(ms: int) -> str:
    moment = utc(ms)
    text = moment.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")
