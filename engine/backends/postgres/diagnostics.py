"""Diagnostics on PostgreSQL: the schema's version and place, a read of each table, and how far
this host's clock is from the server's (the queue's age and the zones are
engine.backends.sql.diagnostics')."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from engine.backends.postgres.connection import (
    SCHEMA_VERSION,
    PgPool,
    rows,
    scalar,
    schema_version,
    storage_errors,
)
from engine.backends.sql.diagnostics import SqlDiagnostics, unreadable_tables
from engine.ports.diagnostics import StorageFacts

# Round trips to sample the server's clock; the one with the least delay is kept (its
# midpoint is the best estimate of the instant the server read its clock).
SKEW_SAMPLES = 5


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class PostgresDiagnostics(SqlDiagnostics[PgPool]):
    """`clock_skew_ms`, when given, says the server's clock minus this host's as something else
    already measured it (a DatabaseClock); without it, or when it has no answer, the skew is
    measured at each call."""

    def __init__(self, pool: PgPool, clock_skew_ms: Callable[[], int | None] | None = None) -> None:
        super().__init__(pool)
        self._clock_skew_ms = clock_skew_ms

    def storage_facts(self) -> StorageFacts:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            schema = scalar(conn, "SELECT current_schema()")
            version = schema_version(conn) if schema is not None else None
            info = conn.info
            return StorageFacts(
                backend="postgres",
                schema_version=0 if version is None else version,
                supported_schema_version=SCHEMA_VERSION,
                journal_mode=None,
                synchronous=None,
                location=f"{info.host}:{info.port}/{info.dbname} schema {schema or '(none)'}",
            )

    def unreadable_tables(self) -> dict[str, str]:
        conn = self._pool.get()
        return unreadable_tables(lambda sql: rows(conn, sql), psycopg.Error, _first_line)

    def clock_skew_ms(self) -> int | None:
        """The server's clock minus this host's, in ms (to within half a round trip)."""
        if self._clock_skew_ms is not None:
            known = self._clock_skew_ms()
            if known is not None:
                return known
        conn = self._pool.get()
        best: tuple[int, int] | None = None  # (round trip ns, offset ms)
        with storage_errors(self._pool.where):
            for _ in range(SKEW_SAMPLES):
                sent = time.time_ns()
                server = scalar(
                    conn, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                )
                received = time.time_ns()
                offset = int(server) - (sent + received) // 2_000_000
                if best is None or received - sent < best[0]:
                    best = (received - sent, offset)
        assert best is not None
        return best[1]
