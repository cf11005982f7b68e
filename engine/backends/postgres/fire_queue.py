"""The fire queue in PostgreSQL: claim, heartbeat, settle, requeue (the rest is
engine.backends.sql.fire_queue's).

SQLite runs every call alone; here consumers on many hosts claim at once (READ COMMITTED), and
each guarantee holds by the locks it needs. A claim first takes, straight from the index of
open fires (FOR UPDATE SKIP LOCKED), the fires at the head of the queue whose schedules need no
decision (allow, active), under those schedules' shared locks (see `_take_free`); for the rest,
when the head holds a fire whose schedule needs one, it:
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

from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeAlias

import psycopg

from engine.backends.postgres.arrays import array_literal, int_array
from engine.backends.postgres.batch import batched_update
from engine.backends.postgres.connection import (
    PgPool,
    Row,
    advisory_key,
    rows,
)
from engine.backends.postgres.runs import insert_run
from engine.backends.sql.fire_queue import SettlePlan, SqlFireQueue, held_and_looked
from engine.backends.sql.fire_rows import (
    CANDIDATES,
    CLEAR_CLAIM,
    FIRE_COLUMNS,
    OPEN,
    candidate_from_row,
    claimable_clause,
    fire_from_row,
    settle_fire_sql,
    settle_run_sql,
    stale_ack_sql,
)
from engine.domain.overlap import Candidate, ClaimPlan, plan_claim
from engine.domain.run import NewRun, RunState
from engine.domain.schedule import OverlapPolicy, ScheduleStatus
from engine.ports.fire_queue import Claim, Outcome

Conn: TypeAlias = psycopg.Connection[Row]

_CLAIMABLE = claimable_clause("%(now)s")
# Where a claim looks, before any lock: the general scan (every schedule but those held back
# by a running fire) and, apart, the held ones it must still decide about; each has its own
# cap, so that one schedule's long backlog hides no one else's fires.
_SCAN = f"({CANDIDATES} WHERE {{where}} ORDER BY f.available_at, f.run_id LIMIT %(cap)s)"
_GENERAL_SCAN = _SCAN.format(
    where=f"{_CLAIMABLE}{{only}} AND f.schedule_id <> ALL(%(held)s::text[])"
)
_LOOKED_SCAN = " UNION ALL " + _SCAN.format(
    where=f"f.schedule_id = ANY(%(looked)s::text[]) AND {_CLAIMABLE}{{only}}"
)
# The schedules with fires under a live claim: each one's newest such fire and definition.
_RUNNING = (
    "SELECT f.schedule_id, max(f.run_id), s.overlap, s.status FROM fire_queue f "
    "LEFT JOIN schedules s ON s.id = f.schedule_id "
    "WHERE f.lease_token IS NOT NULL AND f.consumed_till > %s "
    "GROUP BY f.schedule_id, s.overlap, s.status"
)
# Fires by run id, each looked up by its key: a lateral subquery per id (OFFSET 0, or the
# lock, keeps it from being merged into a join), its condition the claimable one written so
# that it implies no partial index's predicate. Otherwise the planner, on a table without
# statistics yet (a fresh backlog), walks the index of every open fire filtered by the list,
# once per claim or even once per id: a claim then costs as much as the backlog is long.
_BY_ID = "FROM unnest(%(ids)s::bigint[]) AS i(id) CROSS JOIN LATERAL ({select}) AS c"
assert OPEN in _CLAIMABLE
_CLAIMABLE_ID = _CLAIMABLE.replace(OPEN, "coalesce(f.completed_at, f.discarded_at) IS NULL")
# The fires seen, read again once their schedules are locked.
_RESCAN = (
    "SELECT c.* "
    + _BY_ID.format(select=f"{CANDIDATES} WHERE f.run_id = i.id AND {_CLAIMABLE_ID} OFFSET 0")
    + " ORDER BY c.available_at, c.run_id"
)
# The fires a plan changes, if still claimable and not held by anyone else; with each one's
# row address, for the claim's update (the row is locked: it stays where it is).
_LOCK_FIRES = "SELECT c.run_id, c.ctid " + _BY_ID.format(
    select=(
        "SELECT f.run_id, f.ctid FROM fire_queue f "
        f"WHERE f.run_id = i.id AND {_CLAIMABLE_ID} FOR UPDATE SKIP LOCKED"
    )
)
# The live claims of the schedules a claim locked exclusively.
_LIVE = (
    "SELECT schedule_id, run_id FROM fire_queue WHERE lease_token IS NOT NULL "
    "AND consumed_till > %s AND schedule_id = ANY(%s::text[]) ORDER BY run_id"
)
# The definitions of the schedules a claim locked shared.
_DEFINITIONS = "SELECT id, overlap, status FROM schedules WHERE id = ANY(%s::text[])"
_POLICIES = {p.value: p for p in OverlapPolicy}
_TRY_LOCKS = (
    "SELECT sid FROM unnest(%s::text[], %s::bigint[], %s::boolean[]) AS t(sid, k, exclusive) "
    "WHERE CASE WHEN exclusive THEN pg_try_advisory_xact_lock(k) "
    "ELSE pg_try_advisory_xact_lock_shared(k) END"
)
# The claim of a batch, its runs moved to running, and the fires as claimed: one statement.
# (Every SET expression reads the row as it was: a fire still carrying a token was abandoned,
# its holder's claim ran out.) The fires are found by the addresses their locks returned.
_TAKE = (
    "WITH f AS (UPDATE fire_queue SET "
    "abandoned_count = abandoned_count + (lease_token IS NOT NULL)::int, "
    "last_abandoned_by = CASE WHEN lease_token IS NOT NULL THEN consumed_by "
    "ELSE last_abandoned_by END, "
    "last_abandoned_at = CASE WHEN lease_token IS NOT NULL THEN consumed_till "
    "ELSE last_abandoned_at END, "
    "lease_token = %(token)s, consumed_till = %(till)s, consumed_by = %(consumer)s, "
    "attempts = attempts + 1, cancel_requested_at = NULL "
    "WHERE ctid = ANY(%(rows)s::tid[]) AND run_id = ANY(%(ids)s::bigint[]) RETURNING *), "
    "r AS (UPDATE runs SET state = 'running', started_at = %(now)s, consumer = %(consumer)s, "
    "finished_at = NULL, exit_code = NULL, output = NULL, attempts = f.attempts, "
    "abandoned = f.abandoned_count FROM f WHERE runs.id = f.run_id "
    "RETURNING runs.id, runs.schedule_name, runs.slot_key, runs.kind) "
    f"SELECT {FIRE_COLUMNS} FROM f JOIN r ON r.id = f.run_id ORDER BY f.available_at, f.run_id"
)
# The fast path of a claim: fires of schedules whose fires run side by side (allow, active),
# locked straight from the open fires' index, oldest available first, skipping any another
# consumer holds, so that concurrent consumers take disjoint fires instead of all reading the
# same head and then losing most of it to each other. Only fires older than the first
# claimable fire at the head (as many as the claim may take) whose schedule needs a decision
# (any other policy, paused, deleted) are taken, so that the claim keeps the order of
# availability; that fire and those after it are left to the general path. (Beside other
# claims not yet committed, whose fires still read as claimable, a claim reaches past the head
# it checked: the order holds between consumers only to within a batch, as on the general
# path.) With each fire locked, its schedule and row address; and whether the head holds
# such a fire at all.
_ALLOW, _ACTIVE = OverlapPolicy.ALLOW.value, ScheduleStatus.ACTIVE.value
_FREE = f"(s.overlap = '{_ALLOW}' AND s.status = '{_ACTIVE}') IS TRUE"
_FAST = (
    "WITH head AS (SELECT f.available_at, f.run_id, "
    f"{_FREE} AS free FROM fire_queue f LEFT JOIN schedules s ON s.id = f.schedule_id "
    f"WHERE {_CLAIMABLE}{{only}} ORDER BY f.available_at, f.run_id LIMIT %(limit)s), "
    "bound AS (SELECT available_at, run_id FROM head WHERE NOT free "
    "ORDER BY available_at, run_id LIMIT 1), "
    "locked AS (SELECT f.run_id, f.ctid, f.schedule_id FROM fire_queue f "
    "JOIN schedules s ON s.id = f.schedule_id "
    f"WHERE {_CLAIMABLE}{{only}} AND {_FREE} AND NOT EXISTS (SELECT FROM bound b "
    "WHERE (f.available_at, f.run_id) >= (b.available_at, b.run_id)) "
    "ORDER BY f.available_at, f.run_id LIMIT %(limit)s FOR UPDATE OF f SKIP LOCKED) "
    "SELECT l.run_id, l.ctid::text, l.schedule_id, EXISTS (SELECT FROM bound) FROM locked l "
    "UNION ALL SELECT NULL, NULL, NULL, EXISTS (SELECT FROM bound) "
    "WHERE NOT EXISTS (SELECT FROM locked)"
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
_SETTLE_RUN = settle_run_sql("%s")
_STALE_ACK = stale_ack_sql("%s")


def _schedule_lock(schedule_id: str) -> int:
    return advisory_key(f"vortos.fire_queue.schedule:{schedule_id}")


def _named(conn: Conn, sql: str, args: Mapping[str, Any]) -> list[Row]:
    """`rows` with named parameters (%(name)s)."""
    return conn.execute(sql, args).fetchall()


class PostgresFireQueue(SqlFireQueue[PgPool]):
    def _insert_run(self, conn: Conn, run: NewRun, now: int) -> int | None:
        return insert_run(conn, run, now)

    # -- consumers --------------------------------------------------------------------------

    def _take(
        self, conn: Conn, claim: Claim, now: int, limit: int, commands: Collection[str] | None
    ) -> None:
        args: dict[str, Any] = {"now": now, "cap": limit * 2 + 32}
        only = ""
        if commands is not None:
            args["commands"] = array_literal(sorted(commands))
            only = " AND f.command = ANY(%(commands)s::text[])"
        taken, decide = self._take_free(conn, claim, args, only, limit, now)
        if decide and taken < limit:
            self._take_deciding(conn, claim, args, only, limit - taken, now)

    def _take_free(
        self, conn: Conn, claim: Claim, args: dict[str, Any], only: str, limit: int, now: int
    ) -> tuple[int, bool]:
        """The fast path: claim, in three round trips whatever their number, the fires at the
        head of the queue whose schedules need no decision (allow, active). How many it took,
        and whether the general path must still look (the head holds a fire whose schedule
        needs a decision, or one of the fires locked here lost its schedule's lock or its
        definition meanwhile)."""
        found = _named(conn, _FAST.format(only=only), {**args, "limit": limit})
        decide = bool(found[0][3])
        locked = [r for r in found if r[0] is not None]
        if not locked:
            return 0, decide
        # The schedules' shared locks (a change of policy meanwhile conflicts with the
        # exclusive lock of a claim that saw it) and, under them, their definitions again.
        order = sorted({r[2] for r in locked})
        with conn.pipeline():
            got_cur = conn.execute(
                _TRY_LOCKS,
                (
                    array_literal(order),
                    int_array(_schedule_lock(s) for s in order),
                    array_literal(False for _ in order),
                ),
            )
            defined_cur = conn.execute(_DEFINITIONS, (array_literal(order),))
        got = {sid for (sid,) in got_cur.fetchall()}
        free = {
            sid
            for sid, overlap, status in defined_cur.fetchall()
            if sid in got and overlap == _ALLOW and status == _ACTIVE
        }
        take = [r for r in locked if r[2] in free]
        if len(take) < len(locked):
            # Left out, still row-locked here: the general path decides about them (a lock
            # this transaction holds does not hide a fire from it).
            decide = True
        if take:
            self._apply_claim(conn, claim, [r[0] for r in take], {r[0]: r[1] for r in take}, now)
        return len(claim.fires), decide

    def _take_deciding(
        self, conn: Conn, claim: Claim, args: dict[str, Any], only: str, limit: int, now: int
    ) -> None:
        """The general path: scan, lock the schedules decided about, read again, plan, lock
        the fires the plan changes, write (see the module's docstring)."""
        args = {**args, "cap": limit * 2 + 32}
        seen, available, running = self._scan(conn, args, only)
        locked = self._lock_schedules(conn, seen, running, limit)
        # A deleted schedule's fires are skipped whatever else happens: they need no lock.
        seen = [c for c in seen if c.policy is None or c.schedule_id in locked]
        if not seen:
            return
        running, found = self._reread(conn, now, seen, available, locked)
        plan, rows_of = self._lock_plan(conn, args, found, running, limit)
        self._apply_claim(conn, claim, plan.claim, rows_of, now)
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
                    (now, int_array(asked)),
                )
            }
            claim.cancel_requested = [rid for rid in asked if rid in still]

    @staticmethod
    def _scan(
        conn: Conn, args: dict[str, Any], only: str
    ) -> tuple[list[Candidate], dict[int, int], dict[str, list[int]]]:
        """Read without locks: the fires a claim may take, oldest available first (and when
        each became available), and the schedules with fires under a live claim (each by its
        newest such fire: what a plan needs of them before their schedules are locked and
        their claims read again)."""
        running: dict[str, list[int]] = {}
        defined: dict[str, tuple[str | None, str | None]] = {}
        for sid, newest, overlap, status in rows(conn, _RUNNING, (args["now"],)):
            running[sid] = [newest]
            defined[sid] = (overlap, status)
        held, looked = held_and_looked(running, defined)
        sql = (_GENERAL_SCAN + (_LOOKED_SCAN if looked else "")).format(only=only)
        found = _named(
            conn, sql, {**args, "held": array_literal(held), "looked": array_literal(looked)}
        )
        found.sort(key=lambda r: (r[5], r[0]))
        return [candidate_from_row(r) for r in found], {r[0]: r[5] for r in found}, running

    @staticmethod
    def _reread(
        conn: Conn,
        now: int,
        seen: list[Candidate],
        available: Mapping[int, int],
        locked: Mapping[str, bool],
    ) -> tuple[dict[str, list[int]], list[Candidate]]:
        """Under the schedules' locks (a consumer that held one before has committed by now),
        in one round trip: the live claims of the exclusively locked schedules and those of
        their fires seen (and a deleted schedule's) that are still claimable; the definitions
        of the schedules locked shared (allow: their fires run side by side, so only the
        definition decides, and each fire is checked again when its row is locked). A
        schedule whose policy became other than allow under a shared lock is left for a
        later claim."""
        exclusive = sorted(sid for sid, alone in locked.items() if alone)
        shared = {sid for sid, alone in locked.items() if not alone}
        again = [c.run_id for c in seen if c.schedule_id not in shared]
        live = fresh = defined = None
        with conn.pipeline():  # only what this claim needs of the three, in one round trip
            if exclusive:
                live = conn.execute(_LIVE, (now, array_literal(exclusive)))
            if again:
                fresh = conn.execute(_RESCAN, {"now": now, "ids": int_array(again)})
            if shared:
                defined = conn.execute(_DEFINITIONS, (array_literal(sorted(shared)),))
        running: dict[str, list[int]] = {}
        for sid, rid in live.fetchall() if live else ():
            running.setdefault(sid, []).append(rid)
        rows_found = fresh.fetchall() if fresh else []
        when = {**available, **{r[0]: r[5] for r in rows_found}}
        definitions = {
            sid: (_POLICIES[overlap], status == _ACTIVE)
            for sid, overlap, status in (defined.fetchall() if defined else ())
        }
        candidates = [candidate_from_row(r) for r in rows_found]
        for c in seen:
            if c.schedule_id in shared:
                # A schedule deleted meanwhile has no definition: its fires are skipped.
                policy, active = definitions.get(c.schedule_id, (None, False))
                if policy is not c.policy or active is not c.active:
                    c = Candidate(c.run_id, c.schedule_id, c.kind, policy, active)  # noqa: PLW2901
                candidates.append(c)
        candidates.sort(key=lambda c: (when[c.run_id], c.run_id))
        found = [
            c
            for c in candidates
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
                    (
                        array_literal(order),
                        int_array(_schedule_lock(s) for s in order),
                        array_literal(wanted[s] for s in order),
                    ),
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
    ) -> tuple[ClaimPlan, dict[int, str]]:
        """Plan, and lock the fires the plan changes; a fire that cannot be locked is left out
        (with its schedule, when its fires hold one another back) and the rest planned again,
        until every fire the plan changes is locked. The plan, and the row address of each
        fire locked."""
        taken: dict[int, str] = {}
        while True:
            plan = plan_claim(found, running, limit)
            missing = [rid for rid in (*plan.claim, *plan.skip, *plan.cancel) if rid not in taken]
            if not missing:
                return plan, taken
            got: dict[int, str] = {
                r[0]: r[1] for r in _named(conn, _LOCK_FIRES, {**args, "ids": int_array(missing)})
            }
            taken.update(got)
            lost = set(missing) - set(got)
            if not lost:
                return plan, taken
            bound = {
                c.schedule_id
                for c in found
                if c.run_id in lost and c.policy not in (None, OverlapPolicy.ALLOW)
            }
            found = [c for c in found if c.run_id not in lost and c.schedule_id not in bound]

    @staticmethod
    def _apply_claim(
        conn: Conn, claim: Claim, run_ids: list[int], rows_of: Mapping[int, str], now: int
    ) -> None:
        if not run_ids:
            return
        args = {
            "token": claim.token,
            "till": claim.claimed_till,
            "consumer": claim.consumer,
            "now": now,
            "ids": int_array(run_ids),
            # A row address is "(block,offset)": quoted, it needs no escaping.
            "rows": '{"' + '","'.join(rows_of[rid] for rid in run_ids) + '"}',
        }
        fires = [fire_from_row(r) for r in _named(conn, _TAKE, args)]
        if claim.fires:  # the general path after the fast one: one order of availability
            fires = sorted([*claim.fires, *fires], key=lambda f: (f.available_at, f.run_id))
        claim.fires = fires

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
                "ids": int_array(rid for rid, _, _ in why),
                "states": array_literal(state.value for _, state, _ in why),
                "reasons": array_literal(reason for _, _, reason in why),
            },
        )

    @staticmethod
    def _extend(conn: Conn, token: str, till: int, run_ids: Sequence[int]) -> dict[int, Any]:
        # One conditional statement: a fire another claim took meanwhile is not matched.
        extended = rows(
            conn,
            "UPDATE fire_queue SET consumed_till = %s WHERE lease_token = %s "
            "AND run_id = ANY(%s::bigint[]) RETURNING run_id, cancel_requested_at",
            (till, token, int_array(run_ids)),
        )
        return {r[0]: r[1] for r in extended}

    @staticmethod
    def _held(conn: Conn, token: str, run_ids: list[int]) -> set[int]:
        # Locked in run id order, until the settle commits.
        return {
            r[0]
            for r in rows(
                conn,
                "SELECT run_id FROM fire_queue WHERE lease_token = %s "
                "AND run_id = ANY(%s::bigint[]) ORDER BY run_id FOR UPDATE",
                (token, int_array(run_ids)),
            )
        }

    @staticmethod
    def _write_settle(conn: Conn, token: str, plan: SettlePlan) -> None:
        # One statement per kind of change for the whole batch, all sent in one round trip.
        writes = [
            (_SETTLE_FIRE[o], [(*v, token) for v in values]) for o, values in plan.fires.items()
        ]
        writes += [(_SETTLE_RUN, plan.runs), (_STALE_ACK, plan.stale)]
        with conn.pipeline(), conn.cursor() as cur:
            for one_row, values in writes:
                if not values:
                    continue
                batch = batched_update(one_row, values)
                if batch is None:
                    cur.executemany(one_row, values)
                else:
                    cur.execute(*batch)

    # -- operators --------------------------------------------------------------------------

    @staticmethod
    def _make_available(conn: Conn, where: str, args: dict[str, Any], at: int) -> list[int]:
        return [
            r[0]
            for r in _named(
                conn,
                "UPDATE fire_queue AS f SET available_at = %(at)s, discarded_at = NULL, "
                "discard_reason = NULL, consecutive_failures = 0, "
                f"requeued_at_attempt = attempts, {CLEAR_CLAIM} {where} RETURNING f.run_id",
                {**args, "at": at},
            )
        ]
