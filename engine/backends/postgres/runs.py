"""The run ledger in PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.backends.codec import RUN_COLUMNS, run_from_row
from engine.backends.postgres.connection import (
    PgPool,
    Row,
    first,
    rows,
    scalar,
    storage_errors,
    tenants_clause,
)
from engine.domain.errors import DuplicateSlot
from engine.domain.run import NewRun, Run, RunState
from engine.domain.slots import slot_instant
from engine.ports.runs import RunQuery

if TYPE_CHECKING:
    import psycopg

# The unique slot key decides: a taken key inserts nothing and returns no id.
INSERT_RUN = (
    "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, "
    "state, dispatched_at, node_id) VALUES (%s, %s, %s, %s, %s, %s, %s, 'dispatched', %s, %s) "
    "ON CONFLICT (slot_at, slot_key, tenant) DO NOTHING RETURNING id"
)


def insert_run(conn: psycopg.Connection[Row], run: NewRun, dispatched_at: int) -> int | None:
    """Insert (in the caller's transaction, if it has one); None when the slot key is taken."""
    row = first(
        conn,
        INSERT_RUN,
        (
            run.tenant,
            run.schedule_id,
            run.schedule_name,
            run.slot_key,
            run.slot_at,
            run.due_at,
            run.kind.value,
            dispatched_at,
            run.node_id,
        ),
    )
    return None if row is None else int(row[0])


class PostgresRunLedger:
    def __init__(self, pool: PgPool) -> None:
        self._pool = pool

    def record(self, run: NewRun, dispatched_at: int) -> Run:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            run_id = insert_run(conn, run, dispatched_at)
        if run_id is None:
            raise DuplicateSlot(run.slot_key)
        return Run(
            id=run_id,
            tenant=run.tenant,
            schedule_id=run.schedule_id,
            schedule_name=run.schedule_name,
            slot_key=run.slot_key,
            slot_at=run.slot_at,
            due_at=run.due_at,
            kind=run.kind,
            state=RunState.DISPATCHED,
            dispatched_at=dispatched_at,
            node_id=run.node_id,
        )

    def find_by_slot(self, tenant: str | None, slot_key: str) -> Run | None:
        at = slot_instant(slot_key)
        if at is None:
            return None  # not a key this engine writes
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE slot_at = %s AND slot_key = %s"
        args: tuple[Any, ...] = (at, slot_key)
        if tenant is not None:
            sql += " AND tenant = %s"
            args += (tenant,)
        return self._one(sql, args)

    def get(self, run_id: int, tenant: str | None = None) -> Run | None:
        if not 0 < run_id < 2**63:
            return None  # not an id a BIGINT can hold
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE id = %s"
        args: tuple[Any, ...] = (run_id,)
        if tenant is not None:
            sql += " AND tenant = %s"
            args += (tenant,)
        return self._one(sql, args)

    def state_of(self, tenant: str | None, slot_key: str) -> RunState | None:
        run = self.find_by_slot(tenant, slot_key)
        return None if run is None else run.state

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
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), sql, args)
        return {sid: int(at) for sid, at in found if at is not None}

    def query(self, query: RunQuery) -> list[Run]:
        clauses: list[str] = []
        args: list[Any] = []
        if query.tenant is not None:
            clauses.append("tenant = %s")
            args.append(query.tenant)
        scoped, scope_args = tenants_clause("tenant", query.tenants)
        if scoped is not None:
            clauses.append(scoped)
            args += scope_args
        if query.schedule_id is not None:
            clauses.append("schedule_id = %s")
            args.append(query.schedule_id)
        if query.state is not None:
            clauses.append("state = %s")
            args.append(query.state.value)
        if query.since_ms is not None:
            clauses.append("slot_at >= %s")
            args.append(query.since_ms)
        if query.until_ms is not None:
            clauses.append("slot_at < %s")
            args.append(query.until_ms)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        # One schedule's runs come newest slot first through its index; the whole ledger in
        # the order of dispatch, newest first, through the primary key (no index on time).
        order = "slot_at DESC, id DESC" if query.schedule_id is not None else "id DESC"
        sql = f"SELECT {RUN_COLUMNS} FROM runs {where} ORDER BY {order} LIMIT %s"
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), sql, (*args, query.limit))
        return [run_from_row(r) for r in found]

    def count(self, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            if tenant is None:
                return int(scalar(conn, "SELECT count(*) FROM runs"))
            return int(scalar(conn, "SELECT count(*) FROM runs WHERE tenant = %s", (tenant,)))

    def _one(self, sql: str, args: tuple[Any, ...]) -> Run | None:
        with storage_errors(self._pool.where):
            row = first(self._pool.get(), sql, args)
        return None if row is None else run_from_row(row)
