"""A brute-force reference for cron slots, written from /work/notes/cron-spec.md alone.

Nothing here comes from engine/: the parser, the day rule, the zone model and the DST rules
are written again, as plainly as possible, so that a test comparing the two catches a mistake
in either. Only the standard library is used; UTC offsets come from `zoneinfo` (the one
ground truth both sides must share).

The model, in three definitions:

- a *wall time* is a naive local time, counted here in whole seconds since 1970-01-01 00:00 as
  if it were UTC ("wall seconds");
- the *passes* of a wall time w are every instant t (epoch seconds) whose local time is w, that
  is t + offset(t) == w. A wall time has 1 pass normally, 2 when the clock goes back over it
  (the first pass is the earlier instant), 0 when the clock jumps over it (a gap);
- the *slots* of a cron are the union, over its matching wall times, of the instants the DST
  rules give each one (`slot_instants`). A slot is an instant: two wall times that give the
  same instant are one slot.

`oracle_next` is the least slot strictly after an instant. It walks the time line one stretch
of constant offset at a time: within a stretch, the passes are the wall times read at that
offset, in order, so the first allowed one is the stretch's earliest real slot; the gap a
transition opens adds its shifted (or transition-instant) slots, all at or after that
transition. The answer is found when the best slot so far is before the next stretch begins.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

HOUR = 3600
DAY = 86400
# Every UTC offset in use since 1970 is within -12:00 .. +14:00 (checked in `Zone.offset`).
MIN_OFFSET = -12 * HOUR
MAX_OFFSET = 14 * HOUR
# The widest gap since 1970 is a day (Apia, Kiritimati, Kwajalein): its shifted wall times
# land at most that far after the transition.
WIDEST_GAP = 26 * HOUR
# Zone transitions are found by reading the offset every hour and bisecting a change (no zone
# has had two transitions within an hour of each other since 1970; see /work/notes/O.md).
SCAN_STEP = HOUR

FIRST, LAST, BOTH, AUTO = "first", "last", "both", "auto"
SHIFT, SKIP, TRANSITION = "shift", "skip", "transition"
REPEATED_RULES = (FIRST, LAST, BOTH, AUTO)
MISSING_RULES = (SHIFT, SKIP, TRANSITION)

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
SECOND, MINUTE, HOUR_F, DOM, MONTH, DOW = (
    "second",
    "minute",
    "hour",
    "day-of-month",
    "month",
    "day-of-week",
)
BOUNDS = {
    SECOND: (0, 59),
    MINUTE: (0, 59),
    HOUR_F: (0, 23),
    DOM: (1, 31),
    MONTH: (1, 12),
    DOW: (0, 7),
}
MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
DAY_NAMES = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


class CronRefused(ValueError):
    """The expression is not in the grammar."""


# ------------------------------------------------------------------------------- parsing


def _number(text: str, field: str) -> int:
    names = MONTH_NAMES if field == MONTH else DAY_NAMES if field == DOW else {}
    if text in names:
        return names[text]
    if not (text.isascii() and text.isdigit()):
        raise CronRefused(f"{field}: {text!r} is not a number")
    value = int(text)
    low, high = BOUNDS[field]
    if not low <= value <= high:
        raise CronRefused(f"{field}: {value} is outside {low}-{high}")
    return value


def _values(item: str, field: str) -> set[int]:
    """The values of one plain item: *, N, N-M, */S, N-M/S, N/S (and ? in the day fields)."""
    low, high = BOUNDS[field]
    if item == "?" and field in (DOM, DOW):
        return set(range(low, high + 1))
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not (step_text.isascii() and step_text.isdigit()) or int(step_text) < 1:
            raise CronRefused(f"{field}: bad step {step_text!r}")
        step = int(step_text)
    if base == "*":
        first, last = low, high
    elif "-" in base:
        start, _, end = base.partition("-")
        first, last = _number(start, field), _number(end, field)
        if field == DOW and end == "sun" and first > 0:
            last = 7  # `mon-sun` is all week (the spec's example); Sunday is also 7
        if first > last:
            raise CronRefused(f"{field}: the range {base} runs backwards")
    else:
        first = _number(base, field)
        last = high if slash else first
    return set(range(first, last + 1, step))


DomItem = tuple[str, int]  # ("day", n) | ("last", 0) | ("last-weekday", 0) | ("nearest", n)
DowItem = tuple[str, int, int]  # ("weekday", d, 0) | ("nth", d, k) | ("last", d, 0)


def _items(field_text: str, field: str) -> list[str]:
    items = field_text.split(",")
    if any(not item for item in items):
        raise CronRefused(f"{field}: empty item in {field_text!r}")
    return items


def _dom_items(text: str) -> tuple[DomItem, ...]:
    out: list[DomItem] = []
    for item in _items(text, DOM):
        if item == "l":
            out.append(("last", 0))
        elif item == "lw":
            out.append(("last-weekday", 0))
        elif re.fullmatch(r"[0-9]+w", item):
            out.append(("nearest", _number(item[:-1], DOM)))
        else:
            out.extend(("day", v) for v in sorted(_values(item, DOM)))
    return tuple(out)


def _dow_items(text: str) -> tuple[DowItem, ...]:
    out: list[DowItem] = []
    for item in _items(text, DOW):
        if "#" in item:
            day, _, nth = item.partition("#")
            if nth not in ("1", "2", "3", "4", "5"):
                raise CronRefused(f"{DOW}: bad #{nth}")
            out.append(("nth", _number(day, DOW) % 7, int(nth)))
        elif len(item) > 1 and item.endswith("l"):
            out.append(("last", _number(item[:-1], DOW) % 7, 0))
        elif len(item) > 1 and item.startswith("l"):
            out.append(("last", _number(item[1:], DOW) % 7, 0))
        else:
            out.extend(("weekday", v % 7, 0) for v in sorted(_values(item, DOW)))
    return tuple(out)


@dataclass(frozen=True)
class OracleCron:
    """A parsed cron: the allowed values of the time fields and the day items."""

    fields: tuple[str, ...]  # six texts, seconds first ("0" for a 5-field cron)
    six: bool
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    dom: tuple[DomItem, ...]
    dow: tuple[DowItem, ...]
    day_and: bool  # a day field starts with * (or ?): both must match
    wildcard: bool  # seconds (6-field), minute or hour starts with *: `auto` fires both passes

    def day_matches(self, day: date) -> bool:
        dom = any(_dom_match(item, day) for item in self.dom)
        dow = any(_dow_match(item, day) for item in self.dow)
        return (dom and dow) if self.day_and else (dom or dow)

    def matches(self, wall: int) -> bool:
        """Whether a wall time (wall seconds) is one the cron names."""
        day, rest = divmod(wall, DAY)
        today = EPOCH + timedelta(days=day)
        hour, rest = divmod(rest, HOUR)
        minute, second = divmod(rest, 60)
        return (
            today.month in self.months
            and self.day_matches(today)
            and hour in self.hours
            and minute in self.minutes
            and second in self.seconds
        )


def parse(expression: str) -> OracleCron:
    """Parse a cron of the spec's grammar, or raise CronRefused."""
    text = expression.strip().lower()
    if text.startswith("@"):
        if text not in ALIASES:
            raise CronRefused(f"unknown alias {text!r}")
        text = ALIASES[text]
    parts = text.split()
    if len(parts) not in (5, 6):
        raise CronRefused(f"{len(parts)} fields")
    six = len(parts) == 6
    if not six:
        parts.insert(0, "0")
    if any("h" in part for part in parts[:5]) or "h" in parts[5].replace("thu", ""):
        raise CronRefused("H (hashed) is refused")
    sec, minute, hour, dom, month, dow = parts

    def plain(field_text: str, field: str) -> tuple[int, ...]:
        values: set[int] = set()
        for item in _items(field_text, field):
            values |= _values(item, field)
        return tuple(sorted(values))

    starts_star = (sec.startswith("*") and six) or minute.startswith("*") or hour.startswith("*")
    return OracleCron(
        fields=tuple(parts),
        six=six,
        seconds=plain(sec, SECOND),
        minutes=plain(minute, MINUTE),
        hours=plain(hour, HOUR_F),
        months=frozenset(plain(month, MONTH)),
        dom=_dom_items(dom),
        dow=_dow_items(dow),
        day_and=dom.startswith(("*", "?")) or dow.startswith(("*", "?")),
        wildcard=starts_star,
    )


