"""Diagnostics on SQLite: PRAGMAs and a read of each table (the queue's age and the zones are
engine.backends.sql.diagnostics')."""

from __future__ import annotations

import apsw

from engine.backends.sql.diagnostics import SqlDiagnostics, unreadable_tables
from engine.backends.sqlite.connection import (
    SCHEMA_VERSION,
    ConnectionPool,
    rows,
    scalar,
    storage_errors,
)
from engine.ports.diagnostics import StorageFacts

_SYNCHRONOUS = {0: "off", 1: "normal", 2: "full", 3: "extra"}


class SqliteDiagnostics(SqlDiagnostics[ConnectionPool]):
    def storage_facts(self) -> StorageFacts:
        conn = self._pool.get()
        with storage_errors(self._pool.path):
            return StorageFacts(
                backend="sqlite",
                schema_version=int(scalar(conn, "PRAGMA user_version")),
                supported_schema_version=SCHEMA_VERSION,
                journal_mode=str(scalar(conn, "PRAGMA journal_mode")).lower(),
                synchronous=_SYNCHRONOUS.get(int(scalar(conn, "PRAGMA synchronous")), "unknown"),
                location=str(self._pool.path.resolve()),
            )

    def unreadable_tables(self) -> dict[str, str]:
        conn = self._pool.get()
        return unreadable_tables(lambda sql: rows(conn, sql), apsw.Error, str)

    def clock_skew_ms(self) -> int | None:
        return None  # the file has no clock: this host's is the only one
