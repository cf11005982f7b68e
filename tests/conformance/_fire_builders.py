"""Fires, claims and settlements for our fire-queue tests, and the SQL beneath the ports.

The backend-agnostic builders ship in engine.testing.conformance.fire_builders and are
re-exported here; what reaches into a backend's connection stays with our tests.
"""

from __future__ import annotations

from typing import Any

import apsw
import pytest

from engine.ports.storage import Storage
from engine.testing.conformance.fire_builders import (
    TTL_MS,
    TTL_S,
    claim,
    claimed_ids,
    complete,
    discard,
    enqueue,
    enqueue_slots,
    fail,
    fire_of,
    new_fire,
    release,
    reschedule,
    run_of,
    settlement_for,
    slot,
)

__all__ = [
    "TTL_MS",
    "TTL_S",
    "Refused",
    "SqlConnection",
    "claim",
    "claimed_ids",
    "complete",
    "discard",
    "enqueue",
    "enqueue_slots",
    "fail",
    "fire_of",
    "new_fire",
    "release",
    "reschedule",
    "run_of",
    "settlement_for",
    "slot",
    "sql_connection",
]


# --- the SQL underneath --------------------------------------------------------------------


class Refused(Exception):
    """The store refused a statement (a constraint or trigger), whatever the backend."""


class SqlConnection:
    """This thread's connection to the store's tables, for checks that go beneath the ports:
    `?` placeholders on every backend, a refusal raised as Refused."""

    def __init__(self, storage: Storage) -> None:
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 (one case each)
        from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415

        self._postgres = isinstance(storage, PostgresBackend)
        if isinstance(storage, PostgresBackend):
            self._conn: Any = storage.pool.get()
        elif isinstance(storage, SqliteBackend):
            self._conn = storage.pool.get()
        else:
            pytest.skip(f"no SQL access to {type(storage).__name__} here")

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (a RETURNING or SELECT gives its rows)."""
        import psycopg  # noqa: PLC0415

        try:
            if self._postgres:
                cursor = self._conn.execute(sql.replace("?", "%s"), args)
                return list(cursor.fetchall()) if cursor.description else []
            return list(self._conn.execute(sql, args))
        except (apsw.ConstraintError, psycopg.errors.IntegrityError) as exc:
            raise Refused(str(exc)) from exc


def sql_connection(storage: Storage) -> SqlConnection:
    """This thread's connection to the store's tables (see SqlConnection)."""
    return SqlConnection(storage)
