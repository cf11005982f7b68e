"""The approval and operator stores' conformance suite (engine.testing.conformance), on our
backends."""

from __future__ import annotations

from engine.testing.conformance.approval_store import ApprovalStoreConformance
from tests.conformance._backends import OnPostgres, OnSqlite


class TestOnSqlite(OnSqlite, ApprovalStoreConformance):
    pass


class TestOnPostgres(OnPostgres, ApprovalStoreConformance):
    pass
