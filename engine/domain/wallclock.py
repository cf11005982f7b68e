"""From matching wall-clock times to instants, one stretch of constant UTC offset at a time.

Between two transitions of a zone, wall time and UTC differ by one fixed offset, so the first
matching wall time after an instant is also the first slot. Around a transition that breaks down
in two ways, and both are handled here rather than by scanning every wall time nearby:

- autumn: the wall times just before the transition repeat just after it, so a wall time that
  is *earlier* than another can name a *later* instant; the DST rule decides which pass counts;
- spring: the wall times in the gap do not exist; shifted forward by the gap, they land among
  the real wall times after the transition, possibly *after* a real slot that follows them in
  wall order (Lord Howe's 30-minute gap: 02:15 shifted is 02:45, after a real 02:30).

The search walks forward in windows that hold at most one transition each, asking the cron for
the first matching wall time in each, so a call costs a few wall-time look-ups even for
second-level crons on the day of a transition.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from zoneinfo import ZoneInfo

from engine.domain.timeutil import DAY_MS, HOUR_MS

# A window holds at most one transition: real zones change offset months apart. Two
# transitions closer than this would be seen as none (a known limit; no current zone does it).
WINDOW_MS = 6 * DAY_MS
# How far back a transition can still decide slots after an instant: its gap or repeated range
# is as wide as its shift, and zones have shifted by a whole day (Pacific/Apia skipped
# 2011-12-30, Pacific/Kiritimati 1994-12-31, Pacific/Kwajalein 1993-08-20).
REACH_MS = 25 * HOUR_MS
# 400 years is the Gregorian cycle (zone rules after their last change are yearly): a cron
# that has no allowed slot in it has none ever. Measured from the first instant asked about.
SEARCH_MS = 400 * 366 * DAY_MS
# datetime stops at year 9999; stop searching well before (no slot can be named there anyway).
LAST_SEARCHED_MS = 253_000_000_000_000  # 9987-03-01

NextWall = Callable[[datetime], "datetime | None"]


class SlotNote(StrEnum):
    """How a DST transition touched a slot; shown by `preview`."""

    NONE = ""
    REPEATED_FIRST = "repeated hour, 1st"
    REPEATED_SECOND = "repeated hour, 2nd"
    SHIFTED = "shifted by DST gap"
    TRANSITION = "DST gap: at the transition"


@dataclass(frozen=True, slots=True)
class Resolved:
    """One instant a wall time stands for under the DST rules."""

    at_ms: int
    note: SlotNote = SlotNote.NONE

    @property
    def shifted(self) -> bool:
        """A gap wall time moved to a real instant (by the gap, or to the transition)."""
        return self.note is SlotNote.SHIFTED or self.note is SlotNote.TRANSITION


# Resolves one wall time into its allowed instants (empty when the rules drop it).
Resolve = Callable[[datetime], list[Resolved]]


def offset_ms(instant_ms: int, local: ZoneInfo) -> int:
    """The zone's UTC offset at an instant."""
    delta = datetime.fromtimestamp(instant_ms / 1000, local).utcoffset()
    assert delta is not None
    return int(delta.total_seconds() * 1000)


# Per zone, the latest span (lo, hi] known to hold no transition, and its offset: most calls
# fall inside it and skip the transition searches. Zone rules are fixed for the life of the
# process, so the cache cannot go stale.
_stable: dict[str, tuple[int, int, int]] = {}


def _without_transition(lo: int, hi: int, local: ZoneInfo) -> bool:
    known = _stable.get(local.key)
    return known is not None and known[0] <= lo and hi <= known[1]


def _remember_stable(lo: int, hi: int, offset: int, local: ZoneInfo) -> None:
    known = _stable.get(local.key)
    if known is not None and known[2] == offset and lo <= known[1] and known[0] <= hi:
        # Overlapping spans without a transition join into one (assuming, as everywhere
        # here, no two transitions within a window).
        lo, hi = min(lo, known[0]), max(hi, known[1])
    _stable[local.key] = (lo, hi, offset)


