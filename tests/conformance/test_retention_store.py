"""The retention store's suite on our backends, and what it cannot check through the ports:
rows an older or out-of-step ledger holds, written straight into the tables."""

from __future__ import annotations

from typing import Any

from engine.ports.retention import RunStanding
from engine.ports.storage import Storage
from engine.testing.conformance.fire_builders import enqueue, slot
from engine.testing.conformance.retention_store import (
    RetentionStoreConformance,
    by_id,
    newest,
    schedule_of,
    settled,
)
from tests.conformance._backends import OnPostgres, OnSqlite
from tests.conformance._fire_builders import sql_connection


def execute(storage: Storage, sql: str, *args: Any) -> None:
    """One statement straight to the store's tables (`?` placeholders), outside the ports."""
    sql_connection(storage).execute(sql, args)


class BeneathThePorts:
    """Rows no port writes, put in place with SQL: for our backends only."""

    def test_a_run_without_a_finish_ages_from_its_dispatch(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        run_id = settled(storage, schedule, 0)
        newest(storage, schedule)
        # An older ledger's row: terminal, no finish recorded.
        execute(
            storage,
            "UPDATE runs SET finished_at = NULL, dispatched_at = 12345 WHERE id = ?",
            run_id,
        )

        age = by_id(storage.retention.examine(0, 100))[run_id]

        assert (age.aged_from, age.dispatched_at) == (12345, 12345)

    def test_delete_never_removes_a_terminal_run_whose_fire_is_open(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        run_id = enqueue(storage, schedule, slot(0))
        newest(storage, schedule)
        # A ledger out of step with its queue: keep both.
        execute(storage, "UPDATE runs SET state = 'running' WHERE id = ?", run_id)
        execute(
            storage, "UPDATE runs SET state = 'completed', finished_at = 1 WHERE id = ?", run_id
        )

        assert by_id(storage.retention.examine(0, 10))[run_id].standing is RunStanding.OPEN
        assert storage.retention.delete([run_id]) == []
        assert storage.fire_queue.get(run_id) is not None


class TestOnSqlite(OnSqlite, BeneathThePorts, RetentionStoreConformance): ...


class TestOnPostgres(OnPostgres, BeneathThePorts, RetentionStoreConformance): ...
