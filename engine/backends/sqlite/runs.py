"""The run ledger in SQLite (its reads are engine.backends.sql.runs')."""

from __future__ import annotations

from collections.abc import Sequence

import apsw

from engine.backends.sql.runs import SqlRunLedger, insert_run_sql, new_run_values, recorded
from engine.backends.sqlite.connection import ConnectionPool, scalar, storage_errors
from engine.domain.errors import DuplicateSlot
from engine.domain.run import NewRun, Run

# The next run id: above every id ever used, deleted ones too (run_id_floor), never reused.
NEXT_RUN_ID = (
    "SELECT max(coalesce((SELECT max(id) FROM runs), 0), "
    "coalesce((SELECT floor FROM run_id_floor), 0)) + 1"
)
INSERT_RUN = (
    insert_run_sql("?")
    .replace("INSERT INTO runs (tenant,", "INSERT INTO runs (id, tenant,", 1)
    .replace("VALUES (", f"VALUES (({NEXT_RUN_ID}), ", 1)
)


def insert_run(conn: apsw.Connection, run: NewRun, dispatched_at: int) -> int | None:
    """Insert inside the caller's transaction; None when the slot key is taken."""
    conn.execute(INSERT_RUN, new_run_values(run, dispatched_at))
    if conn.changes() == 0:
        return None
    return int(conn.last_insert_rowid())


class SqliteRunLedger(SqlRunLedger[ConnectionPool]):
    def record(self, run: NewRun, dispatched_at: int) -> Run:
        with self._pool.transaction() as conn:
            run_id = insert_run(conn, run, dispatched_at)
            if run_id is None:
                raise DuplicateSlot(run.slot_key)
        return recorded(run, run_id, dispatched_at)

    def last_slots(self, schedule_ids: Sequence[str], tenant: str | None = None) -> dict[str, int]:
        result: dict[str, int] = {}
        conn = self._pool.get()
        sql = "SELECT max(slot_at) FROM runs WHERE schedule_id = ?"
        if tenant is not None:
            sql += " AND tenant = ?"
        with storage_errors(self._pool.path):
            for sid in schedule_ids:
                args = (sid,) if tenant is None else (sid, tenant)
                value = scalar(conn, sql, args)
                if value is not None:
                    result[sid] = int(value)
        return result