def _last_day(day: date) -> int:
    return calendar.monthrange(day.year, day.month)[1]


def _cron_weekday(day: date) -> int:
    """0 = Sunday ... 6 = Saturday."""
    return (day.weekday() + 1) % 7


def nearest_weekday(year: int, month: int, n: int) -> int | None:
    """The day `NW` names in a month: the Mon-Fri day nearest day n, never leaving the month;
    None when the month has no day n."""
    last = calendar.monthrange(year, month)[1]
    if n > last:
        return None
    weekday = date(year, month, n).weekday()  # Monday = 0
    if weekday == 5:  # Saturday: the Friday before, unless that is last month
        return n - 1 if n > 1 else n + 2
    if weekday == 6:  # Sunday: the Monday after, unless that is next month
        return n + 1 if n < last else n - 2
    return n


def last_weekday(year: int, month: int) -> int:
    day = calendar.monthrange(year, month)[1]
    while date(year, month, day).weekday() >= 5:
        day -= 1
    return day


def _dom_match(item: DomItem, day: date) -> bool:
    kind, n = item
    if kind == "day":
        return day.day == n
    if kind == "last":
        return day.day == _last_day(day)
    if kind == "last-weekday":
        return day.day == last_weekday(day.year, day.month)
    return day.day == nearest_weekday(day.year, day.month, n)