def local_offset_ms(instant_ms: int, local: ZoneInfo) -> int:
    """`offset_ms`, answered from the stable-span cache when it can be."""
    known = _stable.get(local.key)
    if known is not None and known[0] < instant_ms <= known[1]:
        return known[2]
    # Learn the span around this instant, so the next look-ups nearby are answered at once.
    transition_in(instant_ms - WINDOW_MS, instant_ms + WINDOW_MS, local)
    return offset_ms(instant_ms, local)


def format_local(instant_ms: int, local: ZoneInfo) -> str:
    """ISO 8601 local time with offset, as `datetime.isoformat` writes it, only faster: the
    dispatch of every fire formats one (its slot key)."""
    offset = local_offset_ms(instant_ms, local)
    seconds, millis = divmod(instant_ms + offset, 1000)
    year, month, day, hour, minute, second = time.gmtime(seconds)[:6]
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    if millis:
        text += f".{millis:03d}"
    sign = "+" if offset >= 0 else "-"
    hours, rest = divmod(abs(offset) // 1000, 3600)
    minutes, secs = divmod(rest, 60)
    text += f"{sign}{hours:02d}:{minutes:02d}"
    return text + f":{secs:02d}" if secs else text


def wall_ms(wall: datetime) -> int:
    """A naive wall time read as if it were UTC, in milliseconds."""
    return calendar.timegm(wall.timetuple()) * 1000 + wall.microsecond // 1000


def wall_of(ms: int) -> datetime:
    """The inverse of `wall_ms`."""
    return datetime(1970, 1, 1) + timedelta(milliseconds=ms)


def transition_in(lo: int, hi: int, local: ZoneInfo) -> int | None:
    """The first instant in (lo, hi] whose offset differs from the one just after `lo`.

    Assumes at most one transition in the span (see WINDOW_MS). Answered from the zone's
    transitions, found once per block of time and kept: a search near a transition day asks
    for the same one again and again, and bisecting for it every time made next-fire several
    times dearer on those days.
    """
    if _without_transition(lo, hi, local):
        return None
    for block in range(lo // BLOCK_MS, hi // BLOCK_MS + 1):
        for at in _transitions_in_block(local, block):
            if lo + 1 < at <= hi:
                return at
    _remember_stable(lo, hi, offset_ms(lo + 1, local), local)
    return None


# Transitions are found a block at a time, stepping through it half a window at a time (two
# transitions closer than that would be missed; see WINDOW_MS) and bisecting where the offset
# changed.
BLOCK_MS = 64 * DAY_MS
_STEP_MS = WINDOW_MS // 2


@lru_cache(maxsize=16_384)
def _transitions_in_block(local: ZoneInfo, block: int) -> tuple[int, ...]:
    """Every transition t with block start < t <= block end (a transition at a block's start
    belongs to the block before)."""
    found: list[int] = []
    a = block * BLOCK_MS
    end = a + BLOCK_MS
    before = offset_ms(a, local)
    while a < end:
        b = min(a + _STEP_MS, end)
        after = offset_ms(b, local)
        if after != before:
            x, y = a, b
            while y - x > 1:
                mid = (x + y) // 2
                if offset_ms(mid, local) == before:
                    x = mid
                else:
                    y = mid
            found.append(y)
        a, before = b, after
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Transition:
    at_ms: int
    before_ms: int  # offset before
    after_ms: int  # offset after

    @property
    def is_gap(self) -> bool:
        return self.after_ms > self.before_ms


def _transition(at_ms: int, local: ZoneInfo) -> Transition:
    return Transition(at_ms, offset_ms(at_ms - 1, local), offset_ms(at_ms, local))


def first_slot_after(
    after_ms: int, local: ZoneInfo, next_wall: NextWall, resolve: Resolve, shift_gaps: bool
) -> tuple[int, datetime, Resolved] | None:
    """The earliest allowed instant strictly after `after_ms`, with its wall time.

    `next_wall(w)` is the first matching wall time strictly after `w`; `resolve(w)` applies the
    DST rules to one wall time; `shift_gaps` says whether gap wall times fire at all (moved by
    the gap, or to the transition: `resolve` says which). None when no slot follows within
    `SEARCH_MS`: the cron never fires under these rules.
    """
    best: tuple[int, datetime, Resolved] | None = None

    def consider(found: tuple[int, datetime, Resolved] | None) -> None:
        nonlocal best
        if found is None or found[0] <= after_ms:
            return
        # Equal instants: a real wall time beats a shifted one.
        if best is None or found[0] < best[0] or (found[0] == best[0] and not found[2].shifted):
            best = found

    start = after_ms
    # A transition at after_ms + 1 starts the first region: it counts as behind, not ahead.
    behind = transition_in(after_ms - REACH_MS, after_ms + 1, local)
    region_start = None if behind is None else _transition(behind, local)
    if region_start is not None and region_start.is_gap and shift_gaps:
        consider(_gap_slot(region_start, after_ms, next_wall, resolve))
    limit = min(after_ms + SEARCH_MS, LAST_SEARCHED_MS)
    while start < limit:
        offset = offset_ms(start + 1, local)
        ahead = transition_in(start, start + WINDOW_MS, local)
        end = start + WINDOW_MS if ahead is None else ahead
        found, wall = _first_in_region(start, end, offset, region_start, next_wall, resolve)
        consider(found)
        if ahead is not None and shift_gaps:
            upcoming = _transition(ahead, local)
            if upcoming.is_gap:
                consider(_gap_slot(upcoming, after_ms, next_wall, resolve))
        if best is not None and best[0] < end:
            # Every later window's slots are at or after this one's end.
            return best
        if wall is None:
            return best  # the cron matches no later wall time at all
        if ahead is not None:
            region_start = _transition(ahead, local)
            start = ahead - 1
        else:
            # No transition here and the next match is further on: go to its window.
            region_start = None
            start = max(end, wall_ms(wall) - offset - WINDOW_MS // 2) - 1
    return best


def _first_in_region(
    start: int,
    end: int,
    offset: int,
    region_start: Transition | None,
    next_wall: NextWall,
    resolve: Resolve,
) -> tuple[tuple[int, datetime, Resolved] | None, datetime | None]:
    """The first allowed slot with instant in (start, end) at a constant `offset`.

    Returns (slot or None, the last matching wall time looked at, None when the cron has none).
    """
    wall: datetime | None = wall_of(start + offset)
    while True:
        assert wall is not None
        wall = next_wall(wall)
        if wall is None:
            return None, None
        instant = wall_ms(wall) - offset
        if instant >= end:
            return None, wall
        passes = resolve(wall)
        for resolved in passes:
            if resolved.at_ms == instant:
                return (instant, wall, resolved), wall
        # The rules refuse this pass of a repeated wall time.
        if region_start is not None and region_start.before_ms > offset:
            # Just after an autumn transition, the second pass is refused: skip the rest of
            # the repeated range.
            repeated_end = wall_of(region_start.at_ms + region_start.before_ms)
            if wall < repeated_end:
                wall = repeated_end - timedelta(seconds=1)
                continue
        # Just before one, the first pass is refused: the rest of this region repeats.
        return None, wall


def _gap_slot(
    transition: Transition, after_ms: int, next_wall: NextWall, resolve: Resolve
) -> tuple[int, datetime, Resolved] | None:
    """The first shifted slot of a spring transition's gap that is after `after_ms`."""
    gap_start = transition.at_ms + transition.before_ms
    gap_end = transition.at_ms + transition.after_ms
    earliest = max(gap_start - 1000, after_ms + transition.before_ms)
    wall = next_wall(wall_of(earliest))
    while wall is not None and wall_ms(wall) < gap_end:
        for resolved in resolve(wall):
            if resolved.shifted and resolved.at_ms > after_ms:
                return resolved.at_ms, wall, resolved
            if resolved.note is SlotNote.TRANSITION:
                # Every wall time of the gap fires at the one transition instant, already
                # past: walking the rest of the gap (a day of seconds at Apia) finds nothing.
                return None
        wall = next_wall(wall)
    return None
