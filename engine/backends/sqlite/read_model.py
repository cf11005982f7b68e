"""The console's read model on SQLite: aiosqlite's worker thread over a read-only connection.

aiosqlite normally drives the stdlib sqlite3 module. Here it drives an apsw connection instead
(through the small adapter below), because the console usually runs the engine, which writes
through apsw, in the same process: two copies of the SQLite library in one process do not see
each other's POSIX locks, and one closing a file descriptor silently drops the other's locks on
that file. One library per process keeps WAL's locking sound.

Each call opens its own connection, reads in one transaction (one snapshot), and closes it. So
a file that was moved away, replaced, or made unreadable is noticed at the next call, and a
connection is never left holding an old snapshot between refreshes.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import aiosqlite
import apsw

from engine.backends.codec import (
    RUN_COLUMNS,
    SCHEDULE_COLUMNS,
    run_from_row,
    schedule_from_row,
)
from engine.backends.fire_rows import FIRE_COLUMNS, FIRE_FROM, fire_from_row
from engine.backends.sqlite.approvals import COLUMNS as APPROVAL_COLUMNS
from engine.backends.sqlite.approvals import approval_from_row
from engine.backends.sqlite.audit import CHAINS as AUDIT_CHAINS
from engine.backends.sqlite.audit import COLUMNS as AUDIT_COLUMNS
from engine.backends.sqlite.audit import entry_from_row as audit_entry_from_row
from engine.backends.sqlite.connection import (
    APPLICATION_ID,
    Row,
    connect,
    tenants_clause,
    translate,
)
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
from engine.domain.errors import StorageError
from engine.domain.run import Run, RunState
from engine.domain.schedule import ScheduleStatus
from engine.ports.lease import LEADER_LEASE
from engine.ports.read_model import (
    FIRE_FILTER_WINDOW,
    PAGE_MAX,
    RECENT_OUTCOMES,
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

READ_BUSY_TIMEOUT_MS = 2000

# Due soonest first: the active schedules that have a next fire, in the order of the due index
# (`schedules_due` is partial on exactly this condition, so the page is an index walk).
_DUE = "status = 'active' AND next_fire_at IS NOT NULL"
_RECENT = (
    "(SELECT group_concat(x, ' ') FROM (SELECT r.state || ':' || "
    "coalesce(r.finished_at - r.started_at, '') AS x FROM runs r "
    f"WHERE r.schedule_id = schedules.id ORDER BY r.slot_at DESC LIMIT {RECENT_OUTCOMES}))"
)


# The newest fired slot, through runs_by_schedule (schedule_id, slot_at): one index seek.
_LAST = "(SELECT max(r.slot_at) FROM runs r WHERE r.schedule_id = schedules.id)"


class _Cursor:
    """The part of sqlite3.Cursor that aiosqlite calls, over an apsw cursor."""

    def __init__(self, cursor: apsw.Cursor) -> None:
        self._cursor = cursor
        self._rows: Iterator[Row] = iter(cursor)

    def fetchall(self) -> list[Row]:
        return list(self._rows)

    def fetchone(self) -> Row | None:
        return next(self._rows, None)

    def fetchmany(self, size: int = 64) -> list[Row]:
        return list(itertools.islice(self._rows, size))

    def close(self) -> None:
        self._cursor.close()


class _ReadConnection:
    """The part of sqlite3.Connection that aiosqlite calls, over a read-only apsw connection.

    A failure to open is raised by the first statement, not by the constructor: aiosqlite does
    not wait for its worker thread when the connector itself raises, and that thread would
    then outlive the call (and, under asyncio.run, the event loop it reports to).
    """

    def __init__(self, path: Path) -> None:
        self._conn: apsw.Connection | None = None
        self._failure: StorageError | None = None
        try:
            self._conn = connect(path, readonly=True, busy_timeout_ms=READ_BUSY_TIMEOUT_MS)
        except StorageError as exc:
            self._failure = exc

    def execute(self, sql: str, parameters: tuple[Any, ...] = ()) -> _Cursor:
        if self._conn is None:
            assert self._failure is not None
            raise self._failure
        return _Cursor(self._conn.execute(sql, parameters))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _recent(text: str | None) -> tuple[RecentRun, ...]:
    if not text:
        return ()
    out = []
    for item in reversed(text.split(" ")):  # stored newest first; shown oldest first
        state, _, duration = item.partition(":")
        out.append(RecentRun(RunState(state), int(duration) if duration else None))
    return tuple(out)


def _scoped(column: str, scope: TenantScope) -> tuple[str, tuple[str, ...]]:
    """An " AND ..." keeping only the scope's tenants ("" for every tenant), and its args."""
    clause, args = tenants_clause(column, scope.tenants)
    return ("" if clause is None else f" AND {clause}"), tuple(args)


