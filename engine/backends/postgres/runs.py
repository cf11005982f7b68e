"""The run ledger in PostgreSQL (its reads are engine.backends.sql.runs')."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.backends.postgres.connection import PgPool, Row, first, storage_errors
from engine.backends.sql.runs import SqlRunLedger, insert_run_sql, new_run_values, recorded
from engine.domain.errors import DuplicateSlot
from engine.domain.run import NewRun, Run

if TYPE_CHECKING:
    import psycopg

# The unique slot key decides: a taken key inserts nothing and returns no id.
INSERT_RUN = insert_run_sql("%s") + " RETURNING id"


def insert_run(conn: psycopg.Connection[Row], run: NewRun, dispatched_at: int) -> int | None:
    """Insert (in the caller's transaction, if it has one); None when the slot key is taken."""
    row = first(conn, INSERT_RUN, new_run_values(run, dispatched_at))
    return None if row is None else int(row[0])


class PostgresRunLedger(SqlRunLedger[PgPool]):
    def record(self, run: NewRun, dispatched_at: int) -> Run:
        with storage_errors(self._pool.where):
            run_id = insert_run(self._pool.get(), run, dispatched_at)
        if run_id is None:
            raise DuplicateSlot(run.slot_key)
        return recorded(run, run_id, dispatched_at)

    def last_slots(self, schedule_ids: Sequence[str], tenant: str | None = None) -> dict[str, int]:
        if not schedule_ids:
            return {}
        # One statement; each schedule's newest slot through its index.
        scoped = "" if tenant is None else " AND tenant = %s"
        sql = (
            f"SELECT s.id, (SELECT max(slot_at) FROM runs WHERE schedule_id = s.id{scoped}) "
            "FROM unnest(%s::text[]) AS s(id)"
        )
        args: tuple[Any, ...] = (list(schedule_ids),)
        if tenant is not None:
            args = (tenant, *args)
        return {sid: int(at) for sid, at in self._pool.read(sql, args) if at is not None}
