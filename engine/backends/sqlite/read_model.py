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

from engine.backends.sql.read_model import SqlReadModel
from engine.backends.sqlite.connection import (
    APPLICATION_ID,
    Row,
    connect,
    translate,
)
from engine.backends.sqlite.dialect import DIALECT
from engine.domain.errors import StorageError
from engine.ports.read_model import Viewer

READ_BUSY_TIMEOUT_MS = 2000

# The schedule list's recent-runs subquery, as bench/console.py times it on its own.
_RECENT = DIALECT.recent


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


class SqliteReadModel(SqlReadModel[aiosqlite.Connection]):
    """ReadModel on one SQLite file (narrowed to what `viewer` may see, when given)."""

    dialect = DIALECT

    def __init__(self, path: str | Path, viewer: Viewer | None = None) -> None:
        self.path = Path(path)
        self.viewer = viewer

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[aiosqlite.Connection]:
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
                yield db
            except apsw.Error as exc:
                raise translate(exc, path) from None
        finally:
            await db.close()

    async def _all(
        self, db: aiosqlite.Connection, sql: str, args: tuple[Any, ...] = ()
    ) -> list[Row]:
        return cast("list[Row]", list(await db.execute_fetchall(sql, args)))

    async def close(self) -> None:
        """Nothing stays open between calls."""
