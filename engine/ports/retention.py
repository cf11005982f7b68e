"""Retention: per-tenant overrides, and the run ledger as the sweeper walks and prunes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class RetentionOverride:
    """How long one tenant's run history is kept, instead of the sweeper's default.
    `days == 0` is a legal hold: nothing of the tenant is ever pruned."""

    tenant: str
    days: int
    reason: str | None
    set_by: str
    set_at: int  # ms since the epoch, UTC

    @property
    def legal_hold(self) -> bool:
        return self.days == 0


class RunStanding(StrEnum):
    """Where a run stands for retention, from its state and its fire's."""

    OPEN = "open"  # dispatched or running, or its fire is still open: never pruned
    SETTLED = "settled"  # terminal, its fire completed (or gone): history
    DEAD_LETTER = "dead_letter"  # terminal, its fire a dead letter an operator may requeue


class RunAge(NamedTuple):
    """What the sweeper needs to know of one run to judge it. (A named tuple: a sweep makes
    millions, and a tuple is several times cheaper to build than a frozen dataclass.)"""

    run_id: int
    tenant: str
    standing: RunStanding
    dispatched_at: int
    # The instant its age counts from: a settled run's finish (its dispatch when it has none),
    # a dead letter's discarding (else the run's finish, else its dispatch).
    aged_from: int
    has_fire: bool  # its fire-queue row is still there


class RetentionStore(Protocol):
    """Retention overrides, and the run ledger as retention reads and prunes it.

    Contract:
    - Override changes are atomic and join the caller's transaction (`Storage.atomic`).
    - `examine` only reads, and needs no write lock.
    - `delete` removes each run it is given together with its fire-queue row, in one
      transaction (the caller's, when it holds one): never a run without its fire or a fire
      without its run. Whatever ids it is given, it never removes an open run (dispatched or
      running), a run whose fire is still open, or the newest run of the ledger (run ids are
      the newest id plus one: keeping it means an id is never handed out twice).
    - Neither ever offers nor removes the newest run.
    """

    def overrides(self) -> list[RetentionOverride]:
        """Every override, by tenant."""
        ...

    def override(self, tenant: str) -> RetentionOverride | None: ...

    def set_override(self, override: RetentionOverride) -> None:
        """Create or replace the tenant's override."""
        ...

    def remove_override(self, tenant: str) -> bool:
        """False when the tenant had none (nothing changes)."""
        ...

    def examine(self, after_run_id: int, limit: int) -> list[RunAge]:
        """Up to `limit` runs with ids above `after_run_id`, in id order (the order of
        dispatch), the newest run excepted."""
        ...

    def delete(
        self, run_ids: Sequence[int], *, still: Callable[[RunAge], bool] | None = None
    ) -> list[RunAge]:
        """Remove these runs and their fires (see the contract), each only if `still` (when
        given) accepts it as it stands now, inside the transaction that removes it; returns
        what was removed, as it stood, in id order."""
        ...
