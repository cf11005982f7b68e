"""Schedules on either SQL backend: the reads, one SQL for both, and the refusals both
backends raise. How a version-checked write is made safe (SQLite's single writer,
PostgreSQL's conditional statements) stays in each backend."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Generic, TypeVar

from engine.backends.codec import SCHEDULE_COLUMNS, retry_policy_from, schedule_from_row
from engine.backends.sql import Dialect, SqlPool, Where, count, first
from engine.domain.errors import DuplicateName, NotFound, StaleVersion
from engine.domain.retry import RetryPolicy
from engine.domain.schedule import Schedule
from engine.ports.schedules import ScheduleQuery

P = TypeVar("P", bound=SqlPool[Any])

# SCHEDULE_COLUMNS one by one (the id first).
SCHEDULE_NAMES = [c.strip() for c in SCHEDULE_COLUMNS.split(",")]


def name_taken(schedule: Schedule, *, remedy: bool) -> DuplicateName:
    """The refusal of a second schedule of `schedule`'s name in its tenant (`remedy`: say
    what to do instead)."""
    message = f"a schedule named {schedule.name!r} already exists in tenant {schedule.tenant!r}"
    if remedy:
        message += ": choose another name, or change the existing one"
    return DuplicateName(message)


def missing(schedule_id: str, tenant: str) -> NotFound:
    return NotFound(f"schedule {schedule_id} does not exist in tenant {tenant!r}")


def stale(name: str, expected: int | None, now: int) -> StaleVersion:
    return StaleVersion(
        f"schedule {name!r} changed since it was read (version {expected}, now "
        f"{now}): read it again and retry"
    )


def schedule_query_sql(query: ScheduleQuery, dialect: Dialect) -> tuple[str, list[Any]]:
    """The SELECT answering `query`, and its parameters."""
    where = Where(dialect)
    where.equal("tenant", query.tenant)
    where.scope("tenant", query.tenants)
    where.equal("status", None if query.status is None else query.status.value)
    if query.name_prefix:
        condition, args = dialect.starts_with("name", query.name_prefix)
        where.add(condition, *args)
    text = dialect.byte_order
    m = dialect.mark
    sql = (
        f"SELECT {SCHEDULE_COLUMNS} FROM schedules {where} ORDER BY next_fire_at IS NULL, "
        f"next_fire_at, tenant{text}, name{text} LIMIT {m} OFFSET {m}"
    )
    return sql, [*where.args, query.limit, query.offset]


class SqlScheduleStore(Generic[P]):
    """The schedules' reads; a backend adds the writes."""

    def __init__(self, pool: P) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def get(self, schedule_id: str, tenant: str | None = None) -> Schedule | None:
        m = self._mark
        if tenant is None:
            return self._one(f"id = {m}", (schedule_id,))
        return self._one(f"id = {m} AND tenant = {m}", (schedule_id, tenant))

    def find_by_name(self, tenant: str, name: str) -> Schedule | None:
        return self._one(f"tenant = {self._mark} AND name = {self._mark}", (tenant, name))

    def query(self, query: ScheduleQuery) -> list[Schedule]:
        sql, args = schedule_query_sql(query, self._pool.dialect)
        return [schedule_from_row(r) for r in self._pool.read(sql, args)]

    def execution_limits(self, ids: Collection[str]) -> dict[str, tuple[int | None, RetryPolicy]]:
        if not ids:
            return {}
        d = self._pool.dialect
        rows = self._pool.read(
            f"SELECT id, timeout_ms, retry FROM schedules WHERE {d.one_of('id', d.mark, 'text')}",
            (d.bind_list(sorted(ids)),),
        )
        return {
            str(sid): (None if timeout is None else int(timeout), retry_policy_from(str(retry)))
            for sid, timeout, retry in rows
        }

    def count(self, tenant: str | None = None) -> int:
        return count(self._pool, "schedules", "tenant", tenant)

    def _one(self, condition: str, args: Sequence[Any]) -> Schedule | None:
        row = first(self._pool, f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE {condition}", args)
        return None if row is None else schedule_from_row(row)
