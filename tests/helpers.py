"""Small helpers shared by tests."""

from __future__ import annotations

from collections.abc import Callable

from engine import Engine, RunKind, Schedule, SchedulerDaemon
from engine.domain.misfire import SlotPlan, plan_slots
from engine.domain.timeutil import iso_local
from engine.ports import RunQuery


def settle(daemon: SchedulerDaemon, max_steps: int = 20) -> None:
    """Step the daemon until it leads and has nothing left to do right now."""
    for _ in range(max_steps):
        delay = daemon.step()
        if daemon.leading and delay > 0:
            return
    raise AssertionError("the daemon did not settle")


def fired_slots(engine: Engine, name: str, tz: str = "UTC") -> list[str]:
    """Local times of the scheduled runs of one schedule, oldest first."""
    schedule = engine.service.get(name)
    runs = engine.service.runs(RunQuery(schedule_id=schedule.id, limit=100_000))
    return [
        iso_local(r.slot_at, tz)
        for r in sorted(runs, key=lambda r: r.slot_at)
        if r.kind is RunKind.SCHEDULED
    ]


def leads(daemon: SchedulerDaemon) -> bool:
    """Whether the daemon holds the lease (a call, so type narrowing does not stick)."""
    return daemon.leading


def resolver_at(now_ms: int) -> Callable[[Schedule, int], SlotPlan]:
    """What the daemon resolves due schedules with, at a fixed instant."""

    def resolve(schedule: Schedule, cursor: int) -> SlotPlan:
        return plan_slots(
            schedule_id=schedule.id,
            trigger=schedule.trigger,
            tz=schedule.timezone,
            cursor_ms=cursor,
            now_ms=now_ms,
            policy=schedule.misfire,
            jitter_ms=schedule.jitter_ms,
        )

    return resolve
