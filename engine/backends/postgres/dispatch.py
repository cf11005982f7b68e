"""Atomic, fenced dispatch of due slots on PostgreSQL: the engine's hot path.

One transaction per batch, in a fixed number of round trips whatever the number of fires:
the lease check, the due scan, the definitions not cached, one statement writing every run,
fire and cursor move, and the audit entries (see audit.append_in).

Nothing serialises writers globally here, so the transaction takes the locks its guarantee
needs:
- the lease row FOR SHARE: an acquirer's update of the row waits for this transaction to end,
  so the lease cannot change hands between the check and the commit (fencing). That lock must
  never outlive the lease: the statement that takes it limits the transaction's statements,
  lock waits and idle time to the lease's remaining life, so a leader frozen (SIGSTOP) or cut
  off mid-transaction has its session ended by the server by the time its lease expires, and
  a standby takes over the row then, not whenever the leader thaws;
- the due schedules FOR UPDATE SKIP LOCKED: a row an operator is changing is left for the next
  transaction instead of waited on, and the rows locked are re-read as they are now;
- the runs' unique slot key: a slot dispatched before (a crash after commit, a stale cursor,
  another leader's transaction) inserts nothing and counts as already dispatched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.backends.fairness import fair_share
from engine.backends.postgres.audit import PostgresAuditLog, append_in
from engine.backends.postgres.connection import PgPool, Row, rows
from engine.backends.sql.dispatch import (
    ACTIVE,
    DUE_COLUMNS,
    TENANTS,
    Advance,
    Planned,
    SqlDispatcher,
    check_fence,
    check_shard,
    fired,
    plan_due,
)
from engine.ports.dispatch import DispatchReport, Resolver

if TYPE_CHECKING:
    import psycopg

# The transaction's own cursor moves wake nobody (see the schema's notify trigger): only the
# leader acts on them. Set in the statement that checks the lease, to save a round trip, with
# the limits that keep this transaction's lock on the row from outliving the lease (the
# lease's remaining life, at least _MIN_LIMIT_MS: a limit of 0 would mean none).
_LIMIT = "greatest(%(floor)s, expires_at - %(now)s)::text"
_FENCE = (
    "SELECT set_config('vortos.quiet', 'on', true), token, expires_at, "
    f"set_config('idle_in_transaction_session_timeout', {_LIMIT}, true), "
    f"set_config('statement_timeout', {_LIMIT}, true), "
    f"set_config('lock_timeout', {_LIMIT}, true) "
    "FROM leases WHERE key = %(key)s FOR SHARE"
)
_MIN_LIMIT_MS = 100
_SHARD = " AND mod(shard_key, %(count)s) = %(index)s"
_DUE = (
    f"SELECT {DUE_COLUMNS} FROM schedules WHERE {ACTIVE} AND next_fire_at <= %(until)s"
    "{shard} ORDER BY next_fire_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
)
# Up to n due schedules of each tenant, through `schedules_due_by_tenant`.
_DUE_IN_TENANTS = (
    "SELECT d.* FROM unnest(%(tenants)b::text[]) AS t(name) CROSS JOIN LATERAL ("
    f"SELECT {DUE_COLUMNS} FROM schedules WHERE {ACTIVE} AND tenant = t.name "
    "AND next_fire_at <= %(until)s{shard} ORDER BY next_fire_at LIMIT %(n)s "
    "FOR UPDATE SKIP LOCKED) AS d"
)
# Every run, fire and cursor move of the transaction in one statement. A run whose slot key is
# taken is not inserted, so it returns no id and gets no fire. The fire queue's key refers to
# runs inserted by the same statement: its check runs at the statement's end. Arrays go in
# binary (%b): psycopg writes a long list as text several times slower than this runs.
_WRITE = (
    "WITH planned AS (SELECT * FROM unnest(%(tenant)b::text[], %(schedule_id)b::text[], "
    "%(schedule_name)b::text[], %(slot_key)b::text[], %(slot_at)b::bigint[], "
    "%(due_at)b::bigint[], %(command)b::text[], %(payload)b::text[]) "
    "AS p(tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, command, payload)), "
    "landed AS (INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, "
    "due_at, kind, state, dispatched_at, node_id) SELECT tenant, schedule_id, schedule_name, "
    "slot_key, slot_at, due_at, 'scheduled', 'dispatched', %(now)s, %(node)s FROM planned "
    "ON CONFLICT (slot_at, slot_key, tenant) DO NOTHING RETURNING id, tenant, slot_at, slot_key), "
    "queued AS (INSERT INTO fire_queue (run_id, tenant, schedule_id, slot_at, command, payload, "
    "available_at, created_at) SELECT l.id, p.tenant, p.schedule_id, p.slot_at, p.command, "
    "p.payload, p.due_at, %(now)s FROM landed AS l JOIN planned AS p "
    "USING (tenant, slot_at, slot_key)), "
    "moved AS (UPDATE schedules AS s SET next_slot_at = m.next_slot_at, "
    "next_fire_at = m.next_fire_at FROM unnest(%(moved_id)b::text[], "
    "%(next_slot_at)b::bigint[], %(next_fire_at)b::bigint[]) "
    "AS m(id, next_slot_at, next_fire_at) WHERE s.id = m.id) "
    "SELECT id, tenant, slot_key FROM landed"
)


def _shard_args(shard: tuple[int, int] | None) -> tuple[str, dict[str, int]]:
    """The due scan's shard condition and its arguments (none when not sharded)."""
    check_shard(shard)
    if shard is None or shard[1] == 1:
        return "", {}
    return _SHARD, {"index": shard[0], "count": shard[1]}


