"""The console's read model on PostgreSQL: psycopg's AsyncConnection, one snapshot per call.

Each call reads inside its own REPEATABLE READ READ ONLY transaction (one snapshot), on a
connection it holds alone for the call. Connections are kept for the next call (a few, idle,
outside any transaction) rather than opened per call as on SQLite: a new PostgreSQL session
costs a TCP (often TLS) handshake, authentication and a server process, several milliseconds
even on the same host, and the console reads several times a second.

Not a psycopg_pool AsyncConnectionPool: its background tasks and locks belong to the event loop
that opened it, while a read model outlives loops (each test, or each CLI command, runs its own
`asyncio.run`), and a pool's tasks would die with their loop. An AsyncConnection itself is not
tied to a loop when one caller uses it at a time, which the idle list below guarantees.

A connection that broke while idle (the server restarted, an administrator ran
pg_terminate_backend, a firewall dropped it) fails at the BEGIN of the next call; that call
then opens a fresh connection and reads on it, so a dead session never shows as an error.
Any other failure raises StorageError, and the connection involved is closed, never reused:
the next call starts afresh and succeeds once the cause is gone.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from engine.backends.codec import (
    RUN_COLUMNS,
    SCHEDULE_COLUMNS,
    run_from_row,
    schedule_from_row,
)
from engine.backends.fire_rows import FIRE_COLUMNS, FIRE_FROM, fire_from_row
from engine.backends.postgres.connection import (
    CONNECT_TIMEOUT_S,
    Row,
    redact,
    require_driver,
    tenants_clause,
    translate,
    validate_url,
)
from engine.backends.sqlite.approvals import COLUMNS as APPROVAL_COLUMNS
from engine.backends.sqlite.approvals import approval_from_row
from engine.backends.sqlite.audit import COLUMNS as AUDIT_COLUMNS
from engine.backends.sqlite.audit import entry_from_row as audit_entry_from_row
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
from engine.domain.errors import VortosError
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

try:  # the `postgres` extra (PostgresReadModel says so when it is missing)
    import psycopg
except ImportError:  # pragma: no cover - exercised on machines without the extra
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    Conn = psycopg.AsyncConnection[Row]

# Idle connections kept between calls (more callers at once each open their own).
IDLE_MAX = 2
# A read never waits long: a lock (only DDL, such as a migration, takes one that blocks reads)
# as long as SQLite's read busy timeout, a statement no longer than a refresh is worth.
LOCK_TIMEOUT_MS = 2_000
STATEMENT_TIMEOUT_MS = 15_000

_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

# Due soonest first: the active schedules that have a next fire, in the order of the due index
# (`schedules_due` is partial on exactly this condition, so the page is an index walk). Ties
# are broken by id, so pages read in separate snapshots agree on the order.
_DUE = "status = 'active' AND next_fire_at IS NOT NULL"
# The rest by tenant and name in byte order, as SQLite sorts them (whatever the database's
# collation), through the index `schedules_idle_by_name`, which is partial on NOT (_DUE).
_BY_NAME = 'tenant COLLATE "C", name COLLATE "C"'
_RECENT = (
    "(SELECT string_agg(x, ' ' ORDER BY slot_at DESC, id DESC) FROM ("
    "SELECT r.state || ':' || coalesce((r.finished_at - r.started_at)::text, '') AS x, "
    "r.slot_at, r.id FROM runs r WHERE r.schedule_id = schedules.id "
    f"ORDER BY r.slot_at DESC, r.id DESC LIMIT {RECENT_OUTCOMES}) AS recent)"
)
# The newest fired slot, through runs_by_schedule (schedule_id, slot_at): one index seek.
_LAST = "(SELECT max(r.slot_at) FROM runs r WHERE r.schedule_id = schedules.id)"
# The distinct chains by hopping along the primary key (one seek per chain), not by reading
# every entry: a chain holds an entry per fire.
_CHAINS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(e.chain) FROM audit_entries e WHERE e.chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) SELECT chain FROM (SELECT chain FROM c WHERE chain IS NOT NULL "
    'UNION SELECT chain FROM audit_verified) AS chains ORDER BY chain COLLATE "C"'
)


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _recent(text: str | None) -> tuple[RecentRun, ...]:
    if not text:
        return ()
    out = []
    for item in reversed(text.split(" ")):  # read newest first; shown oldest first
        state, _, duration = item.partition(":")
        out.append(RecentRun(RunState(state), int(duration) if duration else None))
    return tuple(out)


def _scoped(column: str, scope: TenantScope) -> tuple[str, tuple[Any, ...]]:
    """An " AND ..." keeping only the scope's tenants ("" for every tenant), and its args."""
    clause, args = tenants_clause(column, scope.tenants)
    return ("" if clause is None else f" AND {clause}"), tuple(args)


