"""Atomic, fenced dispatch of due slots: the engine's hot path.

One BEGIN IMMEDIATE transaction per batch: the lease check, the due scan, the run and fire rows
and the cursor moves commit together or not at all. Because SQLite has one writer at a time, the
lease cannot change hands between the check and the commit.
"""

from __future__ import annotations

from collections.abc import Sequence

import apsw

from engine.backends.fairness import fair_share
from engine.backends.sql.dispatch import (
    ACTIVE,
    DUE_COLUMNS,
    TENANTS,
    SqlDispatcher,
    check_fence,
    check_shard,
    fired,
    plan_due,
)
from engine.backends.sql.fire_rows import insert_fire_sql
from engine.backends.sqlite.audit import SqliteAuditLog, append_in
from engine.backends.sqlite.connection import ConnectionPool, Row, first, rows, scalar
from engine.backends.sqlite.runs import NEXT_RUN_ID
from engine.domain.errors import InvalidInput
from engine.ports.dispatch import DispatchReport, Resolver

# Kept importable from here (benchmarks build their batches with it).
__all__ = ["SqliteDispatcher", "fired"]

_DUE = (
    f"SELECT {DUE_COLUMNS} FROM schedules WHERE {ACTIVE} AND next_fire_at <= ? "
    "ORDER BY next_fire_at LIMIT ?"
)
# One tenant's due schedules, through `schedules_due_by_tenant`.
_DUE_IN_TENANT = (
    f"SELECT {DUE_COLUMNS} FROM schedules WHERE {ACTIVE} AND tenant = ? "
    "AND next_fire_at <= ? ORDER BY next_fire_at LIMIT ?"
)
_INSERT_RUNS = (
    "INSERT INTO runs (id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, "
    "state, dispatched_at, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, 'scheduled', 'dispatched', ?, ?) "
    "ON CONFLICT (slot_at, slot_key, tenant) DO NOTHING"
)
_INSERT_FIRES = insert_fire_sql("?")
# A cursor move, an Advance: (next_slot_at, next_fire_at, schedule id).
_ADVANCE = "UPDATE schedules SET next_slot_at = ?, next_fire_at = ? WHERE id = ?"


class SqliteDispatcher(SqlDispatcher[ConnectionPool]):
    def __init__(self, pool: ConnectionPool, audit: SqliteAuditLog) -> None:
        # The store's clock, read again before the fires are written, for their
        # dispatched_at: a transaction that waited records when it wrote, not its step's start.
        super().__init__(pool)
        self._audit = audit
        self._clock = audit.clock

    def _shard(self, shard: tuple[int, int] | None) -> tuple[str, dict[str, int]]:
        check_shard(shard)
        if shard is not None and shard[1] > 1:
            raise InvalidInput(
                f"lease shards need PostgreSQL (asked for shard {shard[0]} of {shard[1]}): "
                "one SQLite file has one writer at a time, so one leader dispatches everything"
            )
        return "", {}

    def dispatch_due(
        self,
        *,
        lease_key: str,
        token: str,
        node_id: str,
        now_ms: int,
        limit: int,
        resolve: Resolver,
        until_ms: int | None = None,
        tenant_cap: int | None = None,
        shard: tuple[int, int] | None = None,
    ) -> DispatchReport:
        self._shard(shard)
        report = DispatchReport()
        with self._pool.transaction() as conn:
            lease = first(conn, "SELECT token, expires_at FROM leases WHERE key = ?", (lease_key,))
            check_fence(lease_key, token, now_ms, lease)
            until = now_ms if until_ms is None else until_ms
            due = rows(conn, _DUE, (until, limit))
            if tenant_cap:
                due = self._fair(conn, due, until, limit, tenant_cap, report)
            # We hold the write lock: nobody else can insert runs until we commit, so the ids
            # can be handed out here and the rows written with executemany.
            first_id = int(scalar(conn, NEXT_RUN_ID))
            self._load_definitions(conn, due)
            planned, advances = plan_due(
                due, self._definition, resolve, now_ms, node_id, limit, report
            )
            # After any wait for the write lock (busy timeout): when the fires are written.
            written_at = max(now_ms, self._clock.now_ms())
            runs = [
                fire._replace(run_id=first_id + n, dispatched_at=written_at)
                for n, (fire, _, _) in enumerate(planned)
            ]
            fires = [
                (r.run_id, r.tenant, r.schedule_id, r.slot_at, cmd, payload, r.due_at, written_at)
                for r, (_, cmd, payload) in zip(runs, planned, strict=True)
            ]
            before = conn.total_changes()
            conn.executemany(_INSERT_RUNS, runs)
            if conn.total_changes() - before != len(runs):
                # Some slots were dispatched before (a crash after commit, a stale cursor):
                # their keys are taken, so those runs were not inserted. Keep only the new.
                landed = {
                    int(r[0]) for r in rows(conn, "SELECT id FROM runs WHERE id >= ?", (first_id,))
                }
                report.already_dispatched = len(runs) - len(landed)
                runs = [r for r in runs if r[0] in landed]
                fires = [f for f in fires if f[0] in landed]
            conn.executemany(_INSERT_FIRES, fires)
            conn.executemany(_ADVANCE, advances)
            # The batch's audit entry commits with its fires: no fire without its record.
            append_in(conn, fired(runs), written_at, self._audit)
        report.dispatched = runs
        return report

    @staticmethod
    def _fair(
        conn: apsw.Connection,
        due: list[Row],
        until: int,
        limit: int,
        cap: int,
        report: DispatchReport,
    ) -> list[Row]:
        """The due schedules of this transaction, at most `cap` per tenant while another
        tenant has schedules due (see engine.backends.fairness)."""

        def due_in(tenants: Sequence[str], n: int) -> list[Row]:
            return [r for t in tenants for r in rows(conn, _DUE_IN_TENANT, (t, until, n))]

        return fair_share(
            due, limit, cap, report, lambda: [r[0] for r in rows(conn, TENANTS)], due_in
        )
