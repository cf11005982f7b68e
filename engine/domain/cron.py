"""Cron expressions matched against local wall-clock times.

croniter parses and validates the fields; the search for the next matching wall time is ours, on
naive datetimes, so that no library's DST handling is involved. Turning a wall time into an
instant, under the schedule's DST rules, is the trigger's job (see `triggers`).
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from croniter import croniter
from croniter.croniter import CroniterError

from engine.domain.errors import InvalidInput

_ALL_SECONDS = tuple(range(60))
_ALL_MINUTES = tuple(range(60))
_ALL_HOURS = tuple(range(24))
_ALL_MONTHS = tuple(range(1, 13))
# The Gregorian calendar repeats every 400 years: a cron that matches no date in that span
# matches none ever (a fifth Wednesday in February can take 28 years to come round).
_SEARCH_YEARS = 400
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_RANGE = re.compile(r"(\d+)-(\d+)")


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed cron expression: the allowed values of each field.

    5 fields: minute hour day-of-month month day-of-week. 6 fields: seconds first, then the five.
    Day-of-month and day-of-week follow Vixie cron: when both are restricted, either may match.
    """

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...] | None  # None: any day of the month
    last_day: bool  # 'L' in day-of-month
    months: tuple[int, ...]
    weekdays: tuple[int, ...] | None  # cron numbering, 0 = Sunday; None: any
    nth_weekdays: tuple[tuple[int, int], ...]  # (weekday, n) with n = -1 for 'last'

    def next_wall(self, after: datetime) -> datetime | None:
        """The first wall time strictly after `after` (naive) that matches, or None."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        if self.seconds == (0,) and t.second:
            t = t.replace(second=0) + timedelta(minutes=1)
        limit = after.year + _SEARCH_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                i = bisect_right(self.months, t.month)
                t = (
                    datetime(t.year, self.months[i], 1)
                    if i < len(self.months)
                    else datetime(t.year + 1, self.months[0], 1)
                )
                continue
            if not self._day_matches(t.date()):
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                continue
            if t.hour not in self.hours:
                i = bisect_right(self.hours, t.hour)
                if i == len(self.hours):
                    t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                else:
                    t = t.replace(hour=self.hours[i], minute=0, second=0)
                continue
            if t.minute not in self.minutes:
                i = bisect_right(self.minutes, t.minute)
                if i == len(self.minutes):
                    t = t.replace(minute=0, second=0) + timedelta(hours=1)
                else:
                    t = t.replace(minute=self.minutes[i], second=0)
                continue
            if t.second not in self.seconds:
                i = bisect_left(self.seconds, t.second)
                if i == len(self.seconds):
                    t = t.replace(second=0) + timedelta(minutes=1)
                else:
                    t = t.replace(second=self.seconds[i])
                continue
            return t
        return None

    def _day_matches(self, day: date) -> bool:
        dom_restricted = self.days is not None or self.last_day
        dow_restricted = self.weekdays is not None or bool(self.nth_weekdays)
        if not dom_restricted and not dow_restricted:
            return True
        if dom_restricted and dow_restricted:
            return self._dom_matches(day) or self._dow_matches(day)
        return self._dom_matches(day) if dom_restricted else self._dow_matches(day)

    def _dom_matches(self, day: date) -> bool:
        if self.last_day and day.day == calendar.monthrange(day.year, day.month)[1]:
            return True
        return self.days is not None and day.day in self.days

    def _dow_matches(self, day: date) -> bool:
        weekday = (day.weekday() + 1) % 7
        if self.weekdays is not None and weekday in self.weekdays and not self.nth_weekdays:
            return True
        for wanted, n in self.nth_weekdays:
            if weekday != wanted:
                continue
            if n == -1:
                if day.day + 7 > calendar.monthrange(day.year, day.month)[1]:
                    return True
            elif (day.day - 1) // 7 + 1 == n:
                return True
        return False


def parse_cron(expression: str) -> CronSpec:
    """Parse a 5-field cron, or a 6-field one with seconds first. Raises InvalidInput."""
    text = " ".join(expression.split())
    hint = (
        "write 5 fields (minute hour day-of-month month day-of-week, e.g. '30 2 * * *') "
        "or 6 with seconds first (e.g. '*/10 * * * * *')"
    )
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise InvalidInput(
                f"malformed cron {expression!r}: unknown alias (known: {', '.join(ALIASES)}); "
                f"or {hint}"
            )
        fields = ALIASES[text.lower()].split(" ")
    else:
        fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise InvalidInput(f"malformed cron {expression!r}: {hint}")
    for field in fields:
        # croniter silently drops 'W' and needs an id for 'H': refuse rather than misfire.
        bare = field.upper()
        for name in ("WED", "THU"):
            bare = bare.replace(name, "")
        if "W" in bare or "H" in bare:
            raise InvalidInput(
                f"malformed cron {expression!r}: 'W' (nearest weekday) and 'H' (hashed) are "
                "not supported"
            )
        for low, high in _RANGE.findall(field):
            if int(low) > int(high):
                raise InvalidInput(
                    f"malformed cron {expression!r}: the range {low}-{high} runs backwards; "
                    f"write it as two ranges, e.g. {low}-59,0-{high}"
                )
    croniter_form = " ".join([*fields[1:], fields[0]]) if len(fields) == 6 else " ".join(fields)
    try:
        expanded, nth = croniter.expand(croniter_form)
    except (CroniterError, ValueError, KeyError, IndexError, TypeError) as exc:
        detail = str(exc).replace(croniter_form, " ".join(fields))  # our field order, not theirs
        raise InvalidInput(f"malformed cron {expression!r}: {detail}; {hint}") from None
    minutes, hours, doms, months, dows = expanded[:5]
    seconds: Sequence[int | str] = expanded[5] if len(expanded) > 5 else [0]

    def values(field: Sequence[int | str], everything: tuple[int, ...]) -> tuple[int, ...]:
        if list(field) == ["*"]:
            return everything
        return tuple(sorted({int(v) for v in field}))

    day_values = [v for v in doms if v not in ("*", "l")]
    nth_weekdays: list[tuple[int, int]] = []
    for weekday, ns in nth.items():
        for n in ns:
            nth_weekdays.append((int(weekday) % 7, -1 if n == "l" else int(n)))
    plain_weekdays = None
    if dows != ["*"]:
        plain_weekdays = tuple(sorted({int(v) % 7 for v in dows if v != "*"}))
    return CronSpec(
        expression=text,
        seconds=values(seconds, _ALL_SECONDS),
        minutes=values(minutes, _ALL_MINUTES),
        hours=values(hours, _ALL_HOURS),
        days=tuple(sorted({int(v) for v in day_values})) if day_values else None,
        last_day="l" in doms,
        months=values(months, _ALL_MONTHS),
        weekdays=None if nth_weekdays else plain_weekdays,
        nth_weekdays=tuple(sorted(nth_weekdays)),
    )