def _connect_options(url: str) -> dict[str, Any]:
    """What the console's sessions need, where the URL does not say otherwise."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    defaults: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "application_name": "vortos-console",
        # A peer that vanished (a dropped route) is noticed within a minute, not two hours.
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    return {k: v for k, v in defaults.items() if k not in given}


class PostgresReadModel:
    """ReadModel on one PostgreSQL schema (narrowed to what `viewer` may see, when given)."""

    def __init__(self, url: str, viewer: Viewer | None = None) -> None:
        require_driver()
        validate_url(url)
        self.url = url
        self.where = redact(url)
        self.viewer = viewer
        self._options = _connect_options(url)
        self._idle: list[Conn] = []
        self._lock = threading.Lock()  # callers may come from several threads' loops

    # -- connections ------------------------------------------------------------------------

    async def _open(self) -> Conn:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, **self._options)
        try:
            await conn.execute(
                f"SET lock_timeout = {LOCK_TIMEOUT_MS}; "
                f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}"
            )
        except BaseException:
            await conn.close()
            raise
        return conn

    def _take_idle(self) -> Conn | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    async def _give_back(self, conn: Conn) -> None:
        """Keep a clean connection for the next call; close anything else."""
        clean = not conn.closed and (
            conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        if clean:
            with self._lock:
                if len(self._idle) < IDLE_MAX:
                    self._idle.append(conn)
                    return
        await conn.close()

    async def _begin(self) -> Conn:
        """A connection of this call's own, inside a new read-only snapshot."""
        conn = self._take_idle()
        if conn is not None:
            try:
                await self._start(conn)
            except psycopg.Error:
                died_while_idle = conn.broken or conn.closed
                await conn.close()
                if not died_while_idle:
                    raise
                # The fresh connection below is this call's.
            except BaseException:
                await conn.close()
                raise
            else:
                return conn
        conn = await self._open()
        try:
            await self._start(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _start(self, conn: Conn) -> None:
        await conn.execute(_BEGIN)
        # The snapshot is taken here, and a schema that is not Vortos's is refused by name.
        await conn.execute("SELECT value FROM vortos_meta WHERE key = 'schema_version'")

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[tuple[Conn, TenantScope]]:
        try:
            conn = await self._begin()
        except VortosError:
            raise
        except psycopg.Error as exc:
            raise translate(exc, self.where) from None
        try:
            try:
                yield conn, await self._scope(conn)
                await conn.execute("COMMIT")
            except VortosError:
                raise
            except psycopg.Error as exc:
                raise translate(exc, self.where) from None
        except BaseException:
            # Failed, or cancelled mid-read: this connection is never reused.
            await conn.close()
            raise
        await self._give_back(conn)

    async def _all(self, db: Conn, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        cursor = await db.execute(sql, args)
        return await cursor.fetchall()

    async def _one(self, db: Conn, sql: str, args: tuple[Any, ...] = ()) -> Any:
        found = await self._all(db, sql, args)
        return found[0][0] if found else None

    # -- who reads --------------------------------------------------------------------------

    async def _identity(self, db: Conn) -> Identity | None:
        """The viewer's grants in this snapshot; None: no viewer, or nobody governs the
        database yet (every account may do everything, see AccessControl)."""
        if self.viewer is None:
            return None
        if not await self._one(db, "SELECT count(*) FROM operator_grants"):
            return None
        viewer = self.viewer
        grants = await self._all(
            db, "SELECT role, tenant FROM operator_grants WHERE operator = %s", (viewer.operator,)
        )
        return Identity(
            viewer.operator, tuple(Grant(viewer.operator, Role(r), t) for r, t in grants)
        )

    async def _scope(self, db: Conn) -> TenantScope:
        """What the viewer may see, decided on the grants in this snapshot."""
        identity = await self._identity(db)
        if identity is None or self.viewer is None:
            return EVERY_TENANT
        policy = self.viewer.policy
        return visible_scope(identity, lambda t: policy.decide(identity, Operation.VIEW, t).allowed)

    # -- the views --------------------------------------------------------------------------

    async def overview(self, now_ms: int) -> Overview:
        async with self._snapshot() as (db, scope):
            lease = await self._all(
                db,
                "SELECT holder, acquired_at, renewed_at, expires_at FROM leases WHERE key = %s",
                (LEADER_LEASE,),
            )
            only, args = _scoped("tenant", scope)
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
                f"AND consumed_till > %s{only}",
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
        where: list[str] = []
        args: list[Any] = []
        if query.text:
            where.append("name LIKE %s ESCAPE '\\'")
            args.append(_like(query.text))
        if query.tenant is not None:
            where.append("tenant = %s")
            args.append(query.tenant)
        if query.status is not None:
            where.append("status = %s")
            args.append(query.status.value)
        columns = f"{SCHEDULE_COLUMNS}, {_RECENT}, {_LAST}"
        due_possible = query.status in (None, ScheduleStatus.ACTIVE)
        async with self._snapshot() as (db, scope):
            only, scope_args = _scoped("tenant", scope)
            extra = "".join(f" AND {w}" for w in where) + only
            args += scope_args
            total = await self._one(
                db, f"SELECT count(*) FROM schedules WHERE true{extra}", tuple(args)
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
                    "ORDER BY next_fire_at, id LIMIT %s OFFSET %s",
                    (*args, limit, offset),
                )
            if len(found) < limit and offset + len(found) < total:
                found += await self._all(
                    db,
                    f"SELECT {columns} FROM schedules WHERE NOT ({_DUE}){extra} "
                    f"ORDER BY {_BY_NAME} LIMIT %s OFFSET %s",
                    (*args, limit - len(found), max(0, offset - due)),
                )
        rows = tuple(ScheduleRow(schedule_from_row(r[:-2]), _recent(r[-2]), r[-1]) for r in found)
        return Page(rows, offset, total, offset + len(rows) < total)

    async def fires(self, query: FireListQuery) -> Page[Run]:
        limit = max(1, min(query.limit, PAGE_MAX))
        offset = max(0, query.offset)
        where: list[str] = []
        args: list[Any] = []
        if query.filtered:
            where.append(f"id > (SELECT coalesce(max(id), 0) FROM runs) - {FIRE_FILTER_WINDOW}")
        if query.text:
            where.append("schedule_name LIKE %s ESCAPE '\\'")
            args.append(_like(query.text))
        if query.tenant is not None:
            where.append("tenant = %s")
            args.append(query.tenant)
        if query.state is not None:
            where.append("state = %s")
            args.append(query.state.value)
        if query.schedule_id is not None:
            where.append("schedule_id = %s")
            args.append(query.schedule_id)
        async with self._snapshot() as (db, scope):
            scoped, scope_args = tenants_clause("tenant", scope.tenants)
            if scoped is not None:
                where.append(scoped)
                args += scope_args
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            found = await self._all(
                db,
                f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY id DESC LIMIT %s OFFSET %s",
                (*args, limit + 1, offset),
            )
        runs = tuple(run_from_row(r) for r in found[:limit])
        return Page(runs, offset, None, len(found) > limit)

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None:
        async with self._snapshot() as (db, scope):
            only, args = _scoped("tenant", scope)
            found = await self._all(
                db,
                f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = %s{only}",
                (schedule_id, *args),
            )
            if not found:
                return None
            history = await self._all(
                db,
                f"SELECT {RUN_COLUMNS} FROM runs WHERE schedule_id = %s "
                "ORDER BY slot_at DESC, id DESC LIMIT %s",
                (schedule_id, max(0, min(runs, PAGE_MAX))),
            )
        return ScheduleDetail(schedule_from_row(found[0]), tuple(run_from_row(r) for r in history))

    async def run(self, run_id: int) -> RunDetail | None:
        async with self._snapshot() as (db, scope):
            only, args = _scoped("tenant", scope)
            found = await self._all(
                db, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = %s{only}", (run_id, *args)
            )
            if not found:
                return None
            fire = await self._all(
                db, f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE f.run_id = %s", (run_id,)
            )
        return RunDetail(run_from_row(found[0]), fire_from_row(fire[0]) if fire else None)

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        async with self._snapshot() as (db, scope):
            chains = [r[0] for r in await self._all(db, _CHAINS) if chain_visible(scope, r[0])]
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
                    "SELECT seq, hash, at FROM audit_entries WHERE chain = %s "
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
                    f"SELECT {AUDIT_COLUMNS} FROM audit_entries WHERE chain = %s "
                    "ORDER BY seq DESC LIMIT %s",
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
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE true{only} "
                "ORDER BY state = 'pending' DESC, requested_at DESC, id LIMIT %s",
                (*args, max(1, min(limit, PAGE_MAX))),
            )
        return [approval_from_row(r) for r in found]

    async def close(self) -> None:
        """Close the idle connections (a later call opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
