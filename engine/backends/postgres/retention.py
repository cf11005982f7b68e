"""Retention overrides, and the ledger as the retention sweeper walks and prunes it, in
PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.backends.postgres.connection import (
    PgPool,
    Row,
    first,
    rows,
    storage_errors,
    write_tx,
)
from engine.ports.retention import RetentionOverride, RunAge, RunStanding

if TYPE_CHECKING:
    import psycopg

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
# The newest run is never offered nor removed: ids are handed out by the identity sequence,
# and audit entries name runs by id, so the newest stays as the ledger's high-water mark
# (as on SQLite, where the next id is the newest plus one).
_OLDER = "r.id < (SELECT max(id) FROM runs)"
# A delete is given one page of a sweep; more than this many ids are locked, judged and
# removed a slice at a time (all in the one transaction), so no statement carries an
# unbounded array.
DELETE_BATCH = 1000

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


class PostgresRetentionStore:
    def __init__(self, pool: PgPool) -> None:
        self._pool = pool

    # -- overrides --------------------------------------------------------------------------

    def overrides(self) -> list[RetentionOverride]:
        sql = f"SELECT {_OVERRIDE_COLUMNS} FROM retention_overrides ORDER BY tenant"
        with storage_errors(self._pool.where):
            return [_override(r) for r in rows(self._pool.get(), sql)]

    def override(self, tenant: str) -> RetentionOverride | None:
        sql = f"SELECT {_OVERRIDE_COLUMNS} FROM retention_overrides WHERE tenant = %s"
        with storage_errors(self._pool.where):
            found = first(self._pool.get(), sql, (tenant,))
        return None if found is None else _override(found)

    def set_override(self, override: RetentionOverride) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            conn.execute(
                f"INSERT INTO retention_overrides ({_OVERRIDE_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s) "
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
        with storage_errors(self._pool.where), write_tx(conn):
            done = conn.execute("DELETE FROM retention_overrides WHERE tenant = %s", (tenant,))
            return done.rowcount > 0

    # -- the ledger -------------------------------------------------------------------------

    def examine(self, after_run_id: int, limit: int) -> list[RunAge]:
        # The primary key's order: each page is a range scan, whatever the ledger's size.
        sql = f"{_AGES} WHERE r.id > %s AND {_OLDER} ORDER BY r.id LIMIT %s"
        bound = None if limit < 0 else limit  # as SQLite: a negative limit is none (LIMIT ALL)
        with storage_errors(self._pool.where):
            return [_age(r) for r in rows(self._pool.get(), sql, (after_run_id, bound))]

    def delete(
        self, run_ids: Sequence[int], *, still: Callable[[RunAge], bool] | None = None
    ) -> list[RunAge]:
        wanted = sorted(set(run_ids))
        if not wanted:
            return []
        conn = self._pool.get()
        removed: list[RunAge] = []
        with storage_errors(self._pool.where), write_tx(conn):
            for start in range(0, len(wanted), DELETE_BATCH):
                removed += self._delete_batch(conn, wanted[start : start + DELETE_BATCH], still)
        return removed

    @staticmethod
    def _delete_batch(
        conn: psycopg.Connection[Row], ids: list[int], still: Callable[[RunAge], bool] | None
    ) -> list[RunAge]:
        # Lock the fires, then the runs (the order settle and requeue take them in), so no
        # settle, requeue or purge changes them between the judgement and the delete; the
        # judgement is then a new statement, whose snapshot sees every change committed
        # before the locks were granted (READ COMMITTED).
        conn.execute(
            "SELECT run_id FROM fire_queue WHERE run_id = ANY(%s) ORDER BY run_id FOR UPDATE",
            (ids,),
        )
        conn.execute("SELECT id FROM runs WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (ids,))
        removable = [
            age
            for age in (
                _age(r)
                for r in rows(
                    conn, f"{_AGES} WHERE r.id = ANY(%s) AND {_OLDER} ORDER BY r.id", (ids,)
                )
            )
            if age.standing is not RunStanding.OPEN and (still is None or still(age))
        ]
        if removable:
            gone = [age.run_id for age in removable]
            conn.execute("DELETE FROM fire_queue WHERE run_id = ANY(%s)", (gone,))
            conn.execute("DELETE FROM runs WHERE id = ANY(%s)", (gone,))
        return removable
