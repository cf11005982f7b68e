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

from engine.backends.postgres.connection import (
    CONNECT_TIMEOUT_S,
    Row,
    redact,
    require_driver,
    translate,
    validate_url,
)
from engine.backends.postgres.dialect import DIALECT
from engine.backends.sql.read_model import SqlReadModel
from engine.domain.errors import VortosError
from engine.ports.read_model import Viewer

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


class PostgresReadModel(SqlReadModel["Conn"]):
    """ReadModel on one PostgreSQL schema (narrowed to what `viewer` may see, when given)."""

    dialect = DIALECT

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
    async def _reading(self) -> AsyncIterator[Conn]:
        try:
            conn = await self._begin()
        except VortosError:
            raise
        except psycopg.Error as exc:
            raise translate(exc, self.where) from None
        try:
            try:
                yield conn
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

    async def close(self) -> None:
        """Close the idle connections (a later call opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
