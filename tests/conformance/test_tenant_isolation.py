"""The tenant isolation conformance suite (engine.testing.conformance), on our backends, with
the console's read model of each."""

from __future__ import annotations

from engine import open_read_model
from engine.backends.sqlite import SqliteBackend
from engine.ports.read_model import ReadModel
from engine.ports.storage import Storage
from engine.testing.conformance.tenant_isolation import TenantIsolationConformance
from tests.conformance._backends import OnPostgres, OnSqlite


class TestOnSqlite(OnSqlite, TenantIsolationConformance):
    def open_read_model(self, storage: Storage, operator: str) -> ReadModel:
        assert isinstance(storage, SqliteBackend)
        return open_read_model(storage.path, operator=operator)


class TestOnPostgres(OnPostgres, TenantIsolationConformance):
    def open_read_model(self, storage: Storage, operator: str) -> ReadModel:
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra

        assert isinstance(storage, PostgresBackend)
        return open_read_model(storage.url, operator=operator)
