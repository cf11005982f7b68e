"""Fire-queue rows for the SQL backends: the columns read, their decoding, the state and settle
conditions. The SQL here is common to SQLite and PostgreSQL; where a value is bound, the caller
passes its driver's placeholder (`?`, `:now`, `%s`, `%(now)s`)."""

from __future__ import annotations

import json
from typing import Any

from engine.domain.run import RunKind
from engine.ports.fire_queue import Fire, FireState, Outcome, Settlement

FIRE_COLUMNS = (
    "f.run_id, f.tenant, f.schedule_id, r.schedule_name, r.slot_key, f.slot_at, r.kind, "
    "f.command, f.payload, f.available_at, f.created_at, f.attempts, f.consecutive_failures, "
    "f.reschedules, f.abandoned_count, f.last_abandoned_by, f.last_abandoned_at, "
    "f.stale_ack_count, f.consumed_by, f.consumed_till, f.completed_at, f.discarded_at, "
    "f.discard_reason, f.last_error, f.lease_token, f.requeued_at_attempt"
)
FIRE_FROM = "fire_queue f JOIN runs r ON r.id = f.run_id"
OPEN = "f.completed_at IS NULL AND f.discarded_at IS NULL"
CLEAR_CLAIM = "lease_token = NULL, consumed_till = NULL, cancel_requested_at = NULL"


def fire_from_row(r: tuple[Any, ...]) -> Fire:
    """A row of FIRE_COLUMNS as a Fire."""
    return Fire(
        run_id=r[0],
        tenant=r[1],
        schedule_id=r[2],
        schedule_name=r[3],
        slot_key=r[4],
        slot_at=r[5],
        kind=RunKind(r[6]),
        command=r[7],
        payload=json.loads(r[8]),
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
            "consecutive_failures = consecutive_failures + 1, reschedules = 0, "
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
