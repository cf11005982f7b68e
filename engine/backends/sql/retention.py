"""Retention on either SQL backend: how the sweeper sees a run, and the per-tenant overrides,
one SQL for both. How a page of runs is judged again and removed (SQLite's single writer,
PostgreSQL's row locks) stays in each backend."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from engine.backends.sql import Row, SqlPool, first
from engine.ports.retention import RetentionOverride, RunAge, RunStanding

P = TypeVar("P", bound=SqlPool[Any])

# One row per run: how it stands (see RunStanding) and the instant its age counts from. A run
# is open while it or its fire is; a terminal run whose fire was purged is plain history.
AGES = """
SELECT r.id, r.tenant,
       CASE
           WHEN r.state = 'dispatched' OR r.state = 'running' THEN 'open'
           WHEN f.run_id IS NULL THEN 'settled'
           WHEN f.discarded_at IS NOT NULL THEN 'dead_letter'
           WHEN f.completed_at IS NOT NULL THEN 'settled'
           ELSE 'open'
       END,
       r.dispatched_at,
       CASE
           WHEN f.discarded_at IS NOT NULL THEN f.discarded_at
           ELSE coalesce(r.finished_at, r.dispatched_at)
       END,
       f.run_id IS NOT NULL
  FROM runs AS r LEFT JOIN fire_queue AS f ON f.run_id = r.id
"""
# The newest run is never offered nor removed: audit entries name runs by id, and the newest
# stays as the ledger's high-water mark (on SQLite the next id is the newest plus one, so
# removing it would hand its id out again).
OLDER = "r.id < (SELECT max(id) FROM runs)"

_STANDING = {s.value: s for s in RunStanding}
_OVERRIDE_COLUMNS = "tenant, days, reason, set_by, set_at"


def age_from_row(r: Row) -> RunAge:
    """A row of AGES."""
    # Positional and without conversions (the columns are typed by the query): a sweep
    # builds one per run, millions of them.
    return RunAge(r[0], r[1], _STANDING[r[2]], r[3], r[4], bool(r[5]))


def _override(r: Row) -> RetentionOverride:
    return RetentionOverride(
        tenant=str(r[0]), days=int(r[1]), reason=r[2], set_by=str(r[3]), set_at=int(r[4])
    )


class SqlRetentionStore(Generic[P]):
    """The overrides; a backend adds how the ledger is examined and pruned."""

    def __init__(self, pool: P) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def overrides(self) -> list[RetentionOverride]:
        sql = f"SELECT {_OVERRIDE_COLUMNS} FROM retention_overrides ORDER BY tenant"
        return [_override(r) for r in self._pool.read(sql)]

    def override(self, tenant: str) -> RetentionOverride | None:
        sql = f"SELECT {_OVERRIDE_COLUMNS} FROM retention_overrides WHERE tenant = {self._mark}"
        found = first(self._pool, sql, (tenant,))
        return None if found is None else _override(found)

    def set_override(self, override: RetentionOverride) -> None:
        self._pool.write(
            f"INSERT INTO retention_overrides ({_OVERRIDE_COLUMNS}) "
            f"VALUES ({self._pool.dialect.marks(5)}) "
            "ON CONFLICT (tenant) DO UPDATE SET days = excluded.days, "
            "reason = excluded.reason, set_by = excluded.set_by, set_at = excluded.set_at",
            (override.tenant, override.days, override.reason, override.set_by, override.set_at),
        )

    def remove_override(self, tenant: str) -> bool:
        sql = f"DELETE FROM retention_overrides WHERE tenant = {self._mark}"
        return self._pool.write(sql, (tenant,)) > 0
