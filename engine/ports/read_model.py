"""The console's read model: what an operator's screen shows, read asynchronously.

The console never writes through this port (changes go through ScheduleService) and never loads
a whole table: every list is a page, and every page costs the same whether the database holds a
thousand schedules or a hundred thousand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from engine.domain.access import EVERY_TENANT, Identity, TenantScope
from engine.domain.approvals import Approval
from engine.domain.audit import AuditEntry
from engine.domain.run import Run, RunState
from engine.domain.schedule import Schedule, ScheduleStatus
from engine.ports.fire_queue import Fire
from engine.ports.policy import Policy

T = TypeVar("T")

PAGE_MAX = 1000
RECENT_OUTCOMES = 12  # runs per schedule behind the Schedules view's sparkline
# A filtered Live fires list looks this far back (in runs) and no further, so a filter that
# matches nothing costs a bounded scan, not the whole ledger.
FIRE_FILTER_WINDOW = 100_000


@dataclass(frozen=True, slots=True)
class RecentRun:
    """One past run of a schedule, as its sparkline shows it."""

    state: RunState
    duration_ms: int | None


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    schedule: Schedule
    recent: tuple[RecentRun, ...]  # oldest first, at most RECENT_OUTCOMES
    last_slot_at: int | None = None  # its newest fired slot (for the dead-man verdict)

    @property
    def last_outcome(self) -> RunState | None:
        return self.recent[-1].state if self.recent else None


@dataclass(frozen=True, slots=True)
class ScheduleListQuery:
    """Schedules due soonest first (active with a next fire, by that instant), then the rest
    (paused, disabled, finished) by tenant and name. `text` matches a substring of the name;
    every given field must match."""

    text: str | None = None
    tenant: str | None = None
    status: ScheduleStatus | None = None
    offset: int = 0
    limit: int = 200


@dataclass(frozen=True, slots=True)
class FireListQuery:
    """Runs newest first (dispatch order). With any filter set, only the newest
    FIRE_FILTER_WINDOW runs are searched."""

    text: str | None = None  # substring of the schedule's name
    tenant: str | None = None
    state: RunState | None = None
    schedule_id: str | None = None
    offset: int = 0
    limit: int = 200

    @property
    def filtered(self) -> bool:
        return any(v is not None for v in (self.text, self.tenant, self.state))


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    rows: tuple[T, ...]
    offset: int
    total: int | None  # rows matching the query, when counting them is cheap; else None
    more: bool  # rows exist past this page


@dataclass(frozen=True, slots=True)
class LeaderView:
    """The dispatch lease as stored, live or not."""

    holder: str
    acquired_at: int
    renewed_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who reads, and the policy that decides what they may see. A read model given a viewer
    narrows every read to the tenants the viewer may view, decided on the grants as stored in
    the same snapshot (so a revocation takes effect at the next read)."""

    operator: str
    policy: Policy


@dataclass(frozen=True, slots=True)
class Overview:
    """What the header and the views' titles show: one consistent reading (counted over the
    tenants the viewer may see: `scope`)."""

    read_at: int  # the reader's clock when read
    leader: LeaderView | None  # None: nobody has ever led, or the last leader let go
    schedules: int
    active: int
    paused: int
    open_fires: int  # waiting or running
    running: int  # under a live claim
    dead_letters: int
    scope: TenantScope = EVERY_TENANT
    # The viewer's grants as read; None when there is no viewer or the database has no
    # operator yet (then every account may do everything).
    identity: Identity | None = None


@dataclass(frozen=True, slots=True)
class ScheduleDetail:
    schedule: Schedule
    runs: tuple[Run, ...]  # newest first


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: Run
    fire: Fire | None  # None once retention has removed the fire-queue row


@dataclass(frozen=True, slots=True)
class ChainStatus:
    chain: str
    head_seq: int
    head_hash: str
    head_at: int | None  # when its newest entry was written
    verified_seq: int | None  # how far the last `verify` got (as recorded), None: never
    verified_at: int | None


@dataclass(frozen=True, slots=True)
class AuditOverview:
    chains: tuple[ChainStatus, ...]
    chain: str | None  # whose entries `recent` holds
    recent: tuple[AuditEntry, ...]  # newest first


class ReadModel(Protocol):
    """Asynchronous, read-only views of one database.

    Contract:
    - Nothing here writes, and nothing here holds a lock a writer waits for beyond one call.
    - Each call reads one consistent snapshot; a call never returns rows of a half-finished
      transaction.
    - A page costs O(limit) rows read (plus index seeks), not O(rows stored); only `text`
      filters may scan, and then within the documented window.
    - With a viewer, no call returns (or counts) a row of a tenant the viewer may not view,
      and the system audit chain only to a viewer of every tenant.
    - Every failure to read (file gone, unreadable, locked past the timeout, not a Vortos
      database) raises StorageError with a message that says what is wrong; the caller may
      simply call again later: a read model recovers by itself when the cause goes away.
    """

    async def overview(self, now_ms: int) -> Overview: ...

    async def schedules(self, query: ScheduleListQuery) -> Page[ScheduleRow]: ...

    async def fires(self, query: FireListQuery) -> Page[Run]: ...

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None: ...

    async def run(self, run_id: int) -> RunDetail | None: ...

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        """Every chain's head and last verification; the newest entries of `chain` (default:
        the chain written last)."""
        ...

    async def approvals(self, *, limit: int = 100) -> list[Approval]:
        """Four-eyes requests, pending first, newest first within."""
        ...

    async def close(self) -> None: ...
