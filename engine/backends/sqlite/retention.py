"""Retention overrides, and the ledger as the retention sweeper walks and prunes it, in SQLite."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from engine.backends.sqlite.connection import (
    ConnectionPool,
    Row,
    first,
    rows,
    storage_errors,
    write_tx,
)
from engine.ports.retention import RetentionOverride, RunAge, RunStanding

# One row per run: how it stands (see RunStanding) and the instant its age counts from. A run
# is open while it or its fire is; a terminal run whose fire was purged is plain history.
_AGES = """
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
# The newest run is never offered nor removed: the next id is the newest plus one, so
# removing it would hand its id out again, and audit entries name runs by id.
_OLDER = "r.id < (SELECT max(id) FROM runs)"
_IDS = "(SELECT value FROM json_each(?))"


_STANDING = {s.value: s for s in RunStanding}


def _age(r: Row) -> RunAge:
    # Positional and without conversions (the columns are typed by the query): a sweep
    # builds one per run, millions of them.
    return RunAge(r[0], r[1], _STANDING[r[2]], r[3], r[4], bool(r[5]))


def _override(r: Row) -> RetentionOverride:
    return RetentionOverride(
        tenant=str(r[0]), days=int(r[1]), reason=r[2], set_by=str(r[3]), set_at=int(r[4])
    )


_OVERRIDE_COLUMNS = "tenant, days, reason, set_by, set_at"


class SqliteRetentionStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    # -- overrides --------------------------------------------------------------------------

    def overrides(self) -> list[RetentionOverride]:
        sql = f"SELECT {_OVERRIDE_COLUMNS} FROM retention_overrides ORDER BY tenant"
        with storage_errors(self._pool.path):
            return [_override(r) for r in rows(self._pool.get(), sql)]

    def override(self, tenant: str) -> RetentionOverride | None:
        sql = f"SELECT {_OVERRIDE_COLUMNS} FROM retention_overrides WHERE tenant = ?"
        with storage_errors(self._pool.path):
            found = first(self._pool.get(), sql, (tenant,))
        return None if found is None else _override(found)

    def set_override(self, override: RetentionOverride) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            conn.execute(
                f"INSERT INTO retention_overrides ({_OVERRIDE_COLUMNS}) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (tenant) DO UPDATE SET days = excluded.days, "
                "reason = excluded.reason, set_by = excluded.set_by, set_at = excluded.set_at",
                (
                    override.tenant,
                    override.days,
                    override.reason,
                    override.set_by,
                    override.set_at,
                ),
            )

    def remove_override(self, tenant: str) -> bool:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            conn.execute("DELETE FROM retention_overrides WHERE tenant = ?", (tenant,))
            return conn.changes() > 0

    # -- the ledger -------------------------------------------------------------------------

    def examine(self, after_run_id: int, limit: int) -> list[RunAge]:
        # The primary key's order: each page is a range seek, whatever the ledger's size.
        sql = f"{_AGES} WHERE r.id > ? AND {_OLDER} ORDER BY r.id LIMIT ?"
        with storage_errors(self._pool.path):
            return [_age(r) for r in rows(self._pool.get(), sql, (after_run_id, limit))]

    def delete(
        self, run_ids: Sequence[int], *, still: Callable[[RunAge], bool] | None = None
    ) -> list[RunAge]:
        if not run_ids:
            return []
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            # Judged again under the write lock: only what is terminal (and still wanted) now.
            # The ids given are a sweep's page, close together: one range read of the primary
            # key is cheaper than as many lookups.
            wanted = set(run_ids)
            removable = [
                age
                for age in (
                    _age(r)
                    for r in rows(
                        conn,
                        f"{_AGES} WHERE r.id BETWEEN ? AND ? AND {_OLDER} ORDER BY r.id",
                        (min(wanted), max(wanted)),
                    )
                    if r[0] in wanted
                )
                if age.standing is not RunStanding.OPEN and (still is None or still(age))
            ]
            if not removable:
                return []
            ids = json.dumps([age.run_id for age in removable])
            conn.execute(f"DELETE FROM fire_queue WHERE run_id IN {_IDS}", (ids,))
            conn.execute(f"DELETE FROM runs WHERE id IN {_IDS}", (ids,))
        return removable
