"""The fire queue: the outbox consumers execute from, with job-store claim semantics."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from engine.domain.run import RunKind, RunState
from engine.domain.values import JsonValue


class FireState(StrEnum):
    """Derived from a fire's columns at an instant; never stored."""

    SCHEDULED = "scheduled"  # waits for its available_at (a retry, a reschedule)
    CLAIMABLE = "claimable"
    CLAIMED = "claimed"  # under a live claim
    COMPLETED = "completed"
    DISCARDED = "discarded"  # a dead letter


@dataclass(frozen=True, slots=True)
class Fire:
    """One fire: a run's work item. Identified by its run id."""

    run_id: int
    tenant: str
    schedule_id: str
    schedule_name: str
    slot_key: str
    slot_at: int
    kind: RunKind
    command: str
    payload: dict[str, JsonValue]
    available_at: int
    created_at: int
    attempts: int  # claims so far, this one included
    consecutive_failures: int = 0
    reschedules: int = 0
    abandoned_count: int = 0
    last_abandoned_by: str | None = None
    last_abandoned_at: int | None = None
    stale_ack_count: int = 0
    consumed_by: str | None = None
    consumed_till: int | None = None
    completed_at: int | None = None
    discarded_at: int | None = None
    discard_reason: str | None = None
    last_error: str | None = None
    lease_token: str | None = None
    requeued_at_attempt: int = 0  # attempts when an operator last requeued it
    failures: int = 0  # failed attempts retried since the last requeue (a timeout is one)
    abandoned_at_requeue: int = 0  # abandoned_count when an operator last requeued it

    @property
    def round_attempts(self) -> int:
        """Claims since the last requeue, this one included (whatever became of them)."""
        return self.attempts - self.requeued_at_attempt

    @property
    def round_deaths(self) -> int:
        """Attempts since the last requeue whose consumer vanished (killed, or frozen past
        its claim): what the consumer-death budget counts."""
        return self.abandoned_count - self.abandoned_at_requeue

    def state_at(self, now_ms: int) -> FireState:
        if self.discarded_at is not None:
            return FireState.DISCARDED
        if self.completed_at is not None:
            return FireState.COMPLETED
        if self.consumed_till is not None and self.consumed_till > now_ms:
            return FireState.CLAIMED
        if self.available_at > now_ms:
            return FireState.SCHEDULED
        return FireState.CLAIMABLE


@dataclass(frozen=True, slots=True)
class NewFire:
    """A fire asked for outside the daemon's dispatch (trigger now, backfill)."""

    tenant: str
    schedule_id: str
    schedule_name: str
    slot_key: str
    slot_at: int
    due_at: int
    kind: RunKind
    command: str
    payload: dict[str, JsonValue]
    node_id: str


@dataclass(slots=True)
class EnqueueReport:
    inserted: list[int] = field(default_factory=list)  # run ids, in the order given
    already: list[str] = field(default_factory=list)  # slot keys the ledger already held


@dataclass(slots=True)
class Claim:
    """What one claim call took. One token for the whole batch, minted even when empty."""

    token: str
    consumer: str
    claimed_till: int
    fires: list[Fire] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # run id -> why (overlap, pause)
    cancelled: dict[int, str] = field(default_factory=dict)  # superseded before running
    cancel_requested: list[int] = field(default_factory=list)  # running fires asked to stop


class Outcome(StrEnum):
    COMPLETE = "complete"  # done: the run completed (or ended skipped / cancelled)
    FAIL = "fail"  # retry at `available_at`; bumps the failure streak and the failures
    RESCHEDULE = "reschedule"  # run again at `available_at`; not an error
    DISCARD = "discard"  # a dead letter, with a reason
    RELEASE = "release"  # give the fire back at once; no counter changes


@dataclass(frozen=True, slots=True)
class Settlement:
    """One fire's outcome, as its consumer reports it."""

    run_id: int
    outcome: Outcome
    run_state: RunState  # what the run becomes; must agree with the outcome
    error: str | None = None
    output: str | None = None
    exit_code: int | None = None
    finished_at: int | None = None
    available_at: int | None = None  # FAIL and RESCHEDULE
    timed_out: bool = False  # the attempt outran its time limit (a FAIL, or timed_out)

    def __post_init__(self) -> None:
        allowed = _RUN_STATES_BY_OUTCOME[self.outcome]
        if self.run_state not in allowed:
            raise ValueError(f"a {self.outcome} settlement cannot leave its run {self.run_state}")
        if self.outcome in (Outcome.FAIL, Outcome.RESCHEDULE) and self.available_at is None:
            raise ValueError(f"a {self.outcome} settlement needs available_at")


_RUN_STATES_BY_OUTCOME = {
    Outcome.COMPLETE: frozenset({RunState.COMPLETED, RunState.CANCELLED, RunState.SKIPPED}),
    Outcome.FAIL: frozenset({RunState.DISPATCHED}),
    Outcome.RESCHEDULE: frozenset({RunState.DISPATCHED}),
    Outcome.DISCARD: frozenset({RunState.DEAD_LETTERED, RunState.FAILED, RunState.TIMED_OUT}),
    Outcome.RELEASE: frozenset({RunState.DISPATCHED}),
}