def _dow_match(item: DowItem, day: date) -> bool:
    kind, weekday, nth = item
    if _cron_weekday(day) != weekday:
        return False
    if kind == "weekday":
        return True
    if kind == "nth":
        return (day.day - 1) // 7 + 1 == nth
    return day.day + 7 > _last_day(day)  # the last one: a week later is next month


# ------------------------------------------------------------------------------ wall times

EPOCH = date(1970, 1, 1)


def wall_date(wall: int) -> date:
    return EPOCH + timedelta(days=wall // DAY)


def wall_text(wall: int) -> str:
    return (datetime(1970, 1, 1) + timedelta(seconds=wall)).isoformat()


def matching_walls(cron: OracleCron, low: int, high: int) -> Iterator[int]:
    """Every wall time in [low, high) the cron matches, in order."""
    day = low // DAY
    while day * DAY < high:
        today = EPOCH + timedelta(days=day)
        if today.month not in cron.months:
            # Straight to the 1st of the next month.
            following = date(today.year + today.month // 12, today.month % 12 + 1, 1)
            day = (following - EPOCH).days
            continue
        if cron.day_matches(today):
            base = day * DAY
            for hour in cron.hours:
                at_hour = base + hour * HOUR
                if at_hour + HOUR <= low:
                    continue
                for minute in cron.minutes:
                    at_minute = at_hour + minute * 60
                    if at_minute + 60 <= low:
                        continue
                    for second in cron.seconds:
                        wall = at_minute + second
                        if wall >= high:
                            return
                        if wall >= low:
                            yield wall
        day += 1


# ------------------------------------------------------------------------------------ zones


@dataclass(frozen=True)
class Transition:
    at: int  # the first instant (epoch seconds) with the new offset
    before: int  # offset before, seconds
    after: int  # offset after

    @property
    def is_gap(self) -> bool:
        return self.after > self.before


class Zone:
    """A zone's offsets (from zoneinfo) and its transitions, found by hourly sampling."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.tz = ZoneInfo(key)
        self._years: dict[int, list[Transition]] = {}

    def offset(self, instant: int) -> int:
        delta = datetime.fromtimestamp(instant, self.tz).utcoffset()
        assert delta is not None
        seconds = int(delta.total_seconds())
        assert MIN_OFFSET <= seconds <= MAX_OFFSET, (self.key, instant, seconds)
        return seconds

    def wall(self, instant: int) -> int:
        return instant + self.offset(instant)

    def year_transitions(self, year: int) -> list[Transition]:
        """The transitions at instants in [year-01-01, next year-01-01) UTC."""
        found = self._years.get(year)
        if found is not None:
            return found
        start = calendar.timegm((year, 1, 1, 0, 0, 0))
        end = calendar.timegm((year + 1, 1, 1, 0, 0, 0))
        found = []
        here = start - 1
        here_offset = self.offset(here)
        while here < end - 1:
            there = min(here + SCAN_STEP, end - 1)
            there_offset = self.offset(there)
            if there_offset == here_offset:
                here = there
                continue
            low, high = here, there  # offset(low) == here_offset != offset(high)
            while high - low > 1:
                middle = (low + high) // 2
                if self.offset(middle) == here_offset:
                    low = middle
                else:
                    high = middle
            found.append(Transition(high, here_offset, self.offset(high)))
            here, here_offset = high, self.offset(high)  # look on from it: another may follow
        self._years[year] = found
        return found

    def transitions(self, low: int, high: int) -> list[Transition]:
        """The transitions at instants in [low, high)."""
        out: list[Transition] = []
        for year in range(_year(low), _year(high) + 1):
            out.extend(t for t in self.year_transitions(year) if low <= t.at < high)
        return out

    def next_transition(self, after: int, limit: int) -> Transition | None:
        """The first transition at an instant in (after, limit)."""
        for year in range(_year(after), _year(limit) + 1):
            for t in self.year_transitions(year):
                if after < t.at < limit:
                    return t
        return None


def _year(instant: int) -> int:
    return wall_date(instant).year


_zones: dict[str, Zone] = {}


def zone_of(key: str) -> Zone:
    if key not in _zones:
        _zones[key] = Zone(key)
    return _zones[key]


# -------------------------------------------------------------------------------- the rules


def passes(zone: Zone, wall: int) -> list[int]:
    """Every instant whose local time is `wall`, earliest first (by definition: t + offset(t)
    == wall; such a t is within the offset bounds of `wall`, and its offset is one in force
    somewhere in that window)."""
    low, high = wall - MAX_OFFSET - HOUR, wall - MIN_OFFSET + HOUR
    offsets = {zone.offset(low)} | {t.after for t in zone.transitions(low, high)}
    return sorted(wall - o for o in offsets if zone.offset(wall - o) == o)


def gap_of(zone: Zone, wall: int) -> Transition:
    """The spring transition whose gap holds a wall time that has no pass."""
    low, high = wall - MAX_OFFSET - HOUR, wall - MIN_OFFSET + HOUR
    found = [t for t in zone.transitions(low, high) if t.at + t.before <= wall < t.at + t.after]
    assert len(found) == 1, (zone.key, wall_text(wall), found)
    return found[0]


def slot_instants(
    cron: OracleCron, zone: Zone, wall: int, repeated: str, missing: str
) -> list[int]:
    """The instants one matching wall time stands for under the DST rules."""
    assert repeated in REPEATED_RULES, repeated
    assert missing in MISSING_RULES, missing
    found = passes(zone, wall)
    if len(found) == 1:
        return found
    if found:  # repeated: the clock went back over this wall time
        if repeated == BOTH or (repeated == AUTO and cron.wildcard):
            return found
        if repeated == LAST:
            return [found[-1]]
        return [found[0]]  # first; auto for a cron that names its hour and minute
    gap = gap_of(zone, wall)
    if missing == SKIP:
        return []
    if missing == SHIFT:
        return [wall - gap.before]  # the wall time plus the gap: read at the old offset
    return [gap.at]  # transition


def _allowed(cron: OracleCron, zone: Zone, wall: int, instant: int, repeated: str) -> bool:
    """Whether the pass of `wall` at `instant` is a slot (gaps do not come here)."""
    found = passes(zone, wall)
    assert instant in found, (zone.key, wall_text(wall), instant, found)
    return instant in slot_instants(cron, zone, wall, repeated, SKIP)


def _gap_slots(
    cron: OracleCron, zone: Zone, gap: Transition, after: int, missing: str
) -> int | None:
    """The least slot after `after` that the gap of a spring transition gives."""
    if missing == SKIP or not gap.is_gap:
        return None
    if missing == TRANSITION and gap.at <= after:
        return None  # every gap wall time gives the transition instant
    # A shifted wall time gives wall - before: after `after` exactly from wall after + before on.
    low = gap.at + gap.before if missing == TRANSITION else max(gap.at, after + 1) + gap.before
    for wall in matching_walls(cron, low, gap.at + gap.after):
        if passes(zone, wall):
            continue  # another stretch has this wall time (not seen since 1970)
        (instant,) = slot_instants(cron, zone, wall, FIRST, missing)
        assert instant > after
        return instant  # shifted instants grow with the wall time; transition is one
    return None


def oracle_next(
    expression: str,
    zone: str,
    after_ms: int,
    repeated: str,
    missing: str,
    *,
    horizon_years: int = 60,
) -> int | None:
    """The first slot (epoch ms) strictly after `after_ms`, or None when there is none within
    `horizon_years` of it (the engine may find one later: it looks 400 years ahead)."""
    cron = parse(expression)
    tz = zone_of(zone)
    after = after_ms // 1000  # slots are whole seconds: t * 1000 > after_ms <=> t > after
    horizon = after + horizon_years * 366 * DAY
    best: int | None = None

    def consider(instant: int | None) -> None:
        nonlocal best
        if instant is not None and instant > after and (best is None or instant < best):
            best = instant

    # Gaps that opened shortly before `after` may still have shifted slots to come.
    for t in tz.transitions(after - WIDEST_GAP, after + 2):
        consider(_gap_slots(cron, tz, t, after, missing))
    start = after + 1
    while start < horizon:
        upcoming = tz.next_transition(start, horizon)
        end = horizon if upcoming is None else upcoming.at
        offset = tz.offset(start)  # constant on [start, end)
        for wall in matching_walls(cron, start + offset, end + offset):
            instant = wall - offset
            if _allowed(cron, tz, wall, instant, repeated):
                consider(instant)
                break
        if best is not None and best < end:
            break  # everything from here on is at or after `end`
        if upcoming is not None:
            consider(_gap_slots(cron, tz, upcoming, after, missing))
        start = end
    return None if best is None else best * 1000


def oracle_slots(
    expression: str,
    zone: str,
    after_ms: int,
    repeated: str,
    missing: str,
    count: int,
    *,
    horizon_years: int = 60,
) -> list[int]:
    """The next `count` slots (epoch ms) after `after_ms`, fewer if the cron ends."""
    out: list[int] = []
    cursor = after_ms
    while len(out) < count:
        found = oracle_next(
            expression, zone, cursor, repeated, missing, horizon_years=horizon_years
        )
        if found is None:
            break
        out.append(found)
        cursor = found
    return out


def interval_slots(every_ms: int, anchor_ms: int, after_ms: int, count: int) -> list[int]:
    """Interval slots anchor + k * every (k >= 0) strictly after `after_ms`: elapsed time."""
    k = 0 if after_ms < anchor_ms else (after_ms - anchor_ms) // every_ms + 1
    return [anchor_ms + (k + i) * every_ms for i in range(count)]


def local_iso(instant_ms: int, zone: str) -> str:
    """The local ISO time with offset of an instant (what a slot key carries)."""
    moment = datetime.fromtimestamp(instant_ms / 1000, zone_of(zone).tz)
    return moment.isoformat(timespec="milliseconds" if instant_ms % 1000 else "seconds")


def utc_iso(instant_ms: int) -> str:
    moment = datetime(1970, 1, 1) + timedelta(milliseconds=instant_ms)
    return moment.isoformat(timespec="seconds") + "Z"
