"""The schedule store."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from engine.domain.retry import RetryPolicy
from engine.domain.schedule import Schedule, ScheduleStatus


@dataclass(frozen=True, slots=True)
class ScheduleQuery:
    """Which schedules to list. `tenant=None` means every tenant (the daemon's view);
    `tenants`, when given, keeps only those tenants' (an operator's scope)."""

    tenant: str | None = None
    tenants: frozenset[str] | None = None
    status: ScheduleStatus | None = None
    name_prefix: str | None = None
    limit: int = 1000
    offset: int = 0


class ScheduleStore(Protocol):
    """Schedules, partitioned by tenant, with an optimistic version on the definition.

    Contract:
    - Names are unique per tenant; the same name in two tenants is two schedules.
    - `insert` stores version 1; `update` stores `expected_version + 1` only if the stored version
      is `expected_version`, else raises StaleVersion (NotFound if the schedule is gone).
    - A tenant-scoped read never returns another tenant's schedule.
    - Cursor fields (`next_slot_at`, `next_fire_at`) move without a version bump.
    """

    def insert(self, schedule: Schedule) -> Schedule:
        """Store a new schedule. Raises DuplicateName when the tenant has the name."""
        ...

    def get(self, schedule_id: str, tenant: str | None = None) -> Schedule | None:
        """The schedule with this id (in `tenant`, when given), or None."""
        ...

    def find_by_name(self, tenant: str, name: str) -> Schedule | None: ...

    def execution_limits(self, ids: Collection[str]) -> dict[str, tuple[int | None, RetryPolicy]]:
        """{schedule id: (its timeout_ms, its retry policy)} for each of `ids` that exists, in
        one read: what a consumer needs of the schedules of a claim's fires (the whole
        definitions would cost a decode per fire)."""
        ...

    def query(self, query: ScheduleQuery) -> list[Schedule]:
        """Schedules matching `query`, soonest `next_fire_at` first (those with none last)."""
        ...

    def count(self, tenant: str | None = None) -> int: ...

    def update(self, schedule: Schedule, expected_version: int) -> Schedule:
        """Replace the definition, status and cursor; store and return version
        `expected_version + 1` whatever `schedule.version` says. Raises StaleVersion or
        NotFound."""
        ...

    def delete(self, schedule_id: str, tenant: str, expected_version: int | None = None) -> None:
        """Remove the schedule (its runs stay in the ledger). Raises NotFound or StaleVersion."""
        ...
