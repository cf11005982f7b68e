"""The embedded SQLite backend (apsw, WAL, BEGIN IMMEDIATE, one connection per thread)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.backends.sql.approvals import SqlApprovalStore
from engine.backends.sql.diagnostics import store_counts
from engine.backends.sql.nodes import SqlNodeRegistry
from engine.backends.sql.operators import SqlOperatorStore
from engine.backends.sql.plugin_state import SqlPluginStateStore
from engine.backends.sqlite.audit import KeySource, SqliteAuditLog
from engine.backends.sqlite.changes import SqliteChangeFeed
from engine.backends.sqlite.connection import (
    BUSY_TIMEOUT_MS,
    SCHEMA_VERSION,
    ConnectionPool,
    prepare,
    scalar,
    storage_errors,
)
from engine.backends.sqlite.diagnostics import SqliteDiagnostics
from engine.backends.sqlite.dispatch import SqliteDispatcher
from engine.backends.sqlite.fire_queue import SqliteFireQueue
from engine.backends.sqlite.lease import SqliteLease
from engine.backends.sqlite.retention import SqliteRetentionStore
from engine.backends.sqlite.runs import SqliteRunLedger
from engine.backends.sqlite.schedules import SqliteScheduleStore
from engine.domain.clock import Clock
from engine.domain.errors import StorageError

log = logging.getLogger("vortos.sqlite")

WAL_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default
CHECKPOINT_EVERY_S = 0.5


class SqliteBackend:
    """Every port, on one database file."""

    def __init__(
        self,
        path: str | Path,
        clock: Clock,
        *,
        create: bool = True,
        readonly: bool = False,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        audit_keys: KeySource | None = None,
    ) -> None:
        self.path = Path(path)
        prepare(self.path, create=create and not readonly, write=not readonly)
        self.pool = ConnectionPool(self.path, readonly=readonly, busy_timeout_ms=busy_timeout_ms)
        self.readonly = readonly
        self.clock = clock  # every store's (the engine takes it when it is given none)
        self.leases = SqliteLease(self.pool, clock)
        self.schedules = SqliteScheduleStore(self.pool)
        self.runs = SqliteRunLedger(self.pool)
        self.fire_queue = SqliteFireQueue(self.pool, clock)
        self.changes = SqliteChangeFeed(self.pool)
        self.audit = SqliteAuditLog(self.pool, clock, audit_keys)
        self.dispatcher = SqliteDispatcher(self.pool, self.audit)
        self.operators = SqlOperatorStore(self.pool)
        self.plugin_state = SqlPluginStateStore(self.pool)
        self.nodes = SqlNodeRegistry(self.pool)
        self.approvals = SqlApprovalStore(self.pool)
        self.retention = SqliteRetentionStore(self.pool)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One write transaction on this thread's connection for everything inside: a change
        and its audit entry land together or not at all."""
        with self.pool.transaction():
            yield

    def describe(self) -> dict[str, Any]:
        """Facts about the database for `vortos db info`."""
        conn = self.pool.get()
        with storage_errors(self.path):

            def one(sql: str) -> Any:
                return scalar(conn, sql)

            return {
                "backend": "sqlite",
                "path": str(self.path.resolve()),
                "schema_version": one("PRAGMA user_version"),
                "supported_schema_version": SCHEMA_VERSION,
                "sqlite_version": one("SELECT sqlite_version()"),
                "journal_mode": one("PRAGMA journal_mode"),
                "size_bytes": one("PRAGMA page_count") * one("PRAGMA page_size"),
                **store_counts(one),
            }

    def diagnostics(self) -> SqliteDiagnostics:
        """What the doctor reads about the database file itself."""
        return SqliteDiagnostics(self.pool)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """While a daemon dispatches from this thread: its commits never checkpoint the WAL
        (a checkpoint inside the dispatch commit doubled its time); a background thread
        checkpoints instead, on the other core, without taking the write lock."""
        conn = self.pool.get()
        with storage_errors(self.path):
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        stop = threading.Event()
        worker = threading.Thread(
            target=self._checkpoint_until, args=(stop,), name="vortos-checkpoint", daemon=True
        )
        worker.start()
        try:
            yield
        finally:
            stop.set()
            worker.join()
            # This thread's connection now: the pool renews one that met an unreadable file
            # (the renewed one already checkpoints as usual).
            if self.pool.get() is conn:
                with storage_errors(self.path):
                    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")

    def _checkpoint_until(self, stop: threading.Event) -> None:
        try:
            while not stop.wait(CHECKPOINT_EVERY_S):
                # Opening this thread's connection can fail too (the file unreadable for a
                # moment): logged like a failed checkpoint, and tried again next time.
                try:
                    with storage_errors(self.path):
                        self.pool.get().execute("PRAGMA wal_checkpoint(PASSIVE)")
                except StorageError as exc:
                    log.warning("background checkpoint failed: %s", exc)
        finally:
            self.pool.release_current()

    def close(self) -> None:
        self.pool.close()