class SqliteReadModel:
    """ReadModel on one SQLite file (narrowed to what `viewer` may see, when given)."""

    def __init__(self, path: str | Path, viewer: Viewer | None = None) -> None:
        self.path = Path(path)
        self.viewer = viewer

    async def _identity(self, db: aiosqlite.Connection) -> Identity | None:
        """The viewer's grants in this snapshot; None: no viewer, or nobody governs the
        database yet (every account may do everything, see AccessControl)."""
        if self.viewer is None:
            return None
        if not await self._one(db, "SELECT count(*) FROM operator_grants"):
            return None
        viewer = self.viewer
        grants = await self._all(
            db, "SELECT role, tenant FROM operator_grants WHERE operator = ?", (viewer.operator,)
        )
        return Identity(
            viewer.operator, tuple(Grant(viewer.operator, Role(r), t) for r, t in grants)
        )

    async def _scope(self, db: aiosqlite.Connection) -> TenantScope:
        """What the viewer may see, decided on the grants in this snapshot."""
        identity = await self._identity(db)
        if identity is None or self.viewer is None:
            return EVERY_TENANT
        policy = self.viewer.policy
        return visible_scope(identity, lambda t: policy.decide(identity, Operation.VIEW, t).allowed)

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[tuple[aiosqlite.Connection, TenantScope]]:
        path = self.path
        if not path.exists():
            raise StorageError(f"no database at {path}: it was moved or deleted")
        db = aiosqlite.Connection(lambda: cast("Any", _ReadConnection(path)), iter_chunk_size=256)
        try:
            try:
                await db
                await db.execute_fetchall("BEGIN")
                found = await self._all(db, "PRAGMA application_id")
            except StorageError:
                raise
            except apsw.Error as exc:
                raise translate(exc, path) from None
            if not found or found[0][0] != APPLICATION_ID:
                raise StorageError(
                    f"database {path} is not a Vortos database (or not initialised): point "
                    "--db at a Vortos database, or create one with `vortos db init`"
                )
            try:
                yield db, await self._scope(db)
            except apsw.Error as exc:
                raise translate(exc, path) from None
        finally:
            await db.close()

    async def _all(
        self, db: aiosqlite.Connection, sql: str, args: tuple[Any, ...] = ()
    ) -> list[Row]:
        return cast("list[Row]", list(await db.execute_fetchall(sql, args)))

    async def _one(self, db: aiosqlite.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
        found = await self._all(db, sql, args)
        return found[0][0] if found else None

    async def overview(self, now_ms: int) -> Overview:
        async with self._snapshot() as (db, scope):
            lease = await self._all(
                db,
                "SELECT holder, acquired_at, renewed_at, expires_at FROM leases WHERE key = ?",
                (LEADER_LEASE,),
            )
            only, args = _scoped("tenant", scope)
            total = await self._one(db, f"SELECT count(*) FROM schedules WHERE 1{only}", args)
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
                f"AND consumed_till > ?{only}",
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
        limit = max(1, min(query.limit, PAGE_MAX))
        offset = max(0, query.offset)
        where, args = [], []
        if query.text:
            where.append("name LIKE ? ESCAPE '\\'")
            args.append(_like(query.text))
        if query.tenant is not None:
            where.append("tenant = ?")
            args.append(query.tenant)
        if query.status is not None:
            where.append("status = ?")
            args.append(query.status.value)
        columns = f"{SCHEDULE_COLUMNS}, {_RECENT}, {_LAST}"
        due_possible = query.status in (None, ScheduleStatus.ACTIVE)
        async with self._snapshot() as (db, scope):
            only, scope_args = _scoped("tenant", scope)
            extra = "".join(f" AND {w}" for w in where) + only
            args += scope_args
            total = await self._one(
                db, f"SELECT count(*) FROM schedules WHERE 1{extra}", tuple(args)
            )
            due = (
                await self._one(
                    db, f"SELECT count(*) FROM schedules WHERE {_DUE}{extra}", tuple(args)
                )
                if due_possible
                else 0
            )
            found: list[Row] = []
            if offset < due:
                found += await self._all(
                    db,
                    f"SELECT {columns} FROM schedules WHERE {_DUE}{extra} "
                    "ORDER BY next_fire_at LIMIT ? OFFSET ?",
                    (*args, limit, offset),
                )
            if len(found) < limit and offset + len(found) < total:
                found += await self._all(
                    db,
                    f"SELECT {columns} FROM schedules WHERE NOT ({_DUE}){extra} "
                    "ORDER BY tenant, name LIMIT ? OFFSET ?",
                    (*args, limit - len(found), max(0, offset - due)),
                )
        rows = tuple(ScheduleRow(schedule_from_row(r[:-2]), _recent(r[-2]), r[-1]) for r in found)
        return Page(rows, offset, total, offset + len(rows) < total)

    async def fires(self, query: FireListQuery) -> Page[Run]:
        limit = max(1, min(query.limit, PAGE_MAX))
        offset = max(0, query.offset)
        where, args = [], []
        if query.filtered:
            where.append(f"id > (SELECT coalesce(max(id), 0) FROM runs) - {FIRE_FILTER_WINDOW}")
        if query.text:
            where.append("schedule_name LIKE ? ESCAPE '\\'")
            args.append(_like(query.text))
        if query.tenant is not None:
            where.append("tenant = ?")
            args.append(query.tenant)
        if query.state is not None:
            where.append("state = ?")
            args.append(query.state.value)
        if query.schedule_id is not None:
            where.append("schedule_id = ?")
            args.append(query.schedule_id)
        async with self._snapshot() as (db, scope):
            scoped, scope_args = tenants_clause("tenant", scope.tenants)
            if scoped is not None:
                where.append(scoped)
                args += scope_args
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            found = await self._all(
                db,
                f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY id DESC LIMIT ? OFFSET ?",
                (*args, limit + 1, offset),
            )
        runs = tuple(run_from_row(r) for r in found[:limit])
        return Page(runs, offset, None, len(found) > limit)

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None:
        async with self._snapshot() as (db, scope):
            only, args = _scoped("tenant", scope)
            found = await self._all(
                db,
                f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?{only}",
                (schedule_id, *args),
            )
            if not found:
                return None
            history = await self._all(
                db,
                f"SELECT {RUN_COLUMNS} FROM runs WHERE schedule_id = ? "
                "ORDER BY slot_at DESC, id DESC LIMIT ?",
                (schedule_id, max(0, min(runs, PAGE_MAX))),
            )
        return ScheduleDetail(schedule_from_row(found[0]), tuple(run_from_row(r) for r in history))

    async def run(self, run_id: int) -> RunDetail | None:
        async with self._snapshot() as (db, scope):
            only, args = _scoped("tenant", scope)
            found = await self._all(
                db, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?{only}", (run_id, *args)
            )
            if not found:
                return None
            fire = await self._all(
                db, f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE f.run_id = ?", (run_id,)
            )
        return RunDetail(run_from_row(found[0]), fire_from_row(fire[0]) if fire else None)

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        async with self._snapshot() as (db, scope):
            chains = [r[0] for r in await self._all(db, AUDIT_CHAINS) if chain_visible(scope, r[0])]
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
                    "SELECT seq, hash, at FROM audit_entries WHERE chain = ? "
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
                    f"SELECT {AUDIT_COLUMNS} FROM audit_entries WHERE chain = ? "
                    "ORDER BY seq DESC LIMIT ?",
                    (chain, max(1, min(limit, PAGE_MAX))),
                )
                if chain is not None
                else []
            )
        return AuditOverview(tuple(statuses), chain, tuple(audit_entry_from_row(r) for r in recent))

    async def approvals(self, *, limit: int = 100) -> list[Approval]:
        async with self._snapshot() as (db, scope):
            only, args = _scoped("tenant", scope)
            found = await self._all(
                db,
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE 1{only} "
                "ORDER BY state = 'pending' DESC, requested_at DESC, id LIMIT ?",
                (*args, max(1, min(limit, PAGE_MAX))),
            )
        return [approval_from_row(r) for r in found]

    async def close(self) -> None:
        """Nothing stays open between calls."""
