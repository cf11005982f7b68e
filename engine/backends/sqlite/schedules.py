"""Schedules in SQLite (the reads are engine.backends.sql.schedules'): every version-checked write
reads the version and writes in one BEGIN IMMEDIATE transaction, which no other writer can
enter in between."""

from __future__ import annotations

from dataclasses import replace

import apsw

from engine.backends.codec import SCHEDULE_COLUMNS, schedule_values
from engine.backends.sql.schedules import (
    SCHEDULE_NAMES,
    SqlScheduleStore,
    missing,
    name_taken,
    stale,
)
from engine.backends.sqlite.connection import ConnectionPool, rows, storage_errors, write_tx
from engine.domain.schedule import Schedule

_PLACEHOLDERS = ", ".join("?" * len(SCHEDULE_NAMES))
_ASSIGN = ", ".join(f"{c} = ?" for c in SCHEDULE_NAMES[1:])


class SqliteScheduleStore(SqlScheduleStore[ConnectionPool]):
    def insert(self, schedule: Schedule) -> Schedule:
        conn = self._pool.get()
        with storage_errors(self._pool.path):
            try:
                with write_tx(conn):
                    conn.execute(
                        f"INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ({_PLACEHOLDERS})",
                        schedule_values(schedule),
                    )
            except apsw.ConstraintError:
                raise name_taken(schedule, remedy=True) from None
        return schedule

    def update(self, schedule: Schedule, expected_version: int) -> Schedule:
        # The store, not the caller, decides the new version: a caller that forgot to bump it
        # must not let a later stale writer through.
        stored = replace(schedule, version=expected_version + 1)
        values = schedule_values(stored)
        with self._pool.transaction() as conn:
            self._check_version(conn, schedule.id, schedule.tenant, expected_version)
            try:
                conn.execute(
                    f"UPDATE schedules SET {_ASSIGN} WHERE id = ? AND version = ?",
                    (*values[1:], schedule.id, expected_version),
                )
            except apsw.ConstraintError:
                raise name_taken(schedule, remedy=False) from None
        return stored

    def delete(self, schedule_id: str, tenant: str, expected_version: int | None = None) -> None:
        with self._pool.transaction() as conn:
            self._check_version(conn, schedule_id, tenant, expected_version)
            conn.execute("DELETE FROM schedules WHERE id = ? AND tenant = ?", (schedule_id, tenant))

    @staticmethod
    def _check_version(
        conn: apsw.Connection, schedule_id: str, tenant: str, expected: int | None
    ) -> None:
        found = rows(
            conn,
            "SELECT version, name FROM schedules WHERE id = ? AND tenant = ?",
            (schedule_id, tenant),
        )
        if not found:
            raise missing(schedule_id, tenant)
        if expected is not None and found[0][0] != expected:
            raise stale(found[0][1], expected, found[0][0])
