"""The dead-man detector: has each active schedule fired as often as its trigger says?

A schedule's tolerance follows its own period: twice the gap between its slots around now, plus
half a period but at most two minutes, so a schedule that missed three slots in a row is always
overdue (metadata `deadman_tolerance`, a duration such as "3h", overrides it). Verdicts:

- fired: it fired (or was resumed, created or changed) within its tolerance;
- overdue: its newest fire is older than that;
- never_fired: it never fired and has existed for longer than that;
- indeterminate: nothing to judge (a one-shot, a finished trigger, a tolerance that cannot be
  read, or a period that cannot be found).

Paused, disabled and finished schedules are not judged at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput
from engine.domain.schedule import Schedule, ScheduleStatus
from engine.domain.timeutil import MINUTE_MS, parse_duration
from engine.domain.triggers import OneShotTrigger
from engine.ports.runs import RunLedger
from engine.ports.schedules import ScheduleQuery, ScheduleStore

log = logging.getLogger("vortos.deadman")

TOLERANCE_KEY = "deadman_tolerance"
WATCH_EVERY_S = 30.0
SLACK_MS = 2 * MINUTE_MS
PAGE = 1000


class Verdict(StrEnum):
    FIRED = "fired"
    OVERDUE = "overdue"
    NEVER_FIRED = "never_fired"
    INDETERMINATE = "indeterminate"


@dataclass(frozen=True, slots=True)
class Judgement:
    schedule: Schedule
    verdict: Verdict
    tolerance_ms: int | None
    last_fired_at: int | None  # the newest fired slot, if any
    reason: str  # in words, for doctor and the console


def period_ms(schedule: Schedule, now_ms: int) -> int | None:
    """The gap between the schedule's slots around now (None: no two slots to measure)."""
    if isinstance(schedule.trigger, OneShotTrigger):
        return None
    first = schedule.trigger.slot_after(now_ms, schedule.timezone)
    if first is None:
        return None
    second = schedule.trigger.slot_after(first.at_ms, schedule.timezone)
    if second is None:
        return None
    return second.at_ms - first.at_ms


def tolerance_ms(schedule: Schedule, now_ms: int) -> int | None:
    """Raises InvalidInput when the metadata override is not a duration."""
    given = schedule.metadata.get(TOLERANCE_KEY)
    if given is not None:
        return parse_duration(given, what=f"metadata {TOLERANCE_KEY}")
    period = period_ms(schedule, now_ms)
    return None if period is None else 2 * period + min(SLACK_MS, period // 2)


def judge(schedule: Schedule, last_fired_at: int | None, now_ms: int) -> Judgement:
    try:
        tolerance = tolerance_ms(schedule, now_ms)
    except InvalidInput as exc:
        return Judgement(schedule, Verdict.INDETERMINATE, None, last_fired_at, str(exc))
    if tolerance is None:
        why = "a one-shot" if isinstance(schedule.trigger, OneShotTrigger) else "no period"
        return Judgement(schedule, Verdict.INDETERMINATE, None, last_fired_at, why)
    # A change or a resume restarts the clock: slots before it were not owed.
    since = max(last_fired_at or 0, schedule.updated_at, schedule.created_at)
    late = now_ms - since
    if late <= tolerance:
        return Judgement(schedule, Verdict.FIRED, tolerance, last_fired_at, "on time")
    verdict = Verdict.OVERDUE if last_fired_at is not None else Verdict.NEVER_FIRED
    what = "last fired" if last_fired_at is not None else "never fired; changed"
    return Judgement(
        schedule,
        verdict,
        tolerance,
        last_fired_at,
        f"{what} {late // 1000}s ago, tolerance {tolerance // 1000}s",
    )


def judged(schedules: ScheduleStore, runs: RunLedger, now_ms: int) -> list[Judgement]:
    """A verdict for every active schedule that has a next slot, page by page."""
    found: list[Judgement] = []
    for page in _active_pages(schedules):
        last = runs.last_slots([s.id for s in page])
        found += [judge(s, last.get(s.id), now_ms) for s in page]
    return found


def _active_pages(schedules: ScheduleStore) -> Iterable[list[Schedule]]:
    offset = 0
    while True:
        page = schedules.query(
            ScheduleQuery(status=ScheduleStatus.ACTIVE, limit=PAGE, offset=offset)
        )
        live = [s for s in page if s.next_slot_at is not None]
        if live:
            yield live
        if len(page) < PAGE:
            return
        offset += PAGE


def counts(judgements: Iterable[Judgement]) -> Mapping[Verdict, int]:
    tally = dict.fromkeys(Verdict, 0)
    for j in judgements:
        tally[j.verdict] += 1
    return tally


class DeadmanWatch:
    """Judges every active schedule every `every_s` seconds (first at once) on its own
    thread and hands the verdicts to `report` (the metrics' dead-man gauge). A failed round
    is logged and tried again next time."""

    def __init__(
        self,
        schedules: ScheduleStore,
        runs: RunLedger,
        clock: Clock,
        report: Callable[[list[Judgement]], None],
        *,
        every_s: float = WATCH_EVERY_S,
    ) -> None:
        self._schedules = schedules
        self._runs = runs
        self._clock = clock
        self._report = report
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vortos-deadman", daemon=True)

    def start(self) -> DeadmanWatch:
        self._thread.start()
        return self

    def round(self) -> None:
        self._report(judged(self._schedules, self._runs, self._clock.now_ms()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except Exception:  # the watch must outlive a bad round (a locked database, say)
                log.exception("dead-man round failed; trying again in %.0f s", self._every_s)
            self._stop.wait(self._every_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
