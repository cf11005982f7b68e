"""The fire queue's suite on our backends, and what it cannot check through the ports: the
store's own refusal of an illegal run state transition written in SQL, and the settlement's
validation of its run state (no store involved)."""

from __future__ import annotations

import pytest

from engine import RunState
from engine.domain.run import may_move
from engine.domain.schedule import Schedule
from engine.ports.fire_queue import Outcome, Settlement
from engine.ports.storage import Storage
from engine.testing.conformance.builders import make_run, stored_schedule
from engine.testing.conformance.fire_builders import (
    claim,
    complete,
    enqueue,
    run_of,
    settlement_for,
    slot,
)
from engine.testing.conformance.fire_queue import (
    FireQueueConformance,
    free_schedule,
    settle_one,
)
from tests.conformance._backends import OnPostgres, OnSqlite
from tests.conformance._fire_builders import Refused, SqlConnection, sql_connection


def insert_run_in_state(conn: SqlConnection, schedule: Schedule, at: int, state: RunState) -> int:
    """A run put straight into `state` (the store checks updates of state, not inserts)."""
    new = make_run(schedule, at)
    inserted = conn.execute(
        "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, "
        "state, dispatched_at, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            new.tenant,
            new.schedule_id,
            new.schedule_name,
            new.slot_key,
            new.slot_at,
            new.due_at,
            new.kind.value,
            state.value,
            at,
            new.node_id,
        ),
    )
    return int(inserted[0][0])


class BeneathThePorts:
    """The run state machine as our schemas enforce it, written in SQL: for our backends only."""

    def test_an_illegal_transition_written_in_sql_is_refused_by_the_store(
        self, storage: Storage
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        settle_one(storage, claim(storage), complete(run_id))
        conn = sql_connection(storage)

        with pytest.raises(Refused, match="illegal run state transition"):
            conn.execute("UPDATE runs SET state = 'running' WHERE state = 'completed'")

        assert run_of(storage, run_id).state is RunState.COMPLETED

    def test_the_stores_trigger_and_may_move_agree_on_every_pair_of_run_states(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage)
        conn = sql_connection(storage)
        pairs = [(source, target) for source in RunState for target in RunState]
        disagree = []
        refusals = set()
        for n, (source, target) in enumerate(pairs):
            run_id = insert_run_in_state(conn, schedule, slot(n), source)
            try:
                conn.execute("UPDATE runs SET state = ? WHERE id = ?", (target.value, run_id))
            except Refused as exc:
                refusals.add(str(exc).splitlines()[0])
                store_allows = False
            else:
                store_allows = True
            if store_allows != may_move(source, target):
                disagree.append((source.value, target.value, store_allows))

        assert disagree == []
        assert len(refusals) == 1
        assert "illegal run state transition" in refusals.pop()


class TestOnSqlite(OnSqlite, BeneathThePorts, FireQueueConformance):
    serialises_writes = True


class TestOnPostgres(OnPostgres, BeneathThePorts, FireQueueConformance): ...


def test_a_settlement_accepts_only_the_run_states_its_outcome_allows() -> None:
    allowed = {
        Outcome.COMPLETE: {RunState.COMPLETED, RunState.CANCELLED, RunState.SKIPPED},
        Outcome.FAIL: {RunState.DISPATCHED},
        Outcome.RESCHEDULE: {RunState.DISPATCHED},
        Outcome.DISCARD: {RunState.DEAD_LETTERED, RunState.FAILED, RunState.TIMED_OUT},
        Outcome.RELEASE: {RunState.DISPATCHED},
    }
    accepted: dict[Outcome, set[RunState]] = {outcome: set() for outcome in Outcome}
    for outcome in Outcome:
        for state in RunState:
            try:
                settlement_for(1, outcome, state, at=0)
            except ValueError:
                continue
            accepted[outcome].add(state)

    assert accepted == allowed
    for outcome in (Outcome.FAIL, Outcome.RESCHEDULE):  # a retry needs its instant
        with pytest.raises(ValueError, match="available_at"):
            Settlement(1, outcome, RunState.DISPATCHED)
