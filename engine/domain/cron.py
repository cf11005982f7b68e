"""Cron expressions matched against local wall-clock times.

The parser is ours: a cron is a small grammar, and the library we used before read `9-9` as the
whole field, collapsed a seven-day list to `*` (which changes the day rule) and refused lists
mixing `#` or `L` with plain days in its own words. The search for the next matching wall time
is ours as well, on naive datetimes, so that no library's DST handling is involved. Turning a
wall time into an instant, under the schedule's DST rules, is the trigger's job (see `triggers`).

The grammar, field by field (names and letters in any case):

- `*` every value; `?` the same, in the two day fields only (a Quartz habit);
- `N`, `N-M` (inclusive, N <= M), `*/S`, `N-M/S`, `N/S` (from N to the field's end);
- day of month: `L` the last day, `LW` the last weekday (Mon-Fri), `NW` the weekday nearest the Nth
  without leaving the month;
- day of week: 0-7 or sun-sat (0 and 7 are Sunday), `D#k` the k-th weekday D of the month,
  `DL` or `LD` the last weekday D of the month;
- items of a field are a comma list, and any of them may be mixed (`1#2,5`, `L1,3`, `1,15,L`).

The day rule is cron(8)'s code, not only its manual's words: when the day-of-month or the
day-of-week field *starts with* `*` (or `?`), a day must match both; otherwise either.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache

from engine.domain.errors import InvalidInput

# The Gregorian calendar repeats every 400 years: a cron that matches no date in that span
# matches none ever (a fifth Wednesday in February can take 28 years to come round).
SEARCH_YEARS = 400
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
HINT = (
    "write 5 fields (minute hour day-of-month month day-of-week, e.g. '30 2 * * *') "
    "or 6 with seconds first (e.g. '*/10 * * * * *')"
)
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
LAST = -1  # the n of a "last weekday D of the month"
# Far more than any field can usefully list (60 minutes, each written out, is under 200).
MAX_LENGTH = 1_000


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] is the value low + i

    def value(self, token: str) -> int:
        """One number or name of this field."""
        lowered = token.lower()
        if lowered in self.names:
            return self.low + self.names.index(lowered)
        if not _is_number(token):
            named = f" or a name ({self.names[0]}-{self.names[-1]})" if self.names else ""
            raise _Bad(f"{self.name} {token!r} is not a number{named}")
        number = int(token)
        if not self.low <= number <= self.high:
            raise _Bad(f"{self.name} {number} is out of range {self.low}-{self.high}")
        return number


SECOND = _Field("second", 0, 59)
MINUTE = _Field("minute", 0, 59)
HOUR = _Field("hour", 0, 23)
DAY = _Field("day of month", 1, 31)
MONTH = _Field("month", 1, 12, MONTH_NAMES)
# 7 is Sunday as well as 0, as in cron(8); names map onto 0-6.
WEEKDAY = _Field("day of week", 0, 7, WEEKDAY_NAMES)


class _Bad(Exception):
    """A problem with one field, turned into InvalidInput naming the whole expression."""


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed cron expression: the allowed values of each field.

    `days` and `weekdays` are None when the field allows every value with no extras; the day
    rule is `day_and` (either field starts with `*`: both must match) or else OR.
    """

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...] | None  # plain days of the month; None: any
    last_day: bool  # 'L' in day-of-month
    months: tuple[int, ...]
    weekdays: tuple[int, ...] | None  # plain weekdays, cron numbering, 0 = Sunday; None: any
    nth_weekdays: tuple[tuple[int, int], ...]  # (weekday, n) with n = LAST for 'last'
    last_weekday: bool = False  # 'LW' in day-of-month
    nearest_weekdays: tuple[int, ...] = ()  # 'NW' in day-of-month
    day_and: bool = True
    # The seconds (6 fields), minute or hour field starts with '*': cron(8) calls such a job a
    # wildcard job and runs it by elapsed time across a repeated hour (RepeatedHour.AUTO).
    wildcard_time: bool = False
    six_fields: bool = False

    def next_wall(self, after: datetime) -> datetime | None:
        """The first wall time strictly after `after` (naive) that matches, or None."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        if self.seconds == (0,) and t.second:
            t = t.replace(second=0) + timedelta(minutes=1)
        # datetime ends with year 9999: the search stops a year short of it.
        limit = min(after.year + SEARCH_YEARS, 9998)
        while t.year <= limit:
            if t.month not in self.months:
                i = bisect_right(self.months, t.month)
                t = (
                    datetime(t.year, self.months[i], 1)
                    if i < len(self.months)
                    else datetime(t.year + 1, self.months[0], 1)
                )
                continue
            if not self.day_matches(t.date()):
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

    def matches(self, wall: datetime) -> bool:
        """Whether a wall time (naive, whole seconds) is one the cron names."""
        return (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_matches(wall.date())
        )

    def day_matches(self, day: date) -> bool:
        if self.day_and:
            return self._dom_matches(day) and self._dow_matches(day)
        return self._dom_matches(day) or self._dow_matches(day)

    def _dom_matches(self, day: date) -> bool:
        if self.days is None:
            return True
        if day.day in self.days:
            return True
        if not (self.last_day or self.last_weekday or self.nearest_weekdays):
            return False
        length = calendar.monthrange(day.year, day.month)[1]
        if self.last_day and day.day == length:
            return True
        if self.last_weekday and day.day == _nearest_weekday(day.year, day.month, length, length):
            return True
        return any(
            n <= length and day.day == _nearest_weekday(day.year, day.month, n, length)
            for n in self.nearest_weekdays
        )

    def _dow_matches(self, day: date) -> bool:
        if self.weekdays is None:
            return True
        weekday = (day.weekday() + 1) % 7
        if weekday in self.weekdays:
            return True
        for wanted, n in self.nth_weekdays:
            if weekday != wanted:
                continue
            if n == LAST:
                if day.day + 7 > calendar.monthrange(day.year, day.month)[1]:
                    return True
            elif (day.day - 1) // 7 + 1 == n:
                return True
        return False


def _nearest_weekday(year: int, month: int, n: int, length: int) -> int:
    """The Mon-Fri day nearest the `n`th of the month, never leaving it (Quartz's `nW`)."""
    weekday = date(year, month, n).weekday()  # Monday 0 .. Sunday 6
    if weekday == 5:  # Saturday: the Friday before, or the Monday after on the 1st
        return n - 1 if n > 1 else n + 2
    if weekday == 6:  # Sunday: the Monday after, or the Friday before on the last day
        return n + 1 if n < length else n - 2
    return n


def _is_number(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also takes '³' and '٣', which `int` then refuses."""
    return text.isascii() and text.isdigit()


def _backwards_hint(field: _Field, low: str, high: str, step: str) -> str:
    """`23-1` in the hour field: write `23,0-1`. Names stay names; a step stays on both."""
    if field is WEEKDAY and low == "7":  # Sunday, which is also 0: `7-1` is `0-1`
        return "0" if high == "0" else f"0-{high}{step}"
    named = not _is_number(low)
    top = field.high if field is not WEEKDAY else 6
    end = field.names[top - field.low] if named else str(top)
    start = field.names[0] if named else str(field.low)
    first = low if low.lower() == end else f"{low}-{end}{step}"
    second = high if high.lower() == start else f"{start}-{high}{step}"
    return f"{first},{second}"


def _range(field: _Field, text: str, step: str = "") -> tuple[int, int]:
    """The bounds of `*`, `N` or `N-M` (one value N gives (N, N)); `step` ('/S' or '') only
    for the hint of a backwards range."""
    if text == "*":
        return field.low, field.high
    if text.startswith("-"):
        raise _Bad(f"{field.name} {text!r}: values are never negative")
    low_text, dash, high_text = text.partition("-")
    low = field.value(low_text)
    if not dash:
        return low, low
    high = field.value(high_text)
    if field is WEEKDAY and high == 0 and low > 0 and not high_text.isdigit():
        high = 7  # `mon-sun`: the week as people write it ends on Sunday, which 7 also is
    if low > high:
        raise _Bad(
            f"the range {text} runs backwards; cron ranges do not wrap: write "
            f"{_backwards_hint(field, low_text, high_text, step)}"
        )
    return low, high


def _plain(field: _Field, item: str) -> set[int]:
    """One item without letters: `*`, `N`, `N-M`, `*/S`, `N-M/S`, `N/S`."""
    if item == "":
        raise _Bad(f"an empty item in the {field.name} field (two commas, or one at an end)")
    base, slash, step_text = item.partition("/")
    if not slash:
        low, high = _range(field, base)
        return set(range(low, high + 1))
    if not _is_number(step_text) or int(step_text) == 0:
        raise _Bad(f"the step in {item!r} must be a whole number of at least 1")
    low, high = _range(field, base, f"/{step_text}")
    if base != "*" and "-" not in base:
        high = field.high  # N/S: from N to the end of the field, as croniter and cronsim read it
    return set(range(low, high + 1, int(step_text)))


def _days(text: str) -> tuple[set[int], bool, bool, set[int]]:
    """Day of month: plain days, 'L', 'LW', and the days of 'NW'."""
    days: set[int] = set()
    last = last_weekday = False
    nearest: set[int] = set()
    for item in text.split(","):
        upper = item.upper()
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif upper.endswith("W") and _is_number(upper[:-1]):
            nearest.add(DAY.value(upper[:-1]))
        elif upper.startswith("L"):
            raise _Bad(f"{item!r}: the day of month takes 'L' (last day) or 'LW' (last weekday)")
        elif "W" in upper:
            raise _Bad(f"{item!r}: 'W' follows one day, e.g. 15W (the weekday nearest the 15th)")
        else:
            days |= _plain(DAY, "*" if item == "?" else item)
    return days, last, last_weekday, nearest


def _weekdays(text: str) -> tuple[set[int], set[tuple[int, int]]]:
    """Day of week: plain weekdays (0-6) and (weekday, n) for 'D#k', 'DL' and 'LD'."""
    plain: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in text.split(","):
        upper = item.upper()
        if "#" in item:
            day_text, _, n_text = item.partition("#")
            if not _is_number(n_text) or not 1 <= int(n_text) <= 5:
                raise _Bad(f"{item!r}: the n of D#n is 1 to 5 (a month has at most five)")
            nth.add((WEEKDAY.value(day_text) % 7, int(n_text)))
        elif upper == "L":
            raise _Bad(
                "'L' alone in the day of week is ambiguous: write 5L or L5 for the last Friday"
            )
        elif len(item) > 1 and upper.endswith("L"):  # no weekday name ends with an L
            nth.add((WEEKDAY.value(item[:-1]) % 7, LAST))
        elif len(item) > 1 and upper.startswith("L"):  # croniter's spelling, and none begins so
            nth.add((WEEKDAY.value(item[1:]) % 7, LAST))
        else:
            plain |= {v % 7 for v in _plain(WEEKDAY, "*" if item == "?" else item)}
    return plain, nth


def _refuse_hashed(field: str) -> None:
    if "H" in field.upper().replace("THU", ""):
        raise _Bad("'H' (a hashed value) is not supported: pick the value yourself")


@lru_cache(maxsize=4096)
def parse_cron(expression: str) -> CronSpec:
    """Parse a 5-field cron, or a 6-field one with seconds first. Raises InvalidInput."""
    if len(expression) > MAX_LENGTH:
        raise InvalidInput(
            f"malformed cron: {len(expression):,} characters is too long (at most "
            f"{MAX_LENGTH}); {HINT}"
        )
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise InvalidInput(
                f"malformed cron {expression!r}: unknown alias (known: {', '.join(ALIASES)}); "
                f"or {HINT}"
            )
        fields = ALIASES[text.lower()].split(" ")
    else:
        fields = text.split(" ")
    if len(fields) not in (5, 6) or "\n" in expression.strip():
        raise InvalidInput(f"malformed cron {expression!r}: {HINT}")
    six = len(fields) == 6
    second_text = fields[0] if six else "0"
    minute_text, hour_text, day_text, month_text, weekday_text = fields[1:] if six else fields
    try:
        for field in fields:
            _refuse_hashed(field)
        seconds = _plain_list(SECOND, second_text)
        minutes = _plain_list(MINUTE, minute_text)
        hours = _plain_list(HOUR, hour_text)
        months = _plain_list(MONTH, month_text)
        days, last, last_weekday, nearest = _days(day_text)
        plain_weekdays, nth = _weekdays(weekday_text)
    except _Bad as bad:
        raise InvalidInput(f"malformed cron {expression!r}: {bad}") from None
    day_star = day_text.startswith(("*", "?"))
    weekday_star = weekday_text.startswith(("*", "?"))
    every_day = days == set(range(1, 32)) and not (last or last_weekday or nearest)
    every_weekday = plain_weekdays == set(range(7))
    time_fields = (second_text, minute_text, hour_text) if six else (minute_text, hour_text)
    return CronSpec(
        expression=text,
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        days=None if every_day else tuple(sorted(days)),
        last_day=last,
        months=months,
        weekdays=None if every_weekday else tuple(sorted(plain_weekdays)),
        nth_weekdays=tuple(sorted(nth)),
        last_weekday=last_weekday,
        nearest_weekdays=tuple(sorted(nearest)),
        day_and=day_star or weekday_star,
        wildcard_time=any(t.startswith("*") for t in time_fields),
        six_fields=six,
    )


def _plain_list(field: _Field, text: str) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        values |= _plain(field, item)
    return tuple(sorted(values))
