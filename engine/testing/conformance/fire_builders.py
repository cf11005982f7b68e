"""Fires, claims and settlements for the fire queue's suites, built the way the engine builds
them: the fire of a schedule's slot, a claim, and each of the five settlements."""

from __future__ import annotations

import uuid
from typing import Any

from engine.domain.misfire import due_at
from engine.domain.run import Run, RunKind, RunState
from engine.domain.schedule import Schedule
from engine.domain.slots import manual_slot_key, slot_key
from engine.domain.timeutil import MINUTE_MS
from engine.ports.fire_queue import Claim, Fire, NewFire, Outcome, Settlement
from engine.ports.runs import RunQuery
from engine.ports.storage import Storage
from engine.testing.conformance.builders import FIRST_SLOT

TTL_MS = 30_000  # every claim's time to live, unless a test says otherwise
TTL_S = TTL_MS / 1000  # ManualClock.advance takes seconds


def slot(n: int) -> int:
    """The instant of the default trigger's n-th slot (every five minutes from FIRST_SLOT).

    Every such slot lies before the suites' T0: a fire available at a slot is claimable at
    once.
    """
    return FIRST_SLOT + n * 5 * MINUTE_MS


def new_fire(
    schedule: Schedule,
    slot_at: int,
    *,
    kind: RunKind = RunKind.SCHEDULED,
    tenant: str | None = None,
    command: str | None = None,
    payload: dict[str, Any] | None = None,
    node_id: str = "node-a",
) -> NewFire:
    """The fire of `schedule`'s slot at `slot_at`; a manual fire gets a fresh manual key."""
    key = (
        manual_slot_key(schedule.id, slot_at, uuid.uuid4().hex[:8])
        if kind is RunKind.MANUAL
        else slot_key(schedule.id, slot_at, schedule.timezone)
    )
    return NewFire(
        tenant=schedule.tenant if tenant is None else tenant,
        schedule_id=schedule.id,
        schedule_name=schedule.name,
        slot_key=key,
        slot_at=slot_at,
        due_at=due_at(schedule.id, slot_at, schedule.timezone, schedule.jitter_ms),
        kind=kind,
        command=schedule.command if command is None else command,
        payload=dict(schedule.payload) if payload is None else payload,
        node_id=node_id,
    )


def enqueue(
    storage: Storage,
    schedule: Schedule,
    slot_at: int,
    *,
    available_at: int | None = None,
    kind: RunKind = RunKind.SCHEDULED,
    tenant: str | None = None,
    command: str | None = None,
) -> int:
    """Enqueue one fire (available at its slot unless told otherwise); its run id."""
    report = storage.fire_queue.enqueue(
        [new_fire(schedule, slot_at, kind=kind, tenant=tenant, command=command)],
        available_at=slot_at if available_at is None else available_at,
    )
    assert report.already == [], "enqueue: a slot key the ledger does not hold yet must be stored"
    (run_id,) = report.inserted
    return run_id


def enqueue_slots(
    storage: Storage,
    schedule: Schedule,
    count: int,
    *,
    first: int = 0,
    kind: RunKind = RunKind.SCHEDULED,
) -> list[int]:
    """Enqueue `schedule`'s slots first .. first+count-1, each available at its slot."""
    return [enqueue(storage, schedule, slot(n), kind=kind) for n in range(first, first + count)]


def claim(
    storage: Storage, consumer: str = "worker-a", *, limit: int = 10, ttl_ms: int = TTL_MS
) -> Claim:
    """A claim of up to `limit` fires by `consumer`."""
    return storage.fire_queue.claim(consumer=consumer, ttl_ms=ttl_ms, limit=limit)


def claimed_ids(taken: Claim) -> list[int]:
    """The run ids of the fires a claim took, in the order it gave them."""
    return [f.run_id for f in taken.fires]


def fire_of(storage: Storage, run_id: int) -> Fire:
    """The queue's fire of this run (it must still be there)."""
    fire = storage.fire_queue.get(run_id)
    assert fire is not None, f"fire {run_id} is gone"
    return fire


def run_of(storage: Storage, run_id: int) -> Run:
    """The ledger's run with this id (it outlives its fire)."""
    found = [r for r in storage.runs.query(RunQuery(limit=100_000)) if r.id == run_id]
    assert found, f"run {run_id} is not in the ledger"
    return found[0]


# --- settlements ---------------------------------------------------------------------------


def complete(
    run_id: int,
    *,
    state: RunState = RunState.COMPLETED,
    output: str | None = None,
    exit_code: int | None = None,
    finished_at: int | None = None,
) -> Settlement:
    """The fire ran: close it, its run ending in `state`."""
    return Settlement(
        run_id,
        Outcome.COMPLETE,
        state,
        output=output,
        exit_code=exit_code,
        finished_at=finished_at,
    )


def fail(run_id: int, at: int, error: str = "boom") -> Settlement:
    """The fire failed: retry it at `at`."""
    return Settlement(run_id, Outcome.FAIL, RunState.DISPATCHED, error=error, available_at=at)


def reschedule(run_id: int, at: int) -> Settlement:
    """Run the fire again at `at`, no failure counted."""
    return Settlement(run_id, Outcome.RESCHEDULE, RunState.DISPATCHED, available_at=at)


def discard(
    run_id: int, reason: str = "poison message", *, state: RunState = RunState.DEAD_LETTERED
) -> Settlement:
    """Dead-letter the fire for `reason`."""
    return Settlement(run_id, Outcome.DISCARD, state, error=reason)


def release(run_id: int) -> Settlement:
    """Give the fire back, claimable at once."""
    return Settlement(run_id, Outcome.RELEASE, RunState.DISPATCHED)


def settlement_for(run_id: int, outcome: Outcome, state: RunState, at: int) -> Settlement:
    """A settlement of any outcome (FAIL and RESCHEDULE come back at `at`)."""
    needs_instant = outcome in (Outcome.FAIL, Outcome.RESCHEDULE)
    return Settlement(
        run_id,
        outcome,
        state,
        error="why" if outcome in (Outcome.FAIL, Outcome.DISCARD) else None,
        available_at=at if needs_instant else None,
    )
