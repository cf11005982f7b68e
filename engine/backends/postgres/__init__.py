"""The PostgreSQL backend (psycopg 3, psycopg-pool): every port, on one schema of one database,
shared by any number of hosts.

Where SQLite serialises every write, here each store takes exactly the locks its guarantee
needs: dispatch locks the lease row it fences on and the due schedules it advances; claims skip
rows another consumer holds (FOR UPDATE SKIP LOCKED); appends to one audit chain queue on a
transaction-scoped advisory lock of that chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from engine.backends.postgres.audit import PostgresAuditLog
from engine.backends.postgres.changes import PostgresChangeFeed
from engine.backends.postgres.clock import DatabaseClock
from engine.backends.postgres.connection import (
    SCHEMA_VERSION,
    PgPool,
    advisory_key,
    check_schema,
    migrate,
    redact,
    scalar,
    schema_version,
    storage_errors,
)
from engine.backends.postgres.diagnostics import PostgresDiagnostics
from engine.backends.postgres.dispatch import PostgresDispatcher
from engine.backends.postgres.fire_queue import PostgresFireQueue
from engine.backends.postgres.lease import PostgresLease
from engine.backends.postgres.retention import PostgresRetentionStore
from engine.backends.postgres.runs import PostgresRunLedger
from engine.backends.postgres.schedules import PostgresScheduleStore
from engine.backends.sql.approvals import SqlApprovalStore
from engine.backends.sql.audit import KeySource
from engine.backends.sql.diagnostics import store_counts
from engine.backends.sql.nodes import SqlNodeRegistry
from engine.backends.sql.operators import SqlOperatorStore
from engine.backends.sql.plugin_state import SqlPluginStateStore
from engine.domain.clock import Clock

__all__ = ["PostgresBackend", "migrate_database", "redact"]


class PostgresBackend:
    """Every port, on the PostgreSQL database at `url` (its search_path's first schema).

    `clock` None: instants are the database server's (DatabaseClock), so every node judges
    leases and claims on one clock. The schema must exist at this Vortos's version (`vortos
    db migrate` creates or upgrades it); anything else is a StorageError naming the fix,
    raised here, before any store is used.
    """

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        readonly: bool = False,
        audit_keys: KeySource | None = None,
    ) -> None:
        self.url = url
        self.where = redact(url)
        self.pool = PgPool(url, readonly=readonly)
        self.readonly = readonly
        try:
            with storage_errors(self.where):
                check_schema(self.pool.get(), self.where)
        except BaseException:
            self.pool.close()
            raise
        if clock is None:
            try:
                clock = DatabaseClock(self.pool)
            except BaseException:
                self.pool.close()
                raise
        self.clock: Clock = clock
        schema = scalar(self.pool.get(), "SELECT current_schema()")
        self._service_lock = advisory_key(f"service:{schema}")
        self.leases = PostgresLease(self.pool, clock)
        self.schedules = PostgresScheduleStore(self.pool)
        self.runs = PostgresRunLedger(self.pool)
        self.fire_queue = PostgresFireQueue(self.pool, clock)
        self.changes = PostgresChangeFeed(self.pool)
        self.audit = PostgresAuditLog(self.pool, clock, audit_keys)
        self.dispatcher = PostgresDispatcher(self.pool, self.audit)
        self.operators = SqlOperatorStore(self.pool)
        self.plugin_state = SqlPluginStateStore(self.pool)
        self.nodes = SqlNodeRegistry(self.pool)
        self.approvals = SqlApprovalStore(self.pool)
        self.retention = PostgresRetentionStore(self.pool)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction on this thread's connection for everything inside.

        The outermost one first takes this schema's service lock (transaction-scoped), so the
        service's units of work (a change and its audit entry, a static sync, a four-eyes
        request, a retention batch) run one at a time, as on SQLite: each reads, then writes on
        what it read (two nodes starting at once must not both create the same static
        schedule). The hot paths (dispatch, claims, settles) take no such lock."""
        outermost = self.pool.get().info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with self.pool.transaction() as conn:
            if outermost:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._service_lock,))
            yield

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Nothing to tune: the server checkpoints on its own."""
        yield

    def describe(self) -> dict[str, Any]:
        """Facts about the database for `vortos db info`."""
        conn = self.pool.get()
        with storage_errors(self.where):

            def one(sql: str) -> Any:
                return scalar(conn, sql)

            return {
                "backend": "postgres",
                "url": self.where,
                "schema": one("SELECT current_schema()"),
                "schema_version": schema_version(conn),
                "supported_schema_version": SCHEMA_VERSION,
                "server_version": one("SHOW server_version"),
                "size_bytes": one(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint "
                    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
                ),
                **store_counts(one),
            }

    def diagnostics(self) -> PostgresDiagnostics:
        """What the doctor reads about the database itself (the clock skew measured anew at
        each ask, not the clock's last sample)."""
        return PostgresDiagnostics(self.pool)

    def close(self) -> None:
        self.changes.close()  # its listener has a connection of its own
        self.pool.close()


def migrate_database(url: str) -> tuple[int | None, int]:
    """Create or upgrade the Vortos schema at `url` (see connection.migrate)."""
    pool = PgPool(url)
    try:
        with storage_errors(pool.where):
            return migrate(pool.get(), pool.where)
    finally:
        pool.close()
