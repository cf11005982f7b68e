"""Fires, claims and settlements for the fire queue's conformance suite."""

from __future__ import annotations

import uuid
from typing import Any

import apsw
import pytest

from engine.domain.misfire import due_at
from engine.domain.run import Run, RunKind, RunState
from engine.domain.schedule import Schedule
from engine.domain.slots import manual_slot_key, slot_key
from engine.domain.timeutil import MINUTE_MS
from engine.ports.fire_queue import Claim, Fire, NewFire, Outcome, Settlement
from engine.ports.runs import RunQuery
from engine.ports.storage import Storage
from tests.conformance._builders import FIRST_SLOT

TTL_MS = 30_000  # every claim's time to live, unless a test says otherwise
TTL_S = TTL_MS / 1000  # ManualClock.advance takes seconds


def slot(n: int) -> int:
    """The instant of the default trigger's n-th slot (every five minutes from FIRST_SLOT).

    Every such slot lies before the clock fixture's T0: a fire available at a slot is
    claimable at once.
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
    assert report.already == []
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
    return storage.fire_queue.claim(consumer=consumer, ttl_ms=ttl_ms, limit=limit)


def claimed_ids(taken: Claim) -> list[int]:
    return [f.run_id for f in taken.fires]


def fire_of(storage: Storage, run_id: int) -> Fire:
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
    return Settlement(
        run_id,
        Outcome.COMPLETE,
        state,
        output=output,
        exit_code=exit_code,
        finished_at=finished_at,
    )


def fail(run_id: int, at: int, error: str = "boom") -> Settlement:
    return Settlement(run_id, Outcome.FAIL, RunState.DISPATCHED, error=error, available_at=at)


def reschedule(run_id: int, at: int) -> Settlement:
    return Settlement(run_id, Outcome.RESCHEDULE, RunState.DISPATCHED, available_at=at)


def discard(
    run_id: int, reason: str = "poison message", *, state: RunState = RunState.DEAD_LETTERED
) -> Settlement:
    return Settlement(run_id, Outcome.DISCARD, state, error=reason)


def release(run_id: int) -> Settlement:
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


# --- the SQL underneath --------------------------------------------------------------------


class Refused(Exception):
    """The store refused a statement (a constraint or trigger), whatever the backend."""


class SqlConnection:
    """This thread's connection to the store's tables, for checks that go beneath the ports:
    `?` placeholders on every backend, a refusal raised as Refused."""

    def __init__(self, storage: Storage) -> None:
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 (one case each)
        from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415

        self._postgres = isinstance(storage, PostgresBackend)
        if isinstance(storage, PostgresBackend):
            self._conn: Any = storage.pool.get()
        elif isinstance(storage, SqliteBackend):
            self._conn = storage.pool.get()
        else:
            pytest.skip(f"no SQL access to {type(storage).__name__} here")

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (a RETURNING or SELECT gives its rows)."""
        import psycopg  # noqa: PLC0415

        try:
            if self._postgres:
                cursor = self._conn.execute(sql.replace("?", "%s"), args)
                return list(cursor.fetchall()) if cursor.description else []
            return list(self._conn.execute(sql, args))
        except (apsw.ConstraintError, psycopg.errors.IntegrityError) as exc:
            raise Refused(str(exc)) from exc


def sql_connection(storage: Storage) -> SqlConnection:
    """This thread's connection to the store's tables (see SqlConnection)."""
    return SqlConnection(storage)
