"""The run ledger on either SQL backend: the insert, and the reads, one SQL for both. How a
new run's id comes back (SQLite's last row id in its write transaction, PostgreSQL's
RETURNING) stays in each backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from engine.backends.codec import RUN_COLUMNS, run_from_row
from engine.backends.sql import Dialect, SqlPool, Where, count, first
from engine.domain.run import NewRun, Run, RunState
from engine.domain.slots import slot_instant
from engine.ports.runs import RunQuery

P = TypeVar("P", bound=SqlPool[Any])


def insert_run_sql(mark: str) -> str:
    """The insert of one new run, its values `new_run_values`: the unique slot key decides,
    a taken key inserts nothing."""
    return (
        "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, "
        f"state, dispatched_at, node_id) VALUES ({', '.join([mark] * 7)}, 'dispatched', "
        f"{mark}, {mark}) ON CONFLICT (slot_at, slot_key, tenant) DO NOTHING"
    )


def new_run_values(run: NewRun, dispatched_at: int) -> tuple[Any, ...]:
    """The parameters of insert_run_sql."""
    return (
        run.tenant,
        run.schedule_id,
        run.schedule_name,
        run.slot_key,
        run.slot_at,
        run.due_at,
        run.kind.value,
        dispatched_at,
        run.node_id,
    )


def recorded(run: NewRun, run_id: int, dispatched_at: int) -> Run:
    """`run` as inserted, with id `run_id`."""
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


def run_query_sql(query: RunQuery, dialect: Dialect) -> tuple[str, list[Any]]:
    """The SELECT answering `query`, and its parameters."""
    m = dialect.mark
    where = Where(dialect)
    where.equal("tenant", query.tenant)
    where.scope("tenant", query.tenants)
    where.equal("schedule_id", query.schedule_id)
    where.equal("state", None if query.state is None else query.state.value)
    if query.since_ms is not None:
        where.add(f"slot_at >= {m}", query.since_ms)
    if query.until_ms is not None:
        where.add(f"slot_at < {m}", query.until_ms)
    # One schedule's runs come newest slot first through its index; the whole ledger in
    # the order of dispatch, newest first, through the primary key (no index on time).
    order = "slot_at DESC, id DESC" if query.schedule_id is not None else "id DESC"
    sql = f"SELECT {RUN_COLUMNS} FROM runs {where} ORDER BY {order} LIMIT {m}"
    return sql, [*where.args, query.limit]


class SqlRunLedger(Generic[P]):
    """The ledger's reads; a backend adds `record` and `last_slots`."""

    def __init__(self, pool: P) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def find_by_slot(self, tenant: str | None, slot_key: str) -> Run | None:
        at = slot_instant(slot_key)
        if at is None:
            return None  # not a key this engine writes
        m = self._mark
        return self._one(f"slot_at = {m} AND slot_key = {m}", (at, slot_key), tenant)

    def get(self, run_id: int, tenant: str | None = None) -> Run | None:
        if not 0 < run_id < 2**63:
            return None  # not an id either database can hold (a signed 64-bit integer)
        return self._one(f"id = {self._mark}", (run_id,), tenant)

    def state_of(self, tenant: str | None, slot_key: str) -> RunState | None:
        run = self.find_by_slot(tenant, slot_key)
        return None if run is None else run.state

    def query(self, query: RunQuery) -> list[Run]:
        sql, args = run_query_sql(query, self._pool.dialect)
        return [run_from_row(r) for r in self._pool.read(sql, args)]

    def count(self, tenant: str | None = None) -> int:
        return count(self._pool, "runs", "tenant", tenant)

    def _one(self, condition: str, args: Sequence[Any], tenant: str | None) -> Run | None:
        """The run meeting `condition` (and of `tenant`, unless None)."""
        sql = f"SELECT {RUN_COLUMNS} FROM runs WHERE {condition}"
        if tenant is not None:
            sql += f" AND tenant = {self._mark}"
            args = (*args, tenant)
        row = first(self._pool, sql, args)
        return None if row is None else run_from_row(row)
