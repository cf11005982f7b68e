"""The fire queue in SQLite: claim, heartbeat, settle, requeue, purge, enqueue.

Every call is one BEGIN IMMEDIATE transaction, so a claim's overlap decision and its claim are
one step: SQLite's single writer means two consumers cannot both see a schedule idle.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import apsw

from engine.backends.fire_rows import (
    CLEAR_CLAIM,
    FIRE_COLUMNS,
    FIRE_FROM,
    OPEN,
    claimable_clause,
    fire_from_row,
    settle_fire_sql,
    settle_fire_values,
    state_clause,
)
from engine.backends.sqlite.connection import (
    ConnectionPool,
    Row,
    rows,
    scalar,
    storage_errors,
    write_tx,
)
from engine.backends.sqlite.runs import insert_run
from engine.domain.clock import Clock
from engine.domain.overlap import Candidate, plan_claim
from engine.domain.run import NewRun, RunKind, RunState
from engine.domain.schedule import OverlapPolicy, ScheduleStatus, canonical_json
from engine.ports.fire_queue import (
    Claim,
    EnqueueReport,
    Fire,
    FireQuery,
    HeartbeatReport,
    NewFire,
    Outcome,
    Settlement,
    SettleReport,
)

_CLAIMABLE = claimable_clause(":now")
_CANDIDATE_COLUMNS = (
    "f.run_id, f.schedule_id, r.kind, s.overlap, s.status, f.available_at "
    "FROM fire_queue f JOIN runs r ON r.id = f.run_id LEFT JOIN schedules s ON s.id = f.schedule_id"
)
_COMMANDS = "f.command IN (SELECT value FROM json_each(:commands))"
_IDS = "(SELECT value FROM json_each(?))"
_SETTLE_FIRE = {outcome: settle_fire_sql(outcome, "?") for outcome in Outcome}


class SqliteFireQueue:
    def __init__(self, pool: ConnectionPool, clock: Clock) -> None:
        self._pool = pool
        self._clock = clock

    # -- consumers --------------------------------------------------------------------------

    def claim(
        self,
        *,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None = None,
    ) -> Claim:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            return self._claim_in(conn, consumer, ttl_ms, limit, commands)

    def settle_and_claim(
        self,
        settlements: Mapping[str, Sequence[Settlement]],
        *,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None = None,
    ) -> tuple[dict[str, SettleReport], Claim]:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            reports = {
                token: self._settle_in(conn, token, consumer, batch)
                for token, batch in settlements.items()
            }
            return reports, self._claim_in(conn, consumer, ttl_ms, limit, commands)

    def _claim_in(
        self,
        conn: apsw.Connection,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None,
    ) -> Claim:
        if ttl_ms <= 0:
            raise ValueError("a claim's TTL must be positive")
        now = self._clock.now_ms()
        claim = Claim(token=secrets.token_hex(16), consumer=consumer, claimed_till=now + ttl_ms)
        if limit <= 0:
            return claim
        args: dict[str, Any] = {"now": now}
        only = ""
        if commands is not None:
            args["commands"] = json.dumps(sorted(commands))
            only = f" AND {_COMMANDS}"
        running: dict[str, list[int]] = {}
        for sid, rid in conn.execute(
            "SELECT schedule_id, run_id FROM fire_queue "
            "WHERE lease_token IS NOT NULL AND consumed_till > ?",
            (now,),
        ):
            running.setdefault(sid, []).append(rid)
        found = self._candidates(conn, args, only, running, limit)
        plan = plan_claim(found, running, limit)
        self._apply_claim(conn, claim, plan.claim, now)
        self._finish_unrun(conn, plan.skip, RunState.SKIPPED, now)
        self._finish_unrun(conn, plan.cancel, RunState.CANCELLED, now)
        claim.skipped, claim.cancelled = plan.skip, plan.cancel
        for sid in plan.cancel_running:
            for rid in running.get(sid, []):
                conn.execute(
                    "UPDATE fire_queue SET cancel_requested_at = ? "
                    "WHERE run_id = ? AND cancel_requested_at IS NULL",
                    (now, rid),
                )
                claim.cancel_requested.append(rid)
        return claim

    def _candidates(
        self,
        conn: apsw.Connection,
        args: dict[str, Any],
        only: str,
        running: dict[str, list[int]],
        limit: int,
    ) -> list[Candidate]:
        found: dict[int, Row] = {}
        defined: dict[str, tuple[str | None, str | None]] = {}
        if running:
            for sid, overlap, status in conn.execute(
                f"SELECT id, overlap, status FROM schedules WHERE id IN {_IDS}",
                (json.dumps(sorted(running)),),
            ):
                defined[sid] = (overlap, status)
        # A running schedule whose fires may run beside it (allow, active) is claimed from like
        # any other. The other running schedules are left out of the general scan (a long
        # buffer-all backlog behind one running fire must not hide everyone else's fires) ...
        held = sorted(
            sid
            for sid in running
            if defined.get(sid) != (OverlapPolicy.ALLOW.value, ScheduleStatus.ACTIVE.value)
        )
        for row in conn.execute(
            f"SELECT {_CANDIDATE_COLUMNS} WHERE {_CLAIMABLE}{only} "
            "AND f.schedule_id NOT IN (SELECT value FROM json_each(:held)) "
            "ORDER BY f.available_at, f.run_id LIMIT :limit",
            {**args, "held": json.dumps(held), "limit": limit * 2 + 32},
        ):
            found[row[0]] = row
        # ... and looked at together (one statement, an index probe per schedule), except an
        # active buffer-all one, whose fires all simply wait. (A deleted schedule has no row:
        # its fires are read, to be skipped.)
        looked = [
            sid
            for sid in held
            if defined.get(sid) != (OverlapPolicy.BUFFER_ALL.value, ScheduleStatus.ACTIVE.value)
        ]
        if looked:
            for row in conn.execute(
                f"SELECT {_CANDIDATE_COLUMNS} WHERE "
                "f.schedule_id IN (SELECT value FROM json_each(:looked)) AND "
                f"{_CLAIMABLE}{only} ORDER BY f.available_at, f.run_id LIMIT :cap",
                {**args, "looked": json.dumps(looked), "cap": limit * 2 + 32},
            ):
                found[row[0]] = row
        ordered = sorted(found.values(), key=lambda r: (r[5], r[0]))
        return [
            Candidate(
                run_id=r[0],
                schedule_id=r[1],
                kind=RunKind(r[2]),
                policy=None if r[3] is None else OverlapPolicy(r[3]),
                active=r[4] == ScheduleStatus.ACTIVE.value,
            )
            for r in ordered
        ]

    def _apply_claim(
        self, conn: apsw.Connection, claim: Claim, run_ids: list[int], now: int
    ) -> None:
        if not run_ids:
            return
        ids = json.dumps(run_ids)
        # A fire still carrying a token was abandoned: its holder's claim ran out.
        conn.execute(
            "UPDATE fire_queue SET "
            "abandoned_count = abandoned_count + (lease_token IS NOT NULL), "
            "last_abandoned_by = CASE WHEN lease_token IS NOT NULL THEN consumed_by "
            "ELSE last_abandoned_by END, "
            "last_abandoned_at = CASE WHEN lease_token IS NOT NULL THEN consumed_till "
            "ELSE last_abandoned_at END, "
            "lease_token = ?, consumed_till = ?, consumed_by = ?, attempts = attempts + 1, "
            f"cancel_requested_at = NULL WHERE run_id IN {_IDS}",
            (claim.token, claim.claimed_till, claim.consumer, ids),
        )
        conn.execute(
            "UPDATE runs SET state = 'running', started_at = ?, consumer = ?, finished_at = NULL, "
            "exit_code = NULL, output = NULL, "
            "attempts = (SELECT attempts FROM fire_queue WHERE run_id = runs.id), "
            "abandoned = (SELECT abandoned_count FROM fire_queue WHERE run_id = runs.id) "
            f"WHERE id IN {_IDS}",
            (now, claim.consumer, ids),
        )
        claim.fires = [
            fire_from_row(r)
            for r in conn.execute(
                f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE f.run_id IN {_IDS} "
                "ORDER BY f.available_at, f.run_id",
                (ids,),
            )
        ]

    @staticmethod
    def _finish_unrun(
        conn: apsw.Connection, why: dict[int, str], state: RunState, now: int
    ) -> None:
        """Fires decided at claim time never to run (skipped, superseded)."""
        if not why:
            return
        conn.executemany(
            f"UPDATE fire_queue SET completed_at = ?, {CLEAR_CLAIM} WHERE run_id = ?",
            [(now, rid) for rid in why],
        )
        conn.executemany(
            "UPDATE runs SET state = ?, error = ?, finished_at = ? WHERE id = ?",
            [(state.value, reason, now, rid) for rid, reason in why.items()],
        )

    def heartbeat(self, token: str, ttl_ms: int, run_ids: Sequence[int]) -> HeartbeatReport:
        report = HeartbeatReport()
        if not run_ids:
            return report
        conn = self._pool.get()
        ids = json.dumps(list(run_ids))
        with storage_errors(self._pool.path), write_tx(conn):
            now = self._clock.now_ms()
            held = dict(
                conn.execute(
                    "SELECT run_id, cancel_requested_at FROM fire_queue "
                    f"WHERE lease_token = ? AND run_id IN {_IDS}",
                    (token, ids),
                )
            )
            conn.execute(
                f"UPDATE fire_queue SET consumed_till = ? WHERE lease_token = ? "
                f"AND run_id IN {_IDS}",
                (now + ttl_ms, token, ids),
            )
        for rid in run_ids:
            if rid not in held:
                report.stale.append(rid)
                continue
            report.extended.append(rid)
            if held[rid] is not None:
                report.cancel_requested.append(rid)
        return report

    def settle(self, token: str, consumer: str, settlements: Sequence[Settlement]) -> SettleReport:
        if not settlements:
            return SettleReport()
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            return self._settle_in(conn, token, consumer, settlements)

    def _settle_in(
        self,
        conn: apsw.Connection,
        token: str,
        consumer: str,
        settlements: Sequence[Settlement],
    ) -> SettleReport:
        report = SettleReport()
        if not settlements:
            return report
        ids = json.dumps([s.run_id for s in settlements])
        now = self._clock.now_ms()
        held = {
            r[0]
            for r in conn.execute(
                f"SELECT run_id FROM fire_queue WHERE lease_token = ? AND run_id IN {_IDS}",
                (token, ids),
            )
        }
        fire_updates: dict[Outcome, list[tuple[Any, ...]]] = {}
        run_updates: list[tuple[Any, ...]] = []
        stale_counted: list[tuple[Any, ...]] = []
        for s in settlements:
            if s.run_id not in held:
                report.stale.append(s.run_id)
                if s.outcome is not Outcome.RELEASE:
                    stale_counted.append((consumer, now, s.run_id))
                continue
            held.discard(s.run_id)  # a second settlement of one fire in a batch is stale
            report.acked.append(s.run_id)
            fire_updates.setdefault(s.outcome, []).append(settle_fire_values(s, now))
            finished = None if s.outcome is Outcome.RELEASE else (s.finished_at or now)
            run_updates.append(
                (s.run_state.value, s.error, s.output, s.exit_code, finished, s.run_id)
            )
        for outcome, values in fire_updates.items():
            conn.executemany(_SETTLE_FIRE[outcome], values)
        conn.executemany(
            "UPDATE runs SET state = ?, error = ?, output = ?, exit_code = ?, "
            "finished_at = ? WHERE id = ?",
            run_updates,
        )
        conn.executemany(
            "UPDATE fire_queue SET stale_ack_count = stale_ack_count + 1, "
            "last_stale_ack_by = ?, last_stale_ack_at = ? WHERE run_id = ?",
            stale_counted,
        )
        return report

    # -- manual fires -----------------------------------------------------------------------

    def enqueue(self, fires: Sequence[NewFire], *, available_at: int) -> EnqueueReport:
        report = EnqueueReport()
        if not fires:
            return report
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            now = self._clock.now_ms()
            for fire in fires:
                run_id = insert_run(
                    conn,
                    NewRun(
                        tenant=fire.tenant,
                        schedule_id=fire.schedule_id,
                        schedule_name=fire.schedule_name,
                        slot_key=fire.slot_key,
                        slot_at=fire.slot_at,
                        due_at=fire.due_at,
                        kind=fire.kind,
                        node_id=fire.node_id,
                    ),
                    now,
                )
                if run_id is None:
                    report.already.append(fire.slot_key)
                    continue
                conn.execute(
                    "INSERT INTO fire_queue (run_id, tenant, schedule_id, slot_at, command, "
                    "payload, available_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        fire.tenant,
                        fire.schedule_id,
                        fire.slot_at,
                        fire.command,
                        canonical_json(fire.payload),
                        available_at,
                        now,
                    ),
                )
                report.inserted.append(run_id)
        return report

    # -- operators --------------------------------------------------------------------------

    def get(self, run_id: int) -> Fire | None:
        found = self.read(FireQuery(run_ids=(run_id,), limit=1))
        return found[0] if found else None

    def read(self, query: FireQuery) -> list[Fire]:
        clauses: list[str] = []
        args: dict[str, Any] = {"now": self._clock.now_ms(), "limit": query.limit}
        if query.tenant is not None:
            clauses.append("f.tenant = :tenant")
            args["tenant"] = query.tenant
        if query.tenants is not None:
            # Named parameters here: one per tenant of the scope.
            names = [f"scope{i}" for i in range(len(query.tenants))]
            clauses.append(f"f.tenant IN ({', '.join(':' + n for n in names)})" if names else "0")
            args.update(zip(names, sorted(query.tenants), strict=True))
        if query.schedule_id is not None:
            clauses.append("f.schedule_id = :sid")
            args["sid"] = query.schedule_id
        if query.run_ids is not None:
            clauses.append("f.run_id IN (SELECT value FROM json_each(:ids))")
            args["ids"] = json.dumps(list(query.run_ids))
        if query.states:
            ordered = sorted(query.states)
            either = " OR ".join(f"({state_clause(s, ':now')})" for s in ordered)
            clauses.append(f"({either})")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} {where} ORDER BY f.run_id LIMIT :limit"
        with storage_errors(self._pool.path):
            return [fire_from_row(r) for r in self._pool.get().execute(sql, args)]

    def requeue(self, run_ids: Sequence[int] | None, *, at: int, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            # Never a completed fire: that would run a completed run again.
            where, args = self._selection(run_ids, tenant, dead_only=run_ids is None)
            targets = [
                r[0] for r in conn.execute(f"SELECT f.run_id FROM fire_queue f {where}", args)
            ]
            if not targets:
                return 0
            ids = json.dumps(targets)
            conn.execute(
                f"UPDATE fire_queue SET available_at = ?, discarded_at = NULL, "
                f"discard_reason = NULL, consecutive_failures = 0, "
                f"requeued_at_attempt = attempts, {CLEAR_CLAIM} WHERE run_id IN {_IDS}",
                (at, ids),
            )
            conn.execute(
                "UPDATE runs SET state = 'dispatched', finished_at = NULL "
                f"WHERE id IN {_IDS} AND state <> 'dispatched'",
                (ids,),
            )
        return len(targets)

    def purge(self, run_ids: Sequence[int] | None, *, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            where, args = self._selection(run_ids, tenant, dead_only=True)
            conn.execute(f"DELETE FROM fire_queue AS f {where}", args)
            return int(conn.changes())

    @staticmethod
    def _selection(
        run_ids: Sequence[int] | None, tenant: str | None, *, dead_only: bool
    ) -> tuple[str, dict[str, Any]]:
        clauses = ["f.completed_at IS NULL"]
        args: dict[str, Any] = {}
        if dead_only:
            clauses.append("f.discarded_at IS NOT NULL")
        if run_ids is not None:
            clauses.append("f.run_id IN (SELECT value FROM json_each(:ids))")
            args["ids"] = json.dumps(list(run_ids))
        if tenant is not None:
            clauses.append("f.tenant = :tenant")
            args["tenant"] = tenant
        return "WHERE " + " AND ".join(clauses), args

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        sql = f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE {OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND f.tenant = ?"
            args = (tenant,)
        sql += " ORDER BY f.available_at, f.run_id LIMIT ?"
        with storage_errors(self._pool.path):
            return [fire_from_row(r) for r in rows(self._pool.get(), sql, (*args, limit))]

    def cancel_requested(self, run_ids: Sequence[int]) -> list[int]:
        if not run_ids:
            return []
        sql = (
            f"SELECT run_id FROM fire_queue WHERE run_id IN {_IDS} "
            "AND cancel_requested_at IS NOT NULL AND lease_token IS NOT NULL"
        )
        with storage_errors(self._pool.path):
            return [r[0] for r in self._pool.get().execute(sql, (json.dumps(list(run_ids)),))]

    def next_available_at(self) -> int | None:
        sql = f"SELECT min(f.available_at) FROM fire_queue f WHERE {OPEN} AND f.available_at > ?"
        with storage_errors(self._pool.path):
            found = scalar(self._pool.get(), sql, (self._clock.now_ms(),))
        return None if found is None else int(found)

    def depth(self, tenant: str | None = None) -> int:
        sql = f"SELECT count(*) FROM fire_queue f WHERE {OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND f.tenant = ?"
            args = (tenant,)
        with storage_errors(self._pool.path):
            return int(scalar(self._pool.get(), sql, args))
