"""The plug-in state store's conformance suite (engine.testing.conformance), on our backends."""

from __future__ import annotations

from engine.testing.conformance.plugin_state import PluginStateConformance
from tests.conformance._backends import OnPostgres, OnSqlite


class TestOnSqlite(OnSqlite, PluginStateConformance):
    pass


class TestOnPostgres(OnPostgres, PluginStateConformance):
    pass
