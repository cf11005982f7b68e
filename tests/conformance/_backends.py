"""Our backends under the shipped storage suites: mix one into a suite's subclass.

class TestOnSqlite(OnSqlite, ScheduleStoreConformance): ...
class TestOnPostgres(OnPostgres, ScheduleStoreConformance): ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.backends.sqlite import SqliteBackend
from engine.domain.audit import KeyRing
from engine.domain.clock import ManualClock
from engine.ports.storage import Storage
from tests.pg import fresh_schema

# Dispatch audits every fire, so every store the suites open can sign.
SUITE_KEYS = KeyRing([b"conformance-suite-audit-key-0001"])


class OnSqlite:
    """The embedded backend: a new SQLite file in the test's directory."""

    backend = "sqlite"

    @contextmanager
    def open_storage(self, clock: ManualClock, directory: Path) -> Iterator[Storage]:
        backend = SqliteBackend(directory / "sqlite.db", clock, audit_keys=lambda: SUITE_KEYS)
        try:
            yield backend
        finally:
            backend.close()


class OnPostgres:
    """The PostgreSQL backend: a schema of its own in the test database, dropped afterwards
    (skips, or fails under CI, without the server)."""

    backend = "postgres"

    @contextmanager
    def open_storage(self, clock: ManualClock, directory: Path) -> Iterator[Storage]:
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra

        with fresh_schema() as url:
            backend = PostgresBackend(url, clock, audit_keys=lambda: SUITE_KEYS)
            try:
                yield backend
            finally:
                backend.close()
