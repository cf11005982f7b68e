"""The fire queue on either SQL backend: what a claim, a heartbeat and a settle decide, and the
operators' calls, one SQL for both.

How a claim takes its fires, and how a heartbeat or a settle is matched to its token, is where
the backends differ (SQLite's single writer; PostgreSQL's advisory and row locks): each backend
writes those itself, inside the transaction this class opens.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engine.backends.sql import SqlPool, scalar
from engine.backends.sql.fire_rows import (
    FIRE_COLUMNS,
    FIRE_FROM,
    OPEN,
    fire_from_row,
    fire_query_sql,
    fire_run,
    fire_values,
    insert_fire_sql,
    selection,
    settle_fire_values,
)
from engine.domain.clock import Clock
from engine.domain.run import NewRun
from engine.domain.schedule import OverlapPolicy, ScheduleStatus
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

P = TypeVar("P", bound=SqlPool[Any])
# A schedule's (overlap, status) as stored; both None when the schedule was deleted.
Definition = tuple[str | None, str | None]

_RUNS_BESIDE = (OverlapPolicy.ALLOW.value, ScheduleStatus.ACTIVE.value)
_ALL_WAIT = (OverlapPolicy.BUFFER_ALL.value, ScheduleStatus.ACTIVE.value)


def new_claim(consumer: str, ttl_ms: int, now: int) -> Claim:
    """A claim minted at `now`, with its fresh token, before any fire is taken."""
    if ttl_ms <= 0:
        raise ValueError("a claim's TTL must be positive")
    return Claim(token=secrets.token_hex(16), consumer=consumer, claimed_till=now + ttl_ms)


def held_and_looked(
    running: Iterable[str], defined: Mapping[str, Definition]
) -> tuple[list[str], list[str]]:
    """Of the schedules with a running fire: those a claim's general scan leaves out, and of
    them those it must still look at apart.

    A running schedule whose fires may run beside it (allow, active) is claimed from like any
    other. The other running schedules are left out of the general scan (a long buffer-all
    backlog behind one running fire must not hide everyone else's fires) and looked at apart,
    except an active buffer-all one, whose fires all simply wait. (A deleted schedule has no
    definition: its fires are read, to be skipped.)"""
    held = sorted(sid for sid in running if defined.get(sid) != _RUNS_BESIDE)
    return held, [sid for sid in held if defined.get(sid) != _ALL_WAIT]


def heartbeat_report(run_ids: Sequence[int], held: Mapping[int, Any]) -> HeartbeatReport:
    """The report of a heartbeat: `held` maps the fires it extended to their
    cancel_requested_at."""
    report = HeartbeatReport()
    for rid in run_ids:
        if rid not in held:
            report.stale.append(rid)
            continue
        report.extended.append(rid)
        if held[rid] is not None:
            report.cancel_requested.append(rid)
    return report


@dataclass
class SettlePlan:
    """What a batch of settlements writes, once each fire was matched to the claim's token."""

    report: SettleReport = field(default_factory=SettleReport)
    # The parameters of settle_fire_sql, by outcome.
    fires: dict[Outcome, list[tuple[Any, ...]]] = field(default_factory=dict)
    # The parameters of settle_run_sql.
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    # The parameters of stale_ack_sql.
    stale: list[tuple[Any, ...]] = field(default_factory=list)


def plan_settle(
    settlements: Sequence[Settlement], held: Collection[int], consumer: str, now: int
) -> SettlePlan:
    """Settle the fires of `held` (those still carrying the token); the others are stale, and
    counted against the fire unless merely released."""
    plan = SettlePlan()
    unsettled = set(held)
    for s in settlements:
        if s.run_id not in unsettled:
            plan.report.stale.append(s.run_id)
            if s.outcome is not Outcome.RELEASE:
                plan.stale.append((consumer, now, s.run_id))
            continue
        unsettled.discard(s.run_id)  # a second settlement of one fire in a batch is stale
        plan.report.acked.append(s.run_id)
        plan.fires.setdefault(s.outcome, []).append(settle_fire_values(s, now))
        finished = None if s.outcome is Outcome.RELEASE else (s.finished_at or now)
        plan.runs.append((s.run_state.value, s.error, s.output, s.exit_code, finished, s.run_id))
    return plan


class SqlFireQueue(ABC, Generic[P]):
    """The fire queue's transactions, what they decide, and the operators' calls. A backend
    adds the steps that race with other consumers, each inside the transaction `conn` holds:
    taking fires into a claim, matching a settle's or a heartbeat's fires to their token,
    writing a settle, making fires available again, and inserting a run."""

    def __init__(self, pool: P, clock: Clock) -> None:
        self._pool = pool
        self._clock = clock

    @abstractmethod
    def _take(
        self, conn: Any, claim: Claim, now: int, limit: int, commands: Collection[str] | None
    ) -> None:
        """Take into `claim`, minted at `now`, up to `limit` (> 0) fires; note what was
        skipped, cancelled or asked to cancel."""

    @abstractmethod
    def _held(self, conn: Any, token: str, run_ids: list[int]) -> set[int]:
        """Which of `run_ids` still carry `token`, kept so until the transaction ends."""

    @abstractmethod
    def _write_settle(self, conn: Any, token: str, plan: SettlePlan) -> None:
        """Write what `plan` settles with `token`."""

    @abstractmethod
    def _extend(self, conn: Any, token: str, till: int, run_ids: Sequence[int]) -> dict[int, Any]:
        """Extend to `till` the claim of those of `run_ids` still carrying `token`: their
        cancel_requested_at by run id."""

    @abstractmethod
    def _make_available(self, conn: Any, where: str, args: dict[str, Any], at: int) -> list[int]:
        """Make the fires of `where` (a `selection`, with its named `args`) available again at
        `at`, unclaimed and no longer dead; their run ids."""

    @abstractmethod
    def _insert_run(self, conn: Any, run: NewRun, now: int) -> int | None:
        """Insert `run`; None when its slot key is taken."""

    # -- consumers --------------------------------------------------------------------------

    def claim(
        self,
        *,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None = None,
    ) -> Claim:
        with self._pool.transaction() as conn:
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
        with self._pool.transaction() as conn:
            reports = {
                token: self._settle_in(conn, token, consumer, batch)
                for token, batch in settlements.items()
            }
            return reports, self._claim_in(conn, consumer, ttl_ms, limit, commands)

    def settle(self, token: str, consumer: str, settlements: Sequence[Settlement]) -> SettleReport:
        if not settlements:
            return SettleReport()
        with self._pool.transaction() as conn:
            return self._settle_in(conn, token, consumer, settlements)

    def heartbeat(self, token: str, ttl_ms: int, run_ids: Sequence[int]) -> HeartbeatReport:
        if not run_ids:
            return HeartbeatReport()
        with self._pool.transaction() as conn:
            # A fire another claim took meanwhile no longer carries the token: not extended.
            held = self._extend(conn, token, self._clock.now_ms() + ttl_ms, run_ids)
        return heartbeat_report(run_ids, held)

    def _claim_in(
        self,
        conn: Any,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None,
    ) -> Claim:
        now = self._clock.now_ms()
        claim = new_claim(consumer, ttl_ms, now)
        if limit > 0:
            self._take(conn, claim, now, limit, commands)
        return claim

    def _settle_in(
        self, conn: Any, token: str, consumer: str, settlements: Sequence[Settlement]
    ) -> SettleReport:
        if not settlements:
            return SettleReport()
        now = self._clock.now_ms()
        held = self._held(conn, token, [s.run_id for s in settlements])
        plan = plan_settle(settlements, held, consumer, now)
        self._write_settle(conn, token, plan)
        return plan.report

    # -- manual fires -----------------------------------------------------------------------

    def enqueue(self, fires: Sequence[NewFire], *, available_at: int) -> EnqueueReport:
        report = EnqueueReport()
        if not fires:
            return report
        insert = insert_fire_sql(self._pool.dialect.mark)
        with self._pool.transaction() as conn:
            now = self._clock.now_ms()
            for fire in fires:
                run_id = self._insert_run(conn, fire_run(fire), now)
                if run_id is None:
                    report.already.append(fire.slot_key)
                    continue
                conn.execute(insert, fire_values(run_id, fire, available_at, now))
                report.inserted.append(run_id)
        return report

    def withdraw_ahead(self, schedule_id: str, now_ms: int) -> list[tuple[int, int]]:
        """Delete the schedule's fires written ahead of their instant and not taken by any
        consumer (never claimed, not yet available at `now_ms`), with their runs; (run id,
        slot) of each. An edit withdraws them so that the slot is dispatched again from the
        new definition: nothing ran, and the edit's audit entry names the runs withdrawn."""
        d = self._pool.dialect
        m = d.mark
        with self._pool.transaction() as conn:
            found = [
                (int(r[0]), int(r[1]))
                for r in conn.execute(
                    "SELECT f.run_id, f.slot_at FROM fire_queue f JOIN runs r ON r.id = f.run_id "
                    f"WHERE f.schedule_id = {m} AND f.available_at > {m} "
                    "AND f.lease_token IS NULL AND f.attempts = 0 AND f.completed_at IS NULL "
                    "AND f.discarded_at IS NULL AND r.kind = 'scheduled' "
                    "AND r.state = 'dispatched' ORDER BY f.run_id",
                    (schedule_id, now_ms),
                ).fetchall()
            ]
            if found:
                ids = d.bind_list([run_id for run_id, _ in found])
                conn.execute(
                    f"DELETE FROM fire_queue WHERE {d.one_of('run_id', m, 'bigint')}", (ids,)
                )
                conn.execute(f"DELETE FROM runs WHERE {d.one_of('id', m, 'bigint')}", (ids,))
        return found

    # -- operators --------------------------------------------------------------------------

    def get(self, run_id: int) -> Fire | None:
        found = self.read(FireQuery(run_ids=(run_id,), limit=1))
        return found[0] if found else None

    def read(self, query: FireQuery) -> list[Fire]:
        sql, args = fire_query_sql(query, self._pool.dialect, self._clock.now_ms())
        return [fire_from_row(r) for r in self._pool.read(sql, args)]

    def requeue(self, run_ids: Sequence[int] | None, *, at: int, tenant: str | None = None) -> int:
        d = self._pool.dialect
        with self._pool.transaction() as conn:
            # Never a completed fire: that would run a completed run again.
            where, args = selection(run_ids, tenant, d, dead_only=run_ids is None)
            targets = self._make_available(conn, where, args, at)
            if not targets:
                return 0
            # Both budgets start over (_make_available set requeued_at_attempt).
            conn.execute(
                "UPDATE fire_queue SET failures = 0, abandoned_at_requeue = abandoned_count "
                f"WHERE {d.one_of('run_id', d.mark, 'bigint')}",
                (d.bind_list(targets),),
            )
            conn.execute(
                "UPDATE runs SET state = 'dispatched', finished_at = NULL "
                f"WHERE {d.one_of('id', d.mark, 'bigint')} AND state <> 'dispatched'",
                (d.bind_list(targets),),
            )
        return len(targets)

    def purge(self, run_ids: Sequence[int] | None, *, tenant: str | None = None) -> int:
        where, args = selection(run_ids, tenant, self._pool.dialect, dead_only=True)
        return self._pool.write(f"DELETE FROM fire_queue AS f {where}", args)

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        sql, args = self._open(f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM}", tenant)
        sql += f" ORDER BY f.available_at, f.run_id LIMIT {self._pool.dialect.mark}"
        return [fire_from_row(r) for r in self._pool.read(sql, (*args, limit))]

    def cancel_requested(self, run_ids: Sequence[int]) -> list[int]:
        if not run_ids:
            return []
        d = self._pool.dialect
        sql = (
            f"SELECT run_id FROM fire_queue WHERE {d.one_of('run_id', d.mark, 'bigint')} "
            "AND cancel_requested_at IS NOT NULL AND lease_token IS NOT NULL"
        )
        return [r[0] for r in self._pool.read(sql, (d.bind_list(run_ids),))]

    def next_available_at(self) -> int | None:
        m = self._pool.dialect.mark
        sql = f"SELECT min(f.available_at) FROM fire_queue f WHERE {OPEN} AND f.available_at > {m}"
        found = scalar(self._pool, sql, (self._clock.now_ms(),))
        return None if found is None else int(found)

    def depth(self, tenant: str | None = None) -> int:
        return int(scalar(self._pool, *self._open("SELECT count(*) FROM fire_queue f", tenant)))

    def _open(self, select: str, tenant: str | None) -> tuple[str, tuple[Any, ...]]:
        """`select` (from `fire_queue f`) kept to the open fires, of `tenant` unless None."""
        if tenant is None:
            return f"{select} WHERE {OPEN}", ()
        return f"{select} WHERE {OPEN} AND f.tenant = {self._pool.dialect.mark}", (tenant,)
