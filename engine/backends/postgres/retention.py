"""Retention overrides, and the ledger as the retention sweeper walks and prunes it, in
PostgreSQL (the overrides are engine.backends.sql.retention's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.backends.postgres.connection import PgPool, Row, rows
from engine.backends.sql.retention import AGES, OLDER, SqlRetentionStore, age_from_row
from engine.ports.retention import RunAge, RunStanding

if TYPE_CHECKING:
    import psycopg

# A delete is given one page of a sweep; more than this many ids are locked, judged and
# removed a slice at a time (all in the one transaction), so no statement carries an
# unbounded array.
DELETE_BATCH = 1000


class PostgresRetentionStore(SqlRetentionStore[PgPool]):
    def examine(self, after_run_id: int, limit: int) -> list[RunAge]:
        # The primary key's order: each page is a range scan, whatever the ledger's size.
        sql = f"{AGES} WHERE r.id > %s AND {OLDER} ORDER BY r.id LIMIT %s"
        bound = None if limit < 0 else limit  # as SQLite: a negative limit is none (LIMIT ALL)
        return [age_from_row(r) for r in self._pool.read(sql, (after_run_id, bound))]

    def delete(
        self, run_ids: Sequence[int], *, still: Callable[[RunAge], bool] | None = None
    ) -> list[RunAge]:
        wanted = sorted(set(run_ids))
        if not wanted:
            return []
        removed: list[RunAge] = []
        with self._pool.transaction() as conn:
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
                age_from_row(r)
                for r in rows(
                    conn, f"{AGES} WHERE r.id = ANY(%s) AND {OLDER} ORDER BY r.id", (ids,)
                )
            )
            if age.standing is not RunStanding.OPEN and (still is None or still(age))
        ]
        if removable:
            gone = [age.run_id for age in removable]
            conn.execute("DELETE FROM fire_queue WHERE run_id = ANY(%s)", (gone,))
            conn.execute("DELETE FROM runs WHERE id = ANY(%s)", (gone,))
        return removable
