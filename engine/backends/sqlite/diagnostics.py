"""Diagnostics on SQLite: PRAGMAs, a read of each table, the fire queue's age."""

from __future__ import annotations

import apsw

from engine.backends.sqlite.connection import (
    SCHEMA_VERSION,
    ConnectionPool,
    rows,
    scalar,
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
_SYNCHRONOUS = {0: "off", 1: "normal", 2: "full", 3: "extra"}


class SqliteDiagnostics:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

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
        problems: dict[str, str] = {}
        for table in TABLES:
            try:
                rows(conn, f"SELECT 1 FROM {table} LIMIT 1")
            except apsw.Error as exc:
                problems[table] = f"{type(exc).__name__}: {exc}"
        return problems

    def queue_facts(self, now_ms: int) -> QueueFacts:
        conn = self._pool.get()
        waiting = (
            "FROM fire_queue WHERE completed_at IS NULL AND discarded_at IS NULL "
            "AND available_at <= ? AND (lease_token IS NULL OR consumed_till <= ?)"
        )
        with storage_errors(self._pool.path):
            oldest = scalar(conn, f"SELECT min(available_at) {waiting}", (now_ms, now_ms))
            count = scalar(conn, f"SELECT count(*) {waiting}", (now_ms, now_ms))
            last = scalar(conn, "SELECT max(started_at) FROM runs")
            dead = scalar(conn, "SELECT count(*) FROM fire_queue WHERE discarded_at IS NOT NULL")
        return QueueFacts(
            oldest_waiting_at=None if oldest is None else int(oldest),
            waiting=int(count),
            last_claim_at=None if last is None else int(last),
            dead_letters=int(dead),
        )

    def zones_in_use(self) -> list[str]:
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), "SELECT DISTINCT timezone FROM schedules ORDER BY 1")
        return [str(r[0]) for r in found]

    def clock_skew_ms(self) -> int | None:
        return None  # the file has no clock: this host's is the only one
