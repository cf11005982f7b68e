"""Atomic dispatch: the one write that turns due slots into runs and fires."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from engine.domain.misfire import SlotPlan
from engine.domain.schedule import Schedule


class DispatchedFire(NamedTuple):
    """One fire a dispatch wrote. A tuple in the column order of a run row, so the hot path
    writes these very objects."""

    run_id: int
    tenant: str
    schedule_id: str
    schedule_name: str
    slot_key: str
    slot_at: int
    due_at: int
    dispatched_at: int
    node_id: str


@dataclass(slots=True)
class DispatchReport:
    """What one dispatch transaction did."""

    scanned: int = 0  # due schedules resolved
    truncated: bool = False  # the fire limit was reached: more is due right now
    dispatched: list[DispatchedFire] = field(default_factory=list)
    already_dispatched: int = 0
    skipped_missed: int = 0
    dropped_aged: int = 0
    plans: dict[str, SlotPlan] = field(default_factory=dict)  # by "tenant/name", when slots
    # were skipped or dropped
    failed: dict[str, str] = field(default_factory=dict)  # schedule id -> why it was held back
    # tenant -> due schedules left for the next transaction because the tenant was over the
    # per-tenant cap while other tenants had schedules due
    capped: dict[str, int] = field(default_factory=dict)


# Decides, without I/O, which slots of a due schedule fire now, given its cursor (the first
# unresolved slot instant).
Resolver = Callable[[Schedule, int], SlotPlan]


class DispatchPort(Protocol):
    """Dispatches due slots under the lease, all or nothing.

    Contract (one transaction per call):
    - First checks that `token` holds the live lease `lease_key`; if not, raises LeaseNotOwned or
      LeaseExpired and writes nothing (fencing: a deposed leader cannot dispatch).
    - Reads active schedules with `next_fire_at <= until_ms` (default `now_ms`), soonest first,
      through an index (cost follows the number due, not the number stored), and dispatches at
      most about `limit` fires: schedules past that stay due, and `truncated` says so.
    - A fire becomes available to consumers at its slot's due instant, so a slot dispatched
      ahead (`until_ms > now_ms`) is not run early. `dispatched_at` is `now_ms`.
    - For each, asks `resolve(schedule, cursor)` for a plan; records a run (unique slot key) and a
      fire for each planned slot, skipping slots whose key the ledger already holds; moves the
      schedule's cursor to the plan's.
    - A schedule whose definition cannot be decoded or resolved is reported in `failed`, its
      cursor untouched and its next look postponed; the others are dispatched.
    - With `tenant_cap`, while more is due than `limit` and some tenant has more than
      `tenant_cap` of the first `limit` due schedules, every tenant with due schedules gets up
      to `tenant_cap` of them dispatched in this call (wherever they sit in the due order),
      and the rest of `limit` goes to the soonest due; those left over are in `capped`. One
      tenant's backlog then never delays another's fires by more than a transaction.
    - With `shard=(index, count)`, only schedules whose shard key (a stable hash of the id,
      see engine.backends.postgres.schedules.shard_key) modulo `count` is `index` are read
      and dispatched: `count` leaders, each holding its shard's lease, share the schedules.
      A backend whose writes are serialised anyway (SQLite) refuses `count > 1` with
      InvalidInput; `count = 1` is the whole set. A shard outside 0..count-1 is InvalidInput.
    - A crash at any point leaves either all of it or none of it.
    """

    def dispatch_due(
        self,
        *,
        lease_key: str,
        token: str,
        node_id: str,
        now_ms: int,
        limit: int,
        resolve: Resolver,
        until_ms: int | None = None,
        tenant_cap: int | None = None,
        shard: tuple[int, int] | None = None,
    ) -> DispatchReport: ...

    def next_due_at(self, shard: tuple[int, int] | None = None) -> int | None:
        """The earliest `next_fire_at` of any active schedule (of `shard`'s, when given; the
        same refusals as `dispatch_due`)."""
        ...


class ChangeFeed(Protocol):
    """Tells a sleeping daemon that another process or thread changed the database."""

    def wait(self, seconds: float, wake: threading.Event | None = None) -> bool:
        """Block up to `seconds` (real time); True as soon as a change by someone else is seen,
        or `notify()` is called, or `wake` (the caller's own event) is set."""
        ...

    def notify(self) -> None:
        """Wake waiters in this process (a change made here)."""
        ...
