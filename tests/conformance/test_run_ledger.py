"""The run ledger's conformance suite (engine.testing.conformance), on our backends."""

from __future__ import annotations

from engine.testing.conformance.run_ledger import RunLedgerConformance
from tests.conformance._backends import OnPostgres, OnSqlite


class TestOnSqlite(OnSqlite, RunLedgerConformance):
    pass


class TestOnPostgres(OnPostgres, RunLedgerConformance):
    pass
