"""Runs: the ledger's record of one dispatched slot and what became of it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RunState(StrEnum):
    """Where a run is in its life cycle (the store enforces LEGAL_TRANSITIONS).

    - dispatched: waiting in the fire queue (first attempt, or a retry after a failed one)
    - running: a consumer holds its fire
    - completed: the command succeeded
    - failed: the command failed for good (it said the failure is permanent)
    - dead_lettered: retries exhausted, abandoned too often, or discarded; `vortos queue
      requeue` brings it back
    - skipped: the overlap policy, or a pause or delete of its schedule, kept it from running
    - cancelled: cancel-other stopped it, or a newer fire superseded it
    - timed_out: its last attempt outran its time limit and no retry was left; `vortos queue
      requeue` brings it back
    """

    DISPATCHED = "dispatched"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


class RunKind(StrEnum):
    SCHEDULED = "scheduled"  # a slot of the trigger
    MANUAL = "manual"  # trigger now
    BACKFILL = "backfill"


TERMINAL_STATES = frozenset(
    {
        RunState.COMPLETED,
        RunState.FAILED,
        RunState.DEAD_LETTERED,
        RunState.SKIPPED,
        RunState.CANCELLED,
        RunState.TIMED_OUT,
    }
)


# from -> the states it may move to. A state moving to itself is always allowed (a re-claim
# after an abandoned attempt keeps a run `running`).
LEGAL_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.DISPATCHED: frozenset(
        {RunState.RUNNING, RunState.SKIPPED, RunState.CANCELLED, RunState.DEAD_LETTERED}
    ),
    RunState.RUNNING: frozenset(
        {
            RunState.COMPLETED,
            RunState.FAILED,
            RunState.DEAD_LETTERED,
            RunState.CANCELLED,
            RunState.DISPATCHED,  # a retry, a reschedule or a release
            RunState.SKIPPED,  # an abandoned attempt whose schedule was paused meanwhile
            RunState.TIMED_OUT,  # outran its time limit, no retry left
        }
    ),
    RunState.FAILED: frozenset({RunState.DISPATCHED}),  # requeued by an operator
    RunState.DEAD_LETTERED: frozenset({RunState.DISPATCHED}),
    RunState.TIMED_OUT: frozenset({RunState.DISPATCHED}),
    RunState.COMPLETED: frozenset(),
    RunState.SKIPPED: frozenset(),
    RunState.CANCELLED: frozenset(),
}


def may_move(source: RunState, target: RunState) -> bool:
    return source is target or target in LEGAL_TRANSITIONS[source]


@dataclass(frozen=True, slots=True)
class Run:
    """One row of the run ledger. `slot_key` is unique per tenant."""

    id: int
    tenant: str
    schedule_id: str
    schedule_name: str
    slot_key: str
    slot_at: int
    due_at: int
    kind: RunKind
    state: RunState
    dispatched_at: int
    node_id: str
    attempts: int = 0
    finished_at: int | None = None
    error: str | None = None
    started_at: int | None = None
    consumer: str | None = None
    exit_code: int | None = None
    output: str | None = None
    abandoned: int = 0

    @property
    def lateness_ms(self) -> int:
        """How long after it was due the slot was dispatched."""
        return max(0, self.dispatched_at - self.due_at)

    @property
    def duration_ms(self) -> int | None:
        """How long the latest attempt took, once it finished."""
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0, self.finished_at - self.started_at)


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to record: everything but what the store assigns."""

    tenant: str
    schedule_id: str
    schedule_name: str
    slot_key: str
    slot_at: int
    due_at: int
    kind: RunKind
    node_id: str
