"""Diagnostics on PostgreSQL: the schema's version and place, a read of each table, the fire
queue's age, and how far this host's clock is from the server's."""

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
from engine.ports.diagnostics import QueueFacts, StorageFacts

TABLES = (
    "schedules",
    "runs",
    "fire_queue",
    "leases",
    "audit_entries",
    "audit_checkpoints",
    "audit_verified",
    "operator_grants",
    "approvals",
)
# Round trips to sample the server's clock; the one with the least delay is kept (its
# midpoint is the best estimate of the instant the server read its clock).
SKEW_SAMPLES = 5

_WAITING = (
    "FROM fire_queue WHERE completed_at IS NULL AND discarded_at IS NULL "
    "AND available_at <= %(now)s AND (lease_token IS NULL OR consumed_till <= %(now)s)"
)
# One statement, so one snapshot: the four facts agree with each other.
_QUEUE_FACTS = (
    f"SELECT (SELECT min(available_at) {_WAITING}), (SELECT count(*) {_WAITING}), "
    "(SELECT max(started_at) FROM runs), "
    "(SELECT count(*) FROM fire_queue WHERE discarded_at IS NOT NULL)"
)


class PostgresDiagnostics:
    """`clock_skew_ms`, when given, says the server's clock minus this host's as something else
    already measured it (a DatabaseClock); without it, or when it has no answer, the skew is
    measured at each call."""

    def __init__(self, pool: PgPool, clock_skew_ms: Callable[[], int | None] | None = None) -> None:
        self._pool = pool
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
        problems: dict[str, str] = {}
        for table in TABLES:
            try:
                rows(conn, f"SELECT 1 FROM {table} LIMIT 1")
            except psycopg.Error as exc:
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                problems[table] = f"{type(exc).__name__}: {text}"
        return problems

    def queue_facts(self, now_ms: int) -> QueueFacts:
        with storage_errors(self._pool.where):
            found = self._pool.get().execute(_QUEUE_FACTS, {"now": now_ms}).fetchone()
        assert found is not None
        oldest, count, last, dead = found
        return QueueFacts(
            oldest_waiting_at=None if oldest is None else int(oldest),
            waiting=int(count),
            last_claim_at=None if last is None else int(last),
            dead_letters=int(dead),
        )

    def zones_in_use(self) -> list[str]:
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), "SELECT DISTINCT timezone FROM schedules ORDER BY 1")
        return [str(r[0]) for r in found]

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
