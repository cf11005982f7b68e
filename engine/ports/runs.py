"""The run ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.domain.run import NewRun, Run, RunState


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs to list, newest first: by slot within one schedule, by dispatch order across
    schedules. `tenant=None` means every tenant; `tenants`, when given, keeps only those
    tenants' (an operator's scope)."""

    tenant: str | None = None
    tenants: frozenset[str] | None = None
    schedule_id: str | None = None
    state: RunState | None = None
    since_ms: int | None = None  # slot instant at or after
    until_ms: int | None = None  # slot instant before
    limit: int = 100


class RunLedger(Protocol):
    """One row per dispatched slot, keyed by (tenant, slot key).

    Contract:
    - `record` is claim-once: a second run with the same tenant and slot key raises DuplicateSlot
      and changes nothing; the same key in another tenant is a different slot.
    - Reads scoped to a tenant never see another tenant's runs; `tenant=None` sees all.
    """

    def record(self, run: NewRun, dispatched_at: int) -> Run:
        """Insert the run in state `dispatched`. Raises DuplicateSlot."""
        ...

    def find_by_slot(self, tenant: str | None, slot_key: str) -> Run | None: ...

    def get(self, run_id: int, tenant: str | None = None) -> Run | None:
        """The run with this id (in `tenant`, when given), or None."""
        ...

    def state_of(self, tenant: str | None, slot_key: str) -> RunState | None: ...

    def last_slots(self, schedule_ids: Sequence[str], tenant: str | None = None) -> dict[str, int]:
        """The newest dispatched slot instant of each schedule that has fired at all."""
        ...

    def query(self, query: RunQuery) -> list[Run]: ...

    def count(self, tenant: str | None = None) -> int: ...
