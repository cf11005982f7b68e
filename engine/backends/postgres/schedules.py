"""Schedules in PostgreSQL.

Version-checked writes are single conditional statements (`... WHERE version = %s`): of two
writers holding the same version, the second waits for the first one's row lock, then finds
the version moved and changes nothing. Only when nothing was written is the row read again,
to say why. The reads are engine.backends.sql.schedules'.
"""

from __future__ import annotations

import zlib
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.backends.codec import SCHEDULE_COLUMNS, schedule_values
from engine.backends.postgres.connection import (
    PgPool,
    Row,
    first,
    storage_errors,
    write_tx,
)
from engine.backends.sql.schedules import (
    SCHEDULE_NAMES,
    SqlScheduleStore,
    missing,
    name_taken,
    stale,
)
from engine.domain.schedule import Schedule

if TYPE_CHECKING:
    import psycopg

_INSERT = (
    f"INSERT INTO schedules ({SCHEDULE_COLUMNS}, shard_key) "
    f"VALUES ({', '.join(['%s'] * (len(SCHEDULE_NAMES) + 1))})"
)
# Every column but the id; the shard key follows the id and never changes.
_UPDATE = (
    f"UPDATE schedules SET {', '.join(f'{c} = %s' for c in SCHEDULE_NAMES[1:])} "
    "WHERE id = %s AND tenant = %s AND version = %s"
)


def _one_statement(conn: psycopg.Connection[Row]) -> AbstractContextManager[object]:
    """Alone, one statement is atomic without a transaction around it; inside the caller's
    transaction, a savepoint keeps a refused statement from spoiling the rest of it."""
    return nullcontext() if conn.info.transaction_status.name == "IDLE" else write_tx(conn)


def shard_key(schedule_id: str) -> int:
    """The stable hash a schedule's lease shard is chosen by (modulo the shard count)."""
    return zlib.crc32(schedule_id.encode())


class PostgresScheduleStore(SqlScheduleStore[PgPool]):
    def insert(self, schedule: Schedule) -> Schedule:
        from psycopg.errors import UniqueViolation  # noqa: PLC0415 - the postgres extra

        conn = self._pool.get()
        with storage_errors(self._pool.where):
            try:
                with _one_statement(conn):
                    conn.execute(_INSERT, (*schedule_values(schedule), shard_key(schedule.id)))
            except UniqueViolation:
                raise name_taken(schedule, remedy=True) from None
        return schedule

    def update(self, schedule: Schedule, expected_version: int) -> Schedule:
        from psycopg.errors import UniqueViolation  # noqa: PLC0415 - the postgres extra

        conn = self._pool.get()
        # The store, not the caller, decides the new version: a caller that forgot to bump it
        # must not let a later stale writer through.
        stored = replace(schedule, version=expected_version + 1)
        values = schedule_values(stored)
        with storage_errors(self._pool.where):
            try:
                with _one_statement(conn):
                    changed = conn.execute(
                        _UPDATE, (*values[1:], schedule.id, schedule.tenant, expected_version)
                    ).rowcount
            except UniqueViolation:
                raise name_taken(schedule, remedy=False) from None
            if changed == 0:
                self._refuse(conn, schedule.id, schedule.tenant, expected_version)
        return stored

    def delete(self, schedule_id: str, tenant: str, expected_version: int | None = None) -> None:
        conn = self._pool.get()
        sql = "DELETE FROM schedules WHERE id = %s AND tenant = %s"
        args: tuple[Any, ...] = (schedule_id, tenant)
        if expected_version is not None:
            sql += " AND version = %s"
            args += (expected_version,)
        with storage_errors(self._pool.where):
            if conn.execute(sql, args).rowcount == 0:
                self._refuse(conn, schedule_id, tenant, expected_version)

    @staticmethod
    def _refuse(
        conn: psycopg.Connection[Row], schedule_id: str, tenant: str, expected: int | None
    ) -> None:
        """Raise why a version-checked write changed nothing: the row is gone or moved on."""
        found: Row | None = first(
            conn,
            "SELECT version, name FROM schedules WHERE id = %s AND tenant = %s",
            (schedule_id, tenant),
        )
        if found is None:
            raise missing(schedule_id, tenant)
        raise stale(found[1], expected, found[0])
