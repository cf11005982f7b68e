"""The fire queue in PostgreSQL: claim, heartbeat, settle, requeue, purge, enqueue.

SQLite runs every call alone; here consumers on many hosts claim at once (READ COMMITTED), and
each guarantee holds by the locks it needs. A claim:
1. reads, without locks, the fires it may take and the live claims (the same two scans as on
   SQLite), and plans on them, to learn which schedules it would decide about;
2. tries (never waits for) a transaction-scoped advisory lock on each of those schedules:
   exclusive when the schedule's fires hold one another back (every overlap policy but
   allow), shared when they run side by side (allow; shared, so that a change of policy
   meanwhile still conflicts). A schedule another consumer holds is left to a later claim,
   and the plan made again without it, so that a claim beside a busy one takes other fires;
3. reads again, under those locks, the live claims of its exclusive schedules and the fires
   it saw (a consumer that held a lock before has committed by now): two consumers never both
   see a schedule idle;
4. plans on that, and locks only the fires the plan changes (claimed, skipped, cancelled)
   FOR UPDATE SKIP LOCKED: two consumers never take the same fire, never wait for each
   other's rows, and never hide from each other a fire neither takes. A fire it cannot lock
   (another consumer's, or one a late heartbeat or settle holds) is left out, with its whole
   schedule unless the schedule's fires run side by side, and the rest planned again;
5. writes the claim and its runs in one statement, then what it skipped or cancelled.
Settles and heartbeats change only rows that still carry their token, matched under a row
lock: a superseded token is reported stale and changes nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeAlias

import psycopg

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
from engine.backends.postgres.connection import (
    PgPool,
    Row,
    advisory_key,
    rows,
    scalar,
    storage_errors,
    write_tx,
)
from engine.backends.postgres.runs import insert_run
from engine.domain.clock import Clock
from engine.domain.overlap import Candidate, ClaimPlan, plan_claim
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

Conn: TypeAlias = psycopg.Connection[Row]

_CLAIMABLE = claimable_clause("%(now)s")
# Where a claim looks, before any lock: the general scan (every schedule but those held back
# by a running fire) and, apart, the held ones it must still decide about; each has its own
# cap, so that one schedule's long backlog hides no one else's fires.
_SCAN = (
    "(SELECT f.run_id, f.schedule_id, r.kind, s.overlap, s.status, f.available_at "
    "FROM fire_queue f JOIN runs r ON r.id = f.run_id "
    "LEFT JOIN schedules s ON s.id = f.schedule_id "
    "WHERE {where} ORDER BY f.available_at, f.run_id LIMIT %(cap)s)"
)
_SCANS = (
    _SCAN.format(where=f"{_CLAIMABLE}{{only}} AND f.schedule_id <> ALL(%(held)s::text[])")
    + " UNION ALL "
    + _SCAN.format(where=f"f.schedule_id = ANY(%(looked)s::text[]) AND {_CLAIMABLE}{{only}}")
)
# The fires seen, read again once their schedules are locked.
_RESCAN = (
    "SELECT f.run_id, f.schedule_id, r.kind, s.overlap, s.status, f.available_at "
    "FROM fire_queue f JOIN runs r ON r.id = f.run_id "
    "LEFT JOIN schedules s ON s.id = f.schedule_id "
    f"WHERE f.run_id = ANY(%(ids)s::bigint[]) AND {_CLAIMABLE} ORDER BY f.available_at, f.run_id"
)
# The fires a plan changes, if still claimable and not held by anyone else.
_LOCK_FIRES = (
    f"SELECT f.run_id FROM fire_queue f WHERE f.run_id = ANY(%(ids)s::bigint[]) AND {_CLAIMABLE} "
    "FOR UPDATE SKIP LOCKED"
)
_TRY_LOCKS = (
    "SELECT sid FROM unnest(%s::text[], %s::bigint[], %s::boolean[]) AS t(sid, k, exclusive) "
    "WHERE CASE WHEN exclusive THEN pg_try_advisory_xact_lock(k) "
    "ELSE pg_try_advisory_xact_lock_shared(k) END"
)
# The claim of a batch, its runs moved to running, and the fires as claimed: one statement.
# (Every SET expression reads the row as it was: a fire still carrying a token was abandoned,
# its holder's claim ran out.)
_TAKE = (
    "WITH f AS (UPDATE fire_queue SET "
    "abandoned_count = abandoned_count + (lease_token IS NOT NULL)::int, "
    "last_abandoned_by = CASE WHEN lease_token IS NOT NULL THEN consumed_by "
    "ELSE last_abandoned_by END, "
    "last_abandoned_at = CASE WHEN lease_token IS NOT NULL THEN consumed_till "
    "ELSE last_abandoned_at END, "
    "lease_token = %(token)s, consumed_till = %(till)s, consumed_by = %(consumer)s, "
    "attempts = attempts + 1, cancel_requested_at = NULL "
    "WHERE run_id = ANY(%(ids)s::bigint[]) RETURNING *), "
    "r AS (UPDATE runs SET state = 'running', started_at = %(now)s, consumer = %(consumer)s, "
    "finished_at = NULL, exit_code = NULL, output = NULL, attempts = f.attempts, "
    "abandoned = f.abandoned_count FROM f WHERE runs.id = f.run_id RETURNING runs.*) "
    f"SELECT {FIRE_COLUMNS} FROM f JOIN r ON r.id = f.run_id ORDER BY f.available_at, f.run_id"
)
# Fires decided at claim time never to run (skipped, superseded), and their runs.
_UNRUN = (
    f"WITH done AS (UPDATE fire_queue SET completed_at = %(now)s, {CLEAR_CLAIM} "
    "WHERE run_id = ANY(%(ids)s::bigint[]) RETURNING run_id) "
    "UPDATE runs SET state = u.state, error = u.reason, finished_at = %(now)s "
    "FROM done JOIN unnest(%(ids)s::bigint[], %(states)s::text[], %(reasons)s::text[]) "
    "AS u(id, state, reason) ON u.id = done.run_id WHERE runs.id = u.id"
)
# The token condition is what makes a settle conditional; the rows are locked beforehand.
_SETTLE_FIRE = {
    outcome: settle_fire_sql(outcome, "%s") + " AND lease_token = %s" for outcome in Outcome
}


def _schedule_lock(schedule_id: str) -> int:
    return advisory_key(f"vortos.fire_queue.schedule:{schedule_id}")


def _candidate(r: Row) -> Candidate:
    """A row of _SCAN or _RESCAN."""
    return Candidate(
        run_id=r[0],
        schedule_id=r[1],
        kind=RunKind(r[2]),
        policy=None if r[3] is None else OverlapPolicy(r[3]),
        active=r[4] == ScheduleStatus.ACTIVE.value,
    )


def _named(conn: Conn, sql: str, args: Mapping[str, Any]) -> list[Row]:
    """`rows` with named parameters (%(name)s)."""
    return conn.execute(sql, args).fetchall()


class PostgresFireQueue:
    def __init__(self, pool: PgPool, clock: Clock) -> None:
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
        with storage_errors(self._pool.where), write_tx(conn):
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
        with storage_errors(self._pool.where), write_tx(conn):
            reports = {
                token: self._settle_in(conn, token, consumer, batch)
                for token, batch in settlements.items()
            }
            return reports, self._claim_in(conn, consumer, ttl_ms, limit, commands)

    def _claim_in(
        self,
        conn: Conn,
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
        args: dict[str, Any] = {"now": now, "cap": limit * 2 + 32}
        only = ""
        if commands is not None:
            args["commands"] = sorted(commands)
            only = " AND f.command = ANY(%(commands)s::text[])"
        seen, running = self._scan(conn, args, only)
        locked = self._lock_schedules(conn, seen, running, limit)
        # A deleted schedule's fires are skipped whatever else happens: they need no lock.
        ids = [c.run_id for c in seen if c.policy is None or c.schedule_id in locked]
        if not ids:
            return claim
        running, found = self._reread(conn, now, ids, locked)
        plan = self._lock_plan(conn, args, found, running, limit)
        self._apply_claim(conn, claim, plan.claim, now)
        self._finish_unrun(conn, plan.skip, plan.cancel, now)
        claim.skipped, claim.cancelled = plan.skip, plan.cancel
        asked = [rid for sid in sorted(plan.cancel_running) for rid in running.get(sid, [])]
        if asked:
            # A fire settled meanwhile (settles take no schedule lock) is not asked.
            still = {
                r[0]
                for r in rows(
                    conn,
                    "UPDATE fire_queue SET "
                    "cancel_requested_at = coalesce(cancel_requested_at, %s) "
                    "WHERE run_id = ANY(%s::bigint[]) AND lease_token IS NOT NULL "
                    "RETURNING run_id",
                    (now, asked),
                )
            }
            claim.cancel_requested = [rid for rid in asked if rid in still]
        return claim

    @staticmethod
    def _scan(
        conn: Conn, args: dict[str, Any], only: str
    ) -> tuple[list[Candidate], dict[str, list[int]]]:
        """Read without locks: the fires a claim may take, oldest available first, and the
        fires under a live claim by schedule."""
        running: dict[str, list[int]] = {}
        defined: dict[str, tuple[str | None, str | None]] = {}
        for sid, rid, overlap, status in rows(
            conn,
            "SELECT f.schedule_id, f.run_id, s.overlap, s.status FROM fire_queue f "
            "LEFT JOIN schedules s ON s.id = f.schedule_id "
            "WHERE f.lease_token IS NOT NULL AND f.consumed_till > %s ORDER BY f.run_id",
            (args["now"],),
        ):
            running.setdefault(sid, []).append(rid)
            defined[sid] = (overlap, status)
        # A running schedule whose fires may run beside it (allow, active) is claimed from like
        # any other; the other running ones are looked at apart, except an active buffer-all
        # one, whose fires all simply wait. (A deleted schedule's fires are read, to be skipped.)
        held = sorted(
            sid
            for sid, d in defined.items()
            if d != (OverlapPolicy.ALLOW.value, ScheduleStatus.ACTIVE.value)
        )
        looked = [
            sid
            for sid in held
            if defined[sid] != (OverlapPolicy.BUFFER_ALL.value, ScheduleStatus.ACTIVE.value)
        ]
        found = _named(conn, _SCANS.format(only=only), {**args, "held": held, "looked": looked})
        return [_candidate(r) for r in sorted(found, key=lambda r: (r[5], r[0]))], running

    @staticmethod
    def _reread(
        conn: Conn, now: int, ids: list[int], locked: Mapping[str, bool]
    ) -> tuple[dict[str, list[int]], list[Candidate]]:
        """Under the schedules' locks (a consumer that held one before has committed by now),
        the live claims of the exclusively locked schedules and the fires seen that are still
        claimable, in one round trip. A schedule whose policy became other than allow under
        a shared lock is left for a later claim."""
        exclusive = sorted(sid for sid, alone in locked.items() if alone)
        with conn.pipeline():
            live = conn.execute(
                "SELECT schedule_id, run_id FROM fire_queue WHERE lease_token IS NOT NULL "
                "AND consumed_till > %s AND schedule_id = ANY(%s::text[]) ORDER BY run_id",
                (now, exclusive),
            )
            fresh = conn.execute(_RESCAN, {"now": now, "ids": ids})
        running: dict[str, list[int]] = {}
        for sid, rid in live.fetchall():
            running.setdefault(sid, []).append(rid)
        found = [
            c
            for c in map(_candidate, fresh.fetchall())
            if c.policy is None
            or (
                c.schedule_id in locked
                and (locked[c.schedule_id] or c.policy is OverlapPolicy.ALLOW)
            )
        ]
        return running, found

    @staticmethod
    def _lock_schedules(
        conn: Conn, seen: list[Candidate], running: dict[str, list[int]], limit: int
    ) -> dict[str, bool]:
        """Lock the schedules this claim decides about: the schedules locked -> whether
        exclusively (unless their policy is allow).

        A plan on what was read without locks says which schedules those are; only they are
        locked (no other consumer decides about a schedule locked here until this transaction
        ends). A schedule another consumer holds is left out and the plan made again without
        it, so that a claim beside a busy one takes other fires instead of none."""
        locked: dict[str, bool] = {}
        refused: set[str] = set()
        while True:
            plan = plan_claim([c for c in seen if c.schedule_id not in refused], running, limit)
            changed = {*plan.claim, *plan.skip, *plan.cancel}
            wanted = {
                c.schedule_id: c.policy is not OverlapPolicy.ALLOW
                for c in seen
                if c.run_id in changed and c.policy is not None and c.schedule_id not in locked
            }
            if not wanted:
                return locked
            order = sorted(wanted)
            got = {
                sid
                for (sid,) in rows(
                    conn,
                    _TRY_LOCKS,
                    (order, [_schedule_lock(s) for s in order], [wanted[s] for s in order]),
                )
            }
            locked.update((sid, wanted[sid]) for sid in got)
            if len(got) == len(wanted):
                return locked
            refused.update(set(wanted) - got)

    @staticmethod
    def _lock_plan(
        conn: Conn,
        args: dict[str, Any],
        found: list[Candidate],
        running: dict[str, list[int]],
        limit: int,
    ) -> ClaimPlan:
        """Plan, and lock the fires the plan changes; a fire that cannot be locked is left out
        (with its schedule, when its fires hold one another back) and the rest planned again,
        until every fire the plan changes is locked."""
        taken: set[int] = set()
        while True:
            plan = plan_claim(found, running, limit)
            missing = [rid for rid in (*plan.claim, *plan.skip, *plan.cancel) if rid not in taken]
            if not missing:
                return plan
            got = {r[0] for r in _named(conn, _LOCK_FIRES, {**args, "ids": missing})}
            taken |= got
            lost = set(missing) - got
            if not lost:
                return plan
            bound = {
                c.schedule_id
                for c in found
                if c.run_id in lost and c.policy not in (None, OverlapPolicy.ALLOW)
            }
            found = [c for c in found if c.run_id not in lost and c.schedule_id not in bound]

    @staticmethod
    def _apply_claim(conn: Conn, claim: Claim, run_ids: list[int], now: int) -> None:
        if not run_ids:
            return
        args = {
            "token": claim.token,
            "till": claim.claimed_till,
            "consumer": claim.consumer,
            "now": now,
            "ids": run_ids,
        }
        claim.fires = [fire_from_row(r) for r in _named(conn, _TAKE, args)]

    @staticmethod
    def _finish_unrun(
        conn: Conn, skipped: dict[int, str], cancelled: dict[int, str], now: int
    ) -> None:
        """Fires decided at claim time never to run: skipped, or superseded (cancelled)."""
        why = [(rid, RunState.SKIPPED, reason) for rid, reason in skipped.items()] + [
            (rid, RunState.CANCELLED, reason) for rid, reason in cancelled.items()
        ]
        if not why:
            return
        conn.execute(
            _UNRUN,
            {
                "now": now,
                "ids": [rid for rid, _, _ in why],
                "states": [state.value for _, state, _ in why],
                "reasons": [reason for _, _, reason in why],
            },
        )

    def heartbeat(self, token: str, ttl_ms: int, run_ids: Sequence[int]) -> HeartbeatReport:
        report = HeartbeatReport()
        if not run_ids:
            return report
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            now = self._clock.now_ms()
            # One conditional statement: a fire another claim took meanwhile is not matched.
            extended = rows(
                conn,
                "UPDATE fire_queue SET consumed_till = %s WHERE lease_token = %s "
                "AND run_id = ANY(%s::bigint[]) RETURNING run_id, cancel_requested_at",
                (now + ttl_ms, token, list(run_ids)),
            )
        held = {r[0]: r[1] for r in extended}
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
        with storage_errors(self._pool.where), write_tx(conn):
            return self._settle_in(conn, token, consumer, settlements)

    def _settle_in(
        self,
        conn: Conn,
        token: str,
        consumer: str,
        settlements: Sequence[Settlement],
    ) -> SettleReport:
        report = SettleReport()
        if not settlements:
            return report
        now = self._clock.now_ms()
        # Locked in run id order; a fire another claim took meanwhile no longer matches.
        held = {
            r[0]
            for r in rows(
                conn,
                "SELECT run_id FROM fire_queue WHERE lease_token = %s "
                "AND run_id = ANY(%s::bigint[]) ORDER BY run_id FOR UPDATE",
                (token, [s.run_id for s in settlements]),
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
            fire_updates.setdefault(s.outcome, []).append((*settle_fire_values(s, now), token))
            finished = None if s.outcome is Outcome.RELEASE else (s.finished_at or now)
            run_updates.append(
                (s.run_state.value, s.error, s.output, s.exit_code, finished, s.run_id)
            )
        with conn.cursor() as cur:
            for outcome, values in fire_updates.items():
                cur.executemany(_SETTLE_FIRE[outcome], values)
            if run_updates:
                cur.executemany(
                    "UPDATE runs SET state = %s, error = %s, output = %s, exit_code = %s, "
                    "finished_at = %s WHERE id = %s",
                    run_updates,
                )
            if stale_counted:
                cur.executemany(
                    "UPDATE fire_queue SET stale_ack_count = stale_ack_count + 1, "
                    "last_stale_ack_by = %s, last_stale_ack_at = %s WHERE run_id = %s",
                    stale_counted,
                )
        return report

    # -- manual fires -----------------------------------------------------------------------

    def enqueue(self, fires: Sequence[NewFire], *, available_at: int) -> EnqueueReport:
        report = EnqueueReport()
        if not fires:
            return report
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
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
                    "payload, available_at, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
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
            clauses.append("f.tenant = %(tenant)s")
            args["tenant"] = query.tenant
        if query.tenants is not None:  # an empty scope matches nothing
            clauses.append("f.tenant = ANY(%(scope)s::text[])")
            args["scope"] = sorted(query.tenants)
        if query.schedule_id is not None:
            clauses.append("f.schedule_id = %(sid)s")
            args["sid"] = query.schedule_id
        if query.run_ids is not None:
            clauses.append("f.run_id = ANY(%(ids)s::bigint[])")
            args["ids"] = list(query.run_ids)
        if query.states:
            either = " OR ".join(f"({state_clause(s, '%(now)s')})" for s in sorted(query.states))
            clauses.append(f"({either})")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} {where} ORDER BY f.run_id LIMIT %(limit)s"
        with storage_errors(self._pool.where):
            return [fire_from_row(r) for r in _named(self._pool.get(), sql, args)]

    def requeue(self, run_ids: Sequence[int] | None, *, at: int, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            # Never a completed fire: that would run a completed run again.
            where, args = self._selection(run_ids, tenant, dead_only=run_ids is None)
            targets = [
                r[0]
                for r in _named(
                    conn,
                    "UPDATE fire_queue AS f SET available_at = %(at)s, discarded_at = NULL, "
                    "discard_reason = NULL, consecutive_failures = 0, "
                    f"requeued_at_attempt = attempts, {CLEAR_CLAIM} {where} RETURNING f.run_id",
                    {**args, "at": at},
                )
            ]
            if not targets:
                return 0
            conn.execute(
                "UPDATE runs SET state = 'dispatched', finished_at = NULL "
                "WHERE id = ANY(%s::bigint[]) AND state <> 'dispatched'",
                (targets,),
            )
        return len(targets)

    def purge(self, run_ids: Sequence[int] | None, *, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            where, args = self._selection(run_ids, tenant, dead_only=True)
            return conn.execute(f"DELETE FROM fire_queue AS f {where}", args).rowcount

    @staticmethod
    def _selection(
        run_ids: Sequence[int] | None, tenant: str | None, *, dead_only: bool
    ) -> tuple[str, dict[str, Any]]:
        clauses = ["f.completed_at IS NULL"]
        args: dict[str, Any] = {}
        if dead_only:
            clauses.append("f.discarded_at IS NOT NULL")
        if run_ids is not None:
            clauses.append("f.run_id = ANY(%(ids)s::bigint[])")
            args["ids"] = list(run_ids)
        if tenant is not None:
            clauses.append("f.tenant = %(tenant)s")
            args["tenant"] = tenant
        return "WHERE " + " AND ".join(clauses), args

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        sql = f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE {OPEN}"
        args: list[Any] = []
        if tenant is not None:
            sql += " AND f.tenant = %s"
            args.append(tenant)
        sql += " ORDER BY f.available_at, f.run_id LIMIT %s"
        with storage_errors(self._pool.where):
            return [fire_from_row(r) for r in rows(self._pool.get(), sql, [*args, limit])]

    def cancel_requested(self, run_ids: Sequence[int]) -> list[int]:
        if not run_ids:
            return []
        sql = (
            "SELECT run_id FROM fire_queue WHERE run_id = ANY(%s::bigint[]) "
            "AND cancel_requested_at IS NOT NULL AND lease_token IS NOT NULL"
        )
        with storage_errors(self._pool.where):
            return [r[0] for r in rows(self._pool.get(), sql, (list(run_ids),))]

    def next_available_at(self) -> int | None:
        sql = f"SELECT min(f.available_at) FROM fire_queue f WHERE {OPEN} AND f.available_at > %s"
        with storage_errors(self._pool.where):
            found = scalar(self._pool.get(), sql, (self._clock.now_ms(),))
        return None if found is None else int(found)

    def depth(self, tenant: str | None = None) -> int:
        sql = f"SELECT count(*) FROM fire_queue f WHERE {OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND f.tenant = %s"
            args = (tenant,)
        with storage_errors(self._pool.where):
            return int(scalar(self._pool.get(), sql, args))
