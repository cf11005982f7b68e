"""Fire-queue rows for the SQL backends: the columns read, their decoding, the state and settle
conditions, the operators' selections. The SQL here is common to SQLite and PostgreSQL; where a
value is bound, the caller passes its driver's placeholder (`?`, `:now`, `%s`, `%(now)s`) or
its Dialect."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.backends.sql import Dialect
from engine.domain.overlap import Candidate
from engine.domain.run import NewRun, RunKind
from engine.domain.schedule import OverlapPolicy, ScheduleStatus, canonical_json
from engine.ports.fire_queue import Fire, FireQuery, FireState, NewFire, Outcome, Settlement

FIRE_COLUMNS = (
    "f.run_id, f.tenant, f.schedule_id, r.schedule_name, r.slot_key, f.slot_at, r.kind, "
    "f.command, f.payload, f.available_at, f.created_at, f.attempts, f.consecutive_failures, "
    "f.reschedules, f.abandoned_count, f.last_abandoned_by, f.last_abandoned_at, "
    "f.stale_ack_count, f.consumed_by, f.consumed_till, f.completed_at, f.discarded_at, "
    "f.discard_reason, f.last_error, f.lease_token, f.requeued_at_attempt, f.failures, "
    "f.abandoned_at_requeue"
)
FIRE_FROM = "fire_queue f JOIN runs r ON r.id = f.run_id"
OPEN = "f.completed_at IS NULL AND f.discarded_at IS NULL"
CLEAR_CLAIM = "lease_token = NULL, consumed_till = NULL, cancel_requested_at = NULL"
# What a claim plans on, per fire (see candidate_from_row).
CANDIDATES = (
    "SELECT f.run_id, f.schedule_id, r.kind, s.overlap, s.status, f.available_at "
    "FROM fire_queue f JOIN runs r ON r.id = f.run_id LEFT JOIN schedules s ON s.id = f.schedule_id"
)
FIRE_INSERT_COLUMNS = (
    "run_id, tenant, schedule_id, slot_at, command, payload, available_at, created_at"
)


# Stored values to their enums by a dict lookup: a claim decodes every fire and candidate it
# reads, and calling the Enum is several times slower.
_KINDS = {k.value: k for k in RunKind}
_POLICIES = {p.value: p for p in OverlapPolicy}
_ACTIVE = ScheduleStatus.ACTIVE.value


def fire_from_row(r: tuple[Any, ...]) -> Fire:
    """A row of FIRE_COLUMNS as a Fire."""
    payload = r[8]
    return Fire(
        run_id=r[0],
        tenant=r[1],
        schedule_id=r[2],
        schedule_name=r[3],
        slot_key=r[4],
        slot_at=r[5],
        kind=_KINDS[r[6]],
        command=r[7],
        payload={} if payload == "{}" else json.loads(payload),
        available_at=r[9],
        created_at=r[10],
        attempts=r[11],
        consecutive_failures=r[12],
        reschedules=r[13],
        abandoned_count=r[14],
        last_abandoned_by=r[15],
        last_abandoned_at=r[16],
        stale_ack_count=r[17],
        consumed_by=r[18],
        consumed_till=r[19],
        completed_at=r[20],
        discarded_at=r[21],
        discard_reason=r[22],
        last_error=r[23],
        lease_token=r[24],
        requeued_at_attempt=r[25],
        failures=r[26],
        abandoned_at_requeue=r[27],
    )


def claimable_clause(now: str) -> str:
    """Open, available at `now`, and not under a live claim (an expired claim is up for grabs)."""
    return (
        f"{OPEN} AND f.available_at <= {now} "
        f"AND (f.lease_token IS NULL OR f.consumed_till <= {now})"
    )


def state_clause(state: FireState, now: str) -> str:
    """The condition of a fire being in `state` at the instant bound to `now`."""
    unclaimed = f"{OPEN} AND (f.consumed_till IS NULL OR f.consumed_till <= {now})"
    return {
        FireState.DISCARDED: "f.discarded_at IS NOT NULL",
        FireState.COMPLETED: "f.completed_at IS NOT NULL",
        FireState.CLAIMED: f"{OPEN} AND f.consumed_till > {now}",
        FireState.SCHEDULED: f"{unclaimed} AND f.available_at > {now}",
        FireState.CLAIMABLE: f"{unclaimed} AND f.available_at <= {now}",
    }[state]


def settle_fire_sql(outcome: Outcome, mark: str) -> str:
    """The UPDATE applying `outcome` to one fire, ending in `WHERE run_id = <mark>`; its
    parameters are `settle_fire_values`."""
    return {
        Outcome.COMPLETE: f"UPDATE fire_queue SET completed_at = {mark}, {CLEAR_CLAIM}",
        Outcome.DISCARD: (
            f"UPDATE fire_queue SET discarded_at = {mark}, discard_reason = {mark}, "
            f"last_error = {mark}, {CLEAR_CLAIM}"
        ),
        Outcome.FAIL: (
            f"UPDATE fire_queue SET available_at = {mark}, last_error = {mark}, "
            "consecutive_failures = consecutive_failures + 1, failures = failures + 1, "
            "reschedules = 0, "
            f"{CLEAR_CLAIM}"
        ),
        Outcome.RESCHEDULE: (
            f"UPDATE fire_queue SET available_at = {mark}, reschedules = reschedules + 1, "
            f"consecutive_failures = 0, {CLEAR_CLAIM}"
        ),
        Outcome.RELEASE: f"UPDATE fire_queue SET {CLEAR_CLAIM}",
    }[outcome] + f" WHERE run_id = {mark}"


def settle_fire_values(s: Settlement, now: int) -> tuple[Any, ...]:
    """The parameters of settle_fire_sql(s.outcome, ...)."""
    if s.outcome is Outcome.COMPLETE:
        return (now, s.run_id)
    if s.outcome is Outcome.DISCARD:
        return (now, s.error, s.error, s.run_id)
    if s.outcome is Outcome.FAIL:
        return (s.available_at, s.error, s.run_id)
    if s.outcome is Outcome.RESCHEDULE:
        return (s.available_at, s.run_id)
    return (s.run_id,)


def settle_run_sql(mark: str) -> str:
    """The UPDATE recording a settled fire's run; its parameters come from settle plans."""
    return (
        f"UPDATE runs SET state = {mark}, error = {mark}, output = {mark}, exit_code = {mark}, "
        f"finished_at = {mark} WHERE id = {mark}"
    )


