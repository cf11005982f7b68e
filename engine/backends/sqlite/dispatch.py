"""Atomic, fenced dispatch of due slots: the engine's hot path.

One BEGIN IMMEDIATE transaction per batch: the lease check, the due scan, the run and fire rows
and the cursor moves commit together or not at all. Because SQLite has one writer at a time, the
lease cannot change hands between the check and the commit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import apsw

from engine.backends.codec import SCHEDULE_COLUMNS, schedule_from_row
from engine.backends.fairness import fair_share
from engine.backends.sqlite.audit import SqliteAuditLog, append_in
from engine.backends.sqlite.connection import (
    ConnectionPool,
    Row,
    first,
    rows,
    scalar,
    storage_errors,
    write_tx,
)
from engine.domain.audit import AuditEvent
from engine.domain.errors import InvalidInput, LeaseExpired, LeaseNotOwned, VortosError
from engine.domain.misfire import due_at
from engine.domain.schedule import Schedule, canonical_json
from engine.domain.slots import slot_key
from engine.ports.dispatch import DispatchedFire, DispatchReport, Resolver

_ACTIVE = "status = 'active' AND next_fire_at IS NOT NULL"
_DUE_COLUMNS = "id, version, next_slot_at, tenant, next_fire_at"
_DUE = (
    f"SELECT {_DUE_COLUMNS} FROM schedules WHERE {_ACTIVE} AND next_fire_at <= ? "
    "ORDER BY next_fire_at LIMIT ?"
)
# One tenant's due schedules, through `schedules_due_by_tenant`.
_DUE_IN_TENANT = (
    f"SELECT {_DUE_COLUMNS} FROM schedules WHERE {_ACTIVE} AND tenant = ? "
    "AND next_fire_at <= ? ORDER BY next_fire_at LIMIT ?"
)
# The tenants with any active schedule, one index seek each (a skip scan), not a table scan.
_TENANTS = (
    "WITH RECURSIVE t(name) AS ("
    f"SELECT (SELECT min(tenant) FROM schedules WHERE {_ACTIVE}) "
    f"UNION ALL SELECT (SELECT min(tenant) FROM schedules WHERE {_ACTIVE} AND tenant > t.name) "
    "FROM t WHERE t.name IS NOT NULL) SELECT name FROM t WHERE name IS NOT NULL"
)
_INSERT_RUNS = (
    "INSERT INTO runs (id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, "
    "state, dispatched_at, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, 'scheduled', 'dispatched', ?, ?) "
    "ON CONFLICT (slot_at, slot_key, tenant) DO NOTHING"
)
_INSERT_FIRES = (
    "INSERT INTO fire_queue (run_id, tenant, schedule_id, slot_at, command, payload, "
    "available_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_ADVANCE = "UPDATE schedules SET next_slot_at = ?, next_fire_at = ? WHERE id = ?"
# A schedule whose definition cannot be read or resolved is looked at again after this long.
RETRY_BROKEN_MS = 60_000
# Decoded definitions of recently due schedules. Bounded: the daemon must not hold every
# schedule in memory when a million are stored.
_CACHE_SIZE = 50_000


def fired(run: DispatchedFire) -> AuditEvent:
    return AuditEvent(
        "fire.dispatched",
        actor=run.node_id,
        tenant=run.tenant,
        schedule_id=run.schedule_id,
        slot_key=run.slot_key,
        data={"run": run.run_id, "slot_at": run.slot_at, "due_at": run.due_at},
    )


# A planned fire (its run id 0 until the run is written), with its command and payload.
Planned = tuple[DispatchedFire, str, str]
# A cursor move, in the order of _ADVANCE: (next_slot_at, next_fire_at, schedule id).
Advance = tuple[int | None, int | None, str]


def plan_due(
    due: Sequence[Row],
    definition: Callable[[str, int], tuple[Schedule, str]],
    resolve: Resolver,
    now_ms: int,
    node_id: str,
    limit: int,
    report: DispatchReport,
) -> tuple[list[Planned], list[Advance]]:
    """Without I/O but through `definition` (schedule id, version -> the schedule and its
    payload as stored): the fires of the due schedules (rows of the due scan, soonest first),
    at most about `limit`, and the cursor moves; what was skipped, dropped, held back or left
    for the next transaction goes into `report`."""
    planned: list[Planned] = []
    advances: list[Advance] = []
    for sid, version, cursor, _tenant, _due in due:
        if len(planned) >= limit:
            report.truncated = True  # the rest stay due for the next transaction
            break
        report.scanned += 1
        try:
            schedule, payload = definition(sid, version)
            plan = resolve(schedule, cursor)
        except (VortosError, ValueError, KeyError, TypeError) as exc:
            # One unreadable definition must not stop every other schedule: hold it back for
            # a while, cursor untouched, and say so.
            report.failed[sid] = f"{type(exc).__name__}: {exc}"
            advances.append((cursor, now_ms + RETRY_BROKEN_MS, sid))
            continue
        if plan.skipped_missed or plan.dropped_aged:
            report.plans[f"{schedule.tenant}/{schedule.name}"] = plan
        report.skipped_missed += plan.skipped_missed
        report.dropped_aged += plan.dropped_aged
        tenant, name, tz = schedule.tenant, schedule.name, schedule.timezone
        for slot_at in plan.fire:
            key = slot_key(sid, slot_at, tz)
            due_instant = due_at(sid, slot_at, tz, schedule.jitter_ms)
            fire = DispatchedFire(0, tenant, sid, name, key, slot_at, due_instant, now_ms, node_id)
            planned.append((fire, schedule.command, payload))
        advances.append((plan.next_slot_at, plan.next_fire_at, sid))
    return planned, advances


def check_shard(shard: tuple[int, int] | None) -> None:
    """Refuse a shard (index, count) that does not exist."""
    if shard is not None and (shard[1] < 1 or not 0 <= shard[0] < shard[1]):
        raise InvalidInput(
            f"shard {shard[0]} of {shard[1]} does not exist: shards are numbered 0 to count - 1"
        )


def _refuse_shards(shard: tuple[int, int] | None) -> None:
    check_shard(shard)
    if shard is not None and shard[1] > 1:
        raise InvalidInput(
            f"lease shards need PostgreSQL (asked for shard {shard[0]} of {shard[1]}): "
            "one SQLite file has one writer at a time, so one leader dispatches everything"
        )


class SqliteDispatcher:
    def __init__(self, pool: ConnectionPool, audit: SqliteAuditLog) -> None:
        self._pool = pool
        self._audit = audit
        self._definitions: OrderedDict[str, tuple[int, Schedule, str]] = OrderedDict()

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
        _refuse_shards(shard)
        conn = self._pool.get()
        report = DispatchReport()
        with storage_errors(self._pool.path), write_tx(conn):
            lease = first(conn, "SELECT token, expires_at FROM leases WHERE key = ?", (lease_key,))
            if lease is None or lease[0] != token:
                raise LeaseNotOwned(f"lease {lease_key} is not held by this node")
            if lease[1] <= now_ms:
                raise LeaseExpired(f"lease {lease_key} expired before dispatch")
            until = now_ms if until_ms is None else until_ms
            due = rows(conn, _DUE, (until, limit))
            if tenant_cap:
                due = self._fair(conn, due, until, limit, tenant_cap, report)
            # We hold the write lock: nobody else can insert runs until we commit, so the ids
            # can be handed out here and the rows written with executemany.
            first_id = int(scalar(conn, "SELECT coalesce(max(id), 0) FROM runs")) + 1
            planned, advances = plan_due(
                due, self._definition, resolve, now_ms, node_id, limit, report
            )
            runs = [fire._replace(run_id=first_id + n) for n, (fire, _, _) in enumerate(planned)]
            fires = [
                (r.run_id, r.tenant, r.schedule_id, r.slot_at, cmd, payload, r.due_at, now_ms)
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
            # Each fire's audit entry commits with it: no fire without its record.
            append_in(conn, [fired(run) for run in runs], now_ms, self._audit.keys())
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
            due, limit, cap, report, lambda: [r[0] for r in rows(conn, _TENANTS)], due_in
        )

    def next_due_at(self, shard: tuple[int, int] | None = None) -> int | None:
        _refuse_shards(shard)
        with storage_errors(self._pool.path):
            row = (
                self._pool.get()
                .execute(
                    "SELECT min(next_fire_at) FROM schedules "
                    "WHERE status = 'active' AND next_fire_at IS NOT NULL"
                )
                .fetchall()
            )
        return None if row[0][0] is None else int(row[0][0])

    def _definition(self, schedule_id: str, version: int) -> tuple[Schedule, str]:
        cached = self._definitions.get(schedule_id)
        if cached is not None and cached[0] == version:
            self._definitions.move_to_end(schedule_id)
            return cached[1], cached[2]
        # Read inside the caller's transaction: the row was just returned by the due scan.
        row = first(
            self._pool.get(),
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?",
            (schedule_id,),
        )
        assert row is not None
        schedule = schedule_from_row(row)
        payload = canonical_json(dict(schedule.payload))
        self._definitions[schedule_id] = (version, schedule, payload)
        if len(self._definitions) > _CACHE_SIZE:
            self._definitions.popitem(last=False)
        return schedule, payload
