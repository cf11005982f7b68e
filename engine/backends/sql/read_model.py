"""The console's read model, once for both SQL backends: the views' queries and what they mean.

Each backend's class supplies only what really differs: how a call gets a connection inside one
read-only snapshot (and turns the driver's errors into StorageError), how rows are fetched, and
the few SQL fragments its dialect spells differently (see Dialect). Everything a view reads, in
which order and under which tenant scope, is decided here, so the two backends cannot drift.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar, Generic, TypeVar

from engine.backends.codec import (
    RUN_COLUMNS,
    SCHEDULE_COLUMNS,
    run_from_row,
    schedule_from_row,
)
from engine.backends.sql import Dialect, Row
from engine.backends.sql.approvals import COLUMNS as APPROVAL_COLUMNS
from engine.backends.sql.approvals import approval_from_row
from engine.backends.sql.audit import COLUMNS as AUDIT_COLUMNS
from engine.backends.sql.audit import entry_from_row as audit_entry_from_row
from engine.backends.sql.fire_rows import FIRE_COLUMNS, FIRE_FROM, fire_from_row
from engine.domain.access import (
    EVERY_TENANT,
    Grant,
    Identity,
    Operation,
    Role,
    TenantScope,
    chain_visible,
    visible_scope,
)
from engine.domain.approvals import Approval
from engine.domain.audit import GENESIS
from engine.domain.run import Run, RunState
from engine.domain.schedule import ScheduleStatus
from engine.ports.lease import LEADER_LEASE
from engine.ports.read_model import (
    FIRE_FILTER_WINDOW,
    PAGE_MAX,
    AuditOverview,
    ChainStatus,
    FireListQuery,
    LeaderView,
    Overview,
    Page,
    RecentRun,
    RunDetail,
    ScheduleDetail,
    ScheduleListQuery,
    ScheduleRow,
    Viewer,
)

Db = TypeVar("Db")

# Due soonest first: the active schedules that have a next fire, in the order of the due index
# (`schedules_due` is partial on exactly this condition, so the page is an index walk).
DUE = "status = 'active' AND next_fire_at IS NOT NULL"
# The newest fired slot, through runs_by_schedule (schedule_id, slot_at): one index seek.
_LAST = "(SELECT max(r.slot_at) FROM runs r WHERE r.schedule_id = schedules.id)"


def _like(text: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching `text` anywhere, its wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _filters(
    p: str, name_column: str, text: str | None, equal: dict[str, Any]
) -> tuple[list[str], list[Any]]:
    """A list's filters: `name_column` containing `text` (when given) and each column of
    `equal` equal to its value (when not None); the conditions and their args, in order."""
    where: list[str] = []
    args: list[Any] = []
    if text:
        where.append(f"{name_column} LIKE {p} ESCAPE '\\'")
        args.append(_like(text))
    for column, value in equal.items():
        if value is not None:
            where.append(f"{column} = {p}")
            args.append(value)
    return where, args


def _recent(text: str | None) -> tuple[RecentRun, ...]:
    """Dialect.recent's words, oldest first (as the console shows them)."""
    if not text:
        return ()
    out = []
    for item in reversed(text.split(" ")):  # read newest first; shown oldest first
        state, _, duration = item.partition(":")
        out.append(RecentRun(RunState(state), int(duration) if duration else None))
    return tuple(out)


