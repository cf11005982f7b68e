"""The node registry's conformance suite (engine.testing.conformance), on our backends."""

from __future__ import annotations

from engine.testing.conformance.node_registry import NodeRegistryConformance
from tests.conformance._backends import OnPostgres, OnSqlite


class TestOnSqlite(OnSqlite, NodeRegistryConformance):
    pass


class TestOnPostgres(OnPostgres, NodeRegistryConformance):
    pass
