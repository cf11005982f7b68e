"""The run ledger in SQLite."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

from engine.backends.codec import RUN_COLUMNS, run_from_row
from engine.backends.sqlite.connection import (
    ConnectionPool,
    first,
    rows,
    scalar,
    storage_errors,
    tenants_clause,
    write_tx,
)
from engine.domain.errors import DuplicateSlot
from engine.domain.run import NewRun, Run, RunState
from engine.domain.slots import slot_instant
from engine.ports.runs import RunQuery

INSERT_RUN = (
    "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, "
    "state, dispatched_at, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, 'dispatched', ?, ?) "
    "ON CONFLICT (slot_at, slot_key, tenant) DO NOTHING"
)


def insert_run(conn: apsw.Connection, run: NewRun, dispatched_at: int) -> int | None:
    """Insert inside the caller's transaction; None when the slot key is taken."""
    conn.execute(
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
    if conn.changes() == 0:
        return None
    return int(conn.last_insert_rowid())


class SqliteRunLedger:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def record(self, run: NewRun, dispatched_at: int) -> Run:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
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
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE slot_at = ? AND slot_key = ?"
        args: tuple[Any, ...] = (at, slot_key)
        if tenant is not None:
            sql += " AND tenant = ?"
            args += (tenant,)
        with storage_errors(self._pool.path):
            row = first(self._pool.get(), sql, args)
        return None if row is None else run_from_row(row)

    def get(self, run_id: int, tenant: str | None = None) -> Run | None:
        if not 0 < run_id < 2**63:
            return None  # not an id SQLite can hold
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"
        args: tuple[Any, ...] = (run_id,)
        if tenant is not None:
            sql += " AND tenant = ?"
            args += (tenant,)
        with storage_errors(self._pool.path):
            row = first(self._pool.get(), sql, args)
        return None if row is None else run_from_row(row)

    def state_of(self, tenant: str | None, slot_key: str) -> RunState | None:
        run = self.find_by_slot(tenant, slot_key)
        return None if run is None else run.state

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

    def query(self, query: RunQuery) -> list[Run]:
        clauses: list[str] = []
        args: list[Any] = []
        if query.tenant is not None:
            clauses.append("tenant = ?")
            args.append(query.tenant)
        scoped, scope_args = tenants_clause("tenant", query.tenants)
        if scoped is not None:
            clauses.append(scoped)
            args += scope_args
        if query.schedule_id is not None:
            clauses.append("schedule_id = ?")
            args.append(query.schedule_id)
        if query.state is not None:
            clauses.append("state = ?")
            args.append(query.state.value)
        if query.since_ms is not None:
            clauses.append("slot_at >= ?")
            args.append(query.since_ms)
        if query.until_ms is not None:
            clauses.append("slot_at < ?")
            args.append(query.until_ms)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        # One schedule's runs come newest slot first through its index; the whole ledger in
        # the order of dispatch, newest first, through the row id (no index on time).
        order = "slot_at DESC, id DESC" if query.schedule_id is not None else "id DESC"
        sql = f"SELECT {RUN_COLUMNS} FROM runs {where} ORDER BY {order} LIMIT ?"
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), sql, (*args, query.limit))
        return [run_from_row(r) for r in found]

    def count(self, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.path):
            if tenant is None:
                return int(scalar(conn, "SELECT count(*) FROM runs"))
            return int(scalar(conn, "SELECT count(*) FROM runs WHERE tenant = ?", (tenant,)))
