"""Runs: the ledger's record of one dispatched slot and what became of it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RunState(StrEnum):
    DISPATCHED = "dispatched"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


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
    }
)


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

    @property
    def lateness_ms(self) -> int:
        """How long after it was due the slot was dispatched."""
        return max(0, self.dispatched_at - self.due_at)


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
