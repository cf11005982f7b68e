"""The schedule store's conformance suite (engine.testing.conformance), on our backends."""

from __future__ import annotations

from engine.testing.conformance.schedule_store import ScheduleStoreConformance
from tests.conformance._backends import OnPostgres, OnSqlite


class TestOnSqlite(OnSqlite, ScheduleStoreConformance):
    pass


class TestOnPostgres(OnPostgres, ScheduleStoreConformance):
    pass
