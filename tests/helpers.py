"""Small helpers shared by tests."""

from __future__ import annotations

from engine import Engine, RunKind, SchedulerDaemon
from engine.backends.sqlite import SqliteBackend
from engine.backends.sqlite.connection import ConnectionPool
from engine.domain.timeutil import iso_local
from engine.ports import RunQuery
from engine.runtime.daemon import resolver_at

__all__ = ["fired_slots", "leads", "resolver_at", "settle"]


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


def sqlite_pool(engine: Engine) -> ConnectionPool:
    """The connection pool of an engine on a SQLite file (tests that read the file in SQL)."""
    assert isinstance(engine.storage, SqliteBackend), "this test reads a SQLite file"
    return engine.storage.pool