def _rows(conn: psycopg.Connection[Row], sql: str, args: Mapping[str, Any]) -> list[Row]:
    """Rows of a query with named arguments."""
    return conn.execute(sql, args).fetchall()


class PostgresDispatcher(SqlDispatcher[PgPool]):
    def __init__(self, pool: PgPool, audit: PostgresAuditLog) -> None:
        # The store's clock, read again before the fires are written, for their
        # dispatched_at: a transaction that waited records when it wrote, not its step's start.
        super().__init__(pool)
        self._audit = audit
        self._clock = audit.clock

    def _shard(self, shard: tuple[int, int] | None) -> tuple[str, dict[str, int]]:
        return _shard_args(shard)

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
        sharded, shard_args = _shard_args(shard)
        self._audit.keys()  # before any lock is taken: it may have to be loaded
        report = DispatchReport()
        with self._pool.transaction() as conn:
            fence = _rows(conn, _FENCE, {"key": lease_key, "now": now_ms, "floor": _MIN_LIMIT_MS})
            lease = fence[0] if fence else None
            check_fence(lease_key, token, now_ms, None if lease is None else (lease[1], lease[2]))
            until = now_ms if until_ms is None else until_ms
            due = _rows(
                conn, _DUE.format(shard=sharded), {"until": until, "limit": limit, **shard_args}
            )
            if tenant_cap:
                due = self._fair(conn, due, until, limit, tenant_cap, report, shard)
            if not due:
                return report
            self._load_definitions(conn, due)
            plans, moves = plan_due(due, self._definition, resolve, now_ms, node_id, limit, report)
            # The instant the fires are written, after any wait of this transaction (for the
            # lease row, a schedule's row): their dispatched_at, and what lateness is of.
            written_at = max(now_ms, self._clock.now_ms())
            landed = self._write(conn, plans, moves, written_at, node_id)
            runs = [
                fire._replace(run_id=landed[(fire.tenant, fire.slot_key)], dispatched_at=written_at)
                for fire in (plan[0] for plan in plans)
                if (fire.tenant, fire.slot_key) in landed
            ]
            report.already_dispatched = len(plans) - len(runs)
            # The batch's audit entry commits with its fires: no fire without its record.
            append_in(conn, fired(runs), written_at, self._audit)
        report.dispatched = runs
        return report

    @staticmethod
    def _write(
        conn: psycopg.Connection[Row],
        plans: Sequence[Planned],
        moves: Sequence[Advance],
        now_ms: int,
        node_id: str,
    ) -> dict[tuple[str, str], int]:
        """Write the runs, fires and cursor moves; the new run ids by (tenant, slot key)."""
        fires = [plan[0] for plan in plans]
        landed = _rows(
            conn,
            _WRITE,
            {
                "tenant": [f.tenant for f in fires],
                "schedule_id": [f.schedule_id for f in fires],
                "schedule_name": [f.schedule_name for f in fires],
                "slot_key": [f.slot_key for f in fires],
                "slot_at": [f.slot_at for f in fires],
                "due_at": [f.due_at for f in fires],
                "command": [plan[1] for plan in plans],
                "payload": [plan[2] for plan in plans],
                "now": now_ms,
                "node": node_id,
                "next_slot_at": [m[0] for m in moves],
                "next_fire_at": [m[1] for m in moves],
                "moved_id": [m[2] for m in moves],
            },
        )
        return {(tenant, key): int(run_id) for run_id, tenant, key in landed}

    @staticmethod
    def _fair(
        conn: psycopg.Connection[Row],
        due: list[Row],
        until: int,
        limit: int,
        cap: int,
        report: DispatchReport,
        shard: tuple[int, int] | None,
    ) -> list[Row]:
        """The due schedules of this transaction, at most `cap` per tenant while another
        tenant has schedules due (see engine.backends.fairness)."""
        sharded, shard_args = _shard_args(shard)

        def due_in(tenants: Sequence[str], n: int) -> list[Row]:
            return _rows(
                conn,
                _DUE_IN_TENANTS.format(shard=sharded),
                {"tenants": list(tenants), "until": until, "n": n, **shard_args},
            )

        return fair_share(
            due, limit, cap, report, lambda: [r[0] for r in rows(conn, TENANTS)], due_in
        )