@dataclass(slots=True)
class SettleReport:
    acked: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)  # another claim owns them, or settled


@dataclass(slots=True)
class HeartbeatReport:
    extended: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)
    cancel_requested: list[int] = field(default_factory=list)  # extended, but asked to stop


@dataclass(frozen=True, slots=True)
class FireQuery:
    """Which fires to read, oldest first by run id. Empty `states` means any state;
    `tenants`, when given, keeps only those tenants' (an operator's scope)."""

    tenant: str | None = None
    tenants: frozenset[str] | None = None
    schedule_id: str | None = None
    states: frozenset[FireState] = frozenset()
    run_ids: tuple[int, ...] | None = None
    limit: int = 100


class FireQueue(Protocol):
    """Fires are written with their run (by dispatch, or `enqueue`); consumers claim and settle.

    Contract (job-store semantics; every call is one transaction; instants come from the
    backend's clock):
    - `claim` takes open fires with `available_at <= now` and no live claim, oldest available
      first, whose command is in `commands` (None: any), at most `limit`. It mints one fresh
      token for the batch (also for an empty batch), sets `consumed_till = now + ttl_ms`,
      `attempts + 1`, and moves each run to `running`. A fire whose previous claim expired is
      taken over: its abandonment is counted (count, by whom, the old deadline) and the run
      stays `running`. Overlap policies are applied in the same transaction (see
      engine.domain.overlap): fires are skipped, left waiting, or cancelled, and running
      fires of a cancel-other schedule are asked to stop. Scheduled fires of a paused schedule,
      and every fire of a deleted one, are skipped.
    - `heartbeat` extends the claim of fires still held by `token`, even after its deadline,
      unless another claim took them; the others are reported stale (not counted). It reports
      which held fires were asked to stop.
    - `settle` applies each settlement to a fire still held by `token`, even after its
      deadline, unless another claim took it or it was settled already; those are reported
      stale and change nothing, and a stale outcome other than release counts a stale ack.
      Never raises for staleness. Every outcome clears the claim; the run moves with it,
      through legal transitions only.
    - `requeue` makes dead letters (or any open fire) available again at `at`, clearing the
      claim (which fences its holder) and moving the run back to `dispatched`; counters stay,
      but the failure streak and both budgets (`failures`, `round_deaths`) start over.
    - Budgets: a FAIL settlement counts one failure (`failures`); a claim taking over an
      expired claim counts a consumer death (`abandoned_count`). A reschedule, a release, or
      a death never counts as a failure.
    - `purge` deletes dead letters; their runs stay in the ledger.
    - `enqueue` writes runs and fires for manual and backfill slots, skipping slot keys the
      ledger already holds; never touches a schedule's cursor.
    """

    def claim(
        self,
        *,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None = None,
    ) -> Claim: ...

    def settle_and_claim(
        self,
        settlements: Mapping[str, Sequence[Settlement]],
        *,
        consumer: str,
        ttl_ms: int,
        limit: int,
        commands: Collection[str] | None = None,
    ) -> tuple[dict[str, SettleReport], Claim]:
        """`settle` for each token's settlements, then `claim`, in one transaction: a busy
        consumer takes the write lock once per round instead of twice."""
        ...

    def heartbeat(self, token: str, ttl_ms: int, run_ids: Sequence[int]) -> HeartbeatReport: ...

    def settle(
        self, token: str, consumer: str, settlements: Sequence[Settlement]
    ) -> SettleReport: ...

    def enqueue(self, fires: Sequence[NewFire], *, available_at: int) -> EnqueueReport: ...

    def get(self, run_id: int) -> Fire | None: ...

    def read(self, query: FireQuery) -> list[Fire]: ...

    def requeue(self, run_ids: Sequence[int] | None, *, at: int, tenant: str | None = None) -> int:
        """Requeue these dead letters (None: every dead letter of `tenant`, or of all)."""
        ...

    def purge(self, run_ids: Sequence[int] | None, *, tenant: str | None = None) -> int:
        """Delete these dead letters (None: every dead letter of `tenant`, or of all)."""
        ...

    def withdraw_ahead(self, schedule_id: str, now_ms: int) -> list[tuple[int, int]]:
        """Delete the schedule's fires written ahead (not yet available at `now_ms`, never
        claimed) with their runs, inside the caller's transaction; (run id, slot) of each."""
        ...

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        """Open fires (not completed, not discarded), oldest available first."""
        ...

    def cancel_requested(self, run_ids: Sequence[int]) -> list[int]:
        """Which of these fires were asked to stop (cancel-other). A read."""
        ...

    def next_available_at(self) -> int | None:
        """The earliest `available_at` after now of an open fire (a retry, a reschedule)."""
        ...

    def depth(self, tenant: str | None = None) -> int:
        """How many fires are open."""
        ...