def stale_ack_sql(mark: str) -> str:
    """The UPDATE counting a settlement that came with a token no longer the fire's."""
    return (
        "UPDATE fire_queue SET stale_ack_count = stale_ack_count + 1, "
        f"last_stale_ack_by = {mark}, last_stale_ack_at = {mark} WHERE run_id = {mark}"
    )


def candidate_from_row(r: tuple[Any, ...]) -> Candidate:
    """A row of CANDIDATES."""
    return Candidate(
        run_id=r[0],
        schedule_id=r[1],
        kind=_KINDS[r[2]],
        policy=None if r[3] is None else _POLICIES[r[3]],
        active=r[4] == _ACTIVE,
    )


def insert_fire_sql(mark: str) -> str:
    """The insert of one fire, its values `fire_values`."""
    return f"INSERT INTO fire_queue ({FIRE_INSERT_COLUMNS}) VALUES ({', '.join([mark] * 8)})"


def fire_values(run_id: int, fire: NewFire, available_at: int, now: int) -> tuple[Any, ...]:
    """The parameters of insert_fire_sql."""
    return (
        run_id,
        fire.tenant,
        fire.schedule_id,
        fire.slot_at,
        fire.command,
        canonical_json(fire.payload),
        available_at,
        now,
    )


def fire_run(fire: NewFire) -> NewRun:
    """The run a manual fire is recorded by."""
    return NewRun(
        tenant=fire.tenant,
        schedule_id=fire.schedule_id,
        schedule_name=fire.schedule_name,
        slot_key=fire.slot_key,
        slot_at=fire.slot_at,
        due_at=fire.due_at,
        kind=fire.kind,
        node_id=fire.node_id,
    )


def fire_query_sql(query: FireQuery, dialect: Dialect, now: int) -> tuple[str, dict[str, Any]]:
    """The SELECT answering `query` at `now`, and its named parameters."""
    p = dialect.param
    clauses: list[str] = []
    args: dict[str, Any] = {"now": now, "limit": query.limit}
    if query.tenant is not None:
        clauses.append(f"f.tenant = {p('tenant')}")
        args["tenant"] = query.tenant
    if query.tenants is not None:  # an empty scope matches nothing
        clauses.append(dialect.one_of("f.tenant", p("scope"), "text"))
        args["scope"] = dialect.bind_list(sorted(query.tenants))
    if query.schedule_id is not None:
        clauses.append(f"f.schedule_id = {p('sid')}")
        args["sid"] = query.schedule_id
    if query.run_ids is not None:
        clauses.append(dialect.one_of("f.run_id", p("ids"), "bigint"))
        args["ids"] = dialect.bind_list(query.run_ids)
    if query.states:
        either = " OR ".join(f"({state_clause(s, p('now'))})" for s in sorted(query.states))
        clauses.append(f"({either})")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    sql = f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} {where} ORDER BY f.run_id LIMIT {p('limit')}"
    return sql, args


def selection(
    run_ids: Sequence[int] | None, tenant: str | None, dialect: Dialect, *, dead_only: bool
) -> tuple[str, dict[str, Any]]:
    """The WHERE clause (over `fire_queue f`) of the fires an operator requeues or purges, and
    its named parameters: never a completed one."""
    p = dialect.param
    clauses = ["f.completed_at IS NULL"]
    args: dict[str, Any] = {}
    if dead_only:
        clauses.append("f.discarded_at IS NOT NULL")
    if run_ids is not None:
        clauses.append(dialect.one_of("f.run_id", p("ids"), "bigint"))
        args["ids"] = dialect.bind_list(run_ids)
    if tenant is not None:
        clauses.append(f"f.tenant = {p('tenant')}")
        args["tenant"] = tenant
    return "WHERE " + " AND ".join(clauses), args