class SqlReadModel(ABC, Generic[Db]):
    """ReadModel over a SQL database (narrowed to what `viewer` may see, when given)."""

    dialect: ClassVar[Dialect]
    viewer: Viewer | None

    # -- what each backend supplies -------------------------------------------------------

    @abstractmethod
    def _reading(self) -> AbstractAsyncContextManager[Db]:
        """A connection of this call's own inside one read-only snapshot, released at the end.
        Any failure to read, there or in the block, leaves it as StorageError."""

    @abstractmethod
    async def _all(self, db: Db, sql: str, args: tuple[Any, ...] = ()) -> list[Row]: ...

    # -- reading --------------------------------------------------------------------------

    async def _one(self, db: Db, sql: str, args: tuple[Any, ...] = ()) -> Any:
        found = await self._all(db, sql, args)
        return found[0][0] if found else None

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[tuple[Db, TenantScope]]:
        """A snapshot and what the viewer may see in it (grants are read in the same one)."""
        async with self._reading() as db:
            yield db, await self._scope(db)

    def _scoped(self, column: str, scope: TenantScope) -> tuple[str, tuple[Any, ...]]:
        """An " AND ..." keeping only the scope's tenants ("" for every tenant), and its args."""
        clause, args = self.dialect.tenants(column, scope.tenants)
        return ("" if clause is None else f" AND {clause}"), tuple(args)

    # -- who reads ------------------------------------------------------------------------

    async def _identity(self, db: Db) -> Identity | None:
        """The viewer's grants in this snapshot; None: no viewer, or nobody governs the
        database yet (every account may do everything, see AccessControl)."""
        if self.viewer is None:
            return None
        if not await self._one(db, "SELECT count(*) FROM operator_grants"):
            return None
        viewer = self.viewer
        p = self.dialect.mark
        grants = await self._all(
            db, f"SELECT role, tenant FROM operator_grants WHERE operator = {p}", (viewer.operator,)
        )
        return Identity(
            viewer.operator, tuple(Grant(viewer.operator, Role(r), t) for r, t in grants)
        )

    async def _scope(self, db: Db) -> TenantScope:
        """What the viewer may see, decided on the grants in this snapshot."""
        identity = await self._identity(db)
        if identity is None or self.viewer is None:
            return EVERY_TENANT
        policy = self.viewer.policy
        return visible_scope(identity, lambda t: policy.decide(identity, Operation.VIEW, t).allowed)

    # -- the views ------------------------------------------------------------------------

    async def overview(self, now_ms: int) -> Overview:
        p = self.dialect.mark
        async with self._snapshot() as (db, scope):
            lease = await self._all(
                db,
                f"SELECT holder, acquired_at, renewed_at, expires_at FROM leases WHERE key = {p}",
                (LEADER_LEASE,),
            )
            only, args = self._scoped("tenant", scope)
            total = await self._one(db, f"SELECT count(*) FROM schedules WHERE true{only}", args)
            counts: dict[str, int] = dict(
                await self._all(
                    db,
                    f"SELECT status, count(*) FROM schedules WHERE status <> 'active'{only} "
                    "GROUP BY status",
                    args,
                )
            )
            open_fires = await self._one(
                db,
                "SELECT count(*) FROM fire_queue "
                f"WHERE completed_at IS NULL AND discarded_at IS NULL{only}",
                args,
            )
            running = await self._one(
                db,
                "SELECT count(*) FROM fire_queue WHERE lease_token IS NOT NULL "
                f"AND consumed_till > {p}{only}",
                (now_ms, *args),
            )
            dead = await self._one(
                db, f"SELECT count(*) FROM fire_queue WHERE discarded_at IS NOT NULL{only}", args
            )
            identity = await self._identity(db)
        return Overview(
            read_at=now_ms,
            leader=LeaderView(*lease[0]) if lease else None,
            schedules=total,
            active=total - sum(counts.values()),
            paused=counts.get("paused", 0),
            open_fires=open_fires,
            running=running,
            dead_letters=dead,
            scope=scope,
            identity=identity,
        )

    async def schedules(self, query: ScheduleListQuery) -> Page[ScheduleRow]:
        d = self.dialect
        p = d.mark
        limit = max(1, min(query.limit, PAGE_MAX))
        offset = max(0, query.offset)
        status = None if query.status is None else query.status.value
        where, args = _filters(p, "name", query.text, {"tenant": query.tenant, "status": status})
        columns = f"{SCHEDULE_COLUMNS}, {d.recent}, {_LAST}"
        due_possible = query.status in (None, ScheduleStatus.ACTIVE)
        async with self._snapshot() as (db, scope):
            only, scope_args = self._scoped("tenant", scope)
            extra = "".join(f" AND {w}" for w in where) + only
            args += scope_args
            total = await self._one(
                db, f"SELECT count(*) FROM schedules WHERE true{extra}", tuple(args)
            )
            due = (
                await self._one(
                    db, f"SELECT count(*) FROM schedules WHERE {DUE}{extra}", tuple(args)
                )
                if due_possible
                else 0
            )
            # The due ones first, then the rest, each part in its own order (see Dialect).
            found: list[Row] = []
            if offset < due:
                found += await self._all(
                    db,
                    f"SELECT {columns} FROM schedules WHERE {DUE}{extra} "
                    f"ORDER BY {d.due_order} LIMIT {p} OFFSET {p}",
                    (*args, limit, offset),
                )
            if len(found) < limit and offset + len(found) < total:
                found += await self._all(
                    db,
                    f"SELECT {columns} FROM schedules WHERE NOT ({DUE}){extra} "
                    f"ORDER BY {d.idle_order} LIMIT {p} OFFSET {p}",
                    (*args, limit - len(found), max(0, offset - due)),
                )
        rows = tuple(ScheduleRow(schedule_from_row(r[:-2]), _recent(r[-2]), r[-1]) for r in found)
        return Page(rows, offset, total, offset + len(rows) < total)

    async def fires(self, query: FireListQuery) -> Page[Run]:
        p = self.dialect.mark
        limit = max(1, min(query.limit, PAGE_MAX))
        offset = max(0, query.offset)
        where, args = _filters(
            p,
            "schedule_name",
            query.text,
            {
                "tenant": query.tenant,
                "state": None if query.state is None else query.state.value,
                "schedule_id": query.schedule_id,
            },
        )
        if query.filtered:
            # Within the newest runs only (see FireListQuery), so a filter never reads them all.
            where.insert(0, f"id > (SELECT coalesce(max(id), 0) FROM runs) - {FIRE_FILTER_WINDOW}")
        async with self._snapshot() as (db, scope):
            scoped, scope_args = self.dialect.tenants("tenant", scope.tenants)
            if scoped is not None:
                where.append(scoped)
                args += scope_args
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            # One row more than the page says whether there is a next page, without a count.
            found = await self._all(
                db,
                f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY id DESC LIMIT {p} OFFSET {p}",
                (*args, limit + 1, offset),
            )
        runs = tuple(run_from_row(r) for r in found[:limit])
        return Page(runs, offset, None, len(found) > limit)

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None:
        p = self.dialect.mark
        async with self._snapshot() as (db, scope):
            only, args = self._scoped("tenant", scope)
            found = await self._all(
                db,
                f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = {p}{only}",
                (schedule_id, *args),
            )
            if not found:
                return None
            history = await self._all(
                db,
                f"SELECT {RUN_COLUMNS} FROM runs WHERE schedule_id = {p} "
                f"ORDER BY slot_at DESC, id DESC LIMIT {p}",
                (schedule_id, max(0, min(runs, PAGE_MAX))),
            )
        return ScheduleDetail(schedule_from_row(found[0]), tuple(run_from_row(r) for r in history))

    async def run(self, run_id: int) -> RunDetail | None:
        p = self.dialect.mark
        async with self._snapshot() as (db, scope):
            only, args = self._scoped("tenant", scope)
            found = await self._all(
                db, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = {p}{only}", (run_id, *args)
            )
            if not found:
                return None
            fire = await self._all(
                db, f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE f.run_id = {p}", (run_id,)
            )
        return RunDetail(run_from_row(found[0]), fire_from_row(fire[0]) if fire else None)

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        d = self.dialect
        p = d.mark
        async with self._snapshot() as (db, scope):
            chains = [r[0] for r in await self._all(db, d.chains) if chain_visible(scope, r[0])]
            if chain is not None and chain not in chains:
                chain = None  # not (or no longer) visible: show the newest visible one
            marks = {
                r[0]: (r[1], r[2])
                for r in await self._all(db, "SELECT chain, seq, verified_at FROM audit_verified")
            }
            statuses = []
            for name in chains:
                head = await self._all(
                    db,
                    f"SELECT seq, hash, at FROM audit_entries WHERE chain = {p} "
                    "ORDER BY seq DESC LIMIT 1",
                    (name,),
                )
                seq, digest, at = head[0] if head else (0, GENESIS, None)
                mark = marks.get(name)
                statuses.append(
                    ChainStatus(
                        name,
                        seq,
                        digest,
                        at,
                        None if mark is None else mark[0],
                        None if mark is None else mark[1],
                    )
                )
            if chain is None and statuses:
                chain = max(statuses, key=lambda c: (c.head_at or 0, c.chain)).chain
            recent = (
                await self._all(
                    db,
                    f"SELECT {AUDIT_COLUMNS} FROM audit_entries WHERE chain = {p} "
                    f"ORDER BY seq DESC LIMIT {p}",
                    (chain, max(1, min(limit, PAGE_MAX))),
                )
                if chain is not None
                else []
            )
        return AuditOverview(tuple(statuses), chain, tuple(audit_entry_from_row(r) for r in recent))

    async def approvals(self, *, limit: int = 100) -> list[Approval]:
        p = self.dialect.mark
        async with self._snapshot() as (db, scope):
            only, args = self._scoped("tenant", scope)
            found = await self._all(
                db,
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE true{only} "
                f"ORDER BY state = 'pending' DESC, requested_at DESC, id LIMIT {p}",
                (*args, max(1, min(limit, PAGE_MAX))),
            )
        return [approval_from_row(r) for r in found]

    @abstractmethod
    async def close(self) -> None: ...
