"""Schedules in PostgreSQL.

Version-checked writes are single conditional statements (`... WHERE version = %s`): of two
writers holding the same version, the second waits for the first one's row lock, then finds
the version moved and changes nothing. Only when nothing was written is the row read again,
to say why.
"""

from __future__ import annotations

import zlib
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.backends.codec import SCHEDULE_COLUMNS, schedule_from_row, schedule_values
from engine.backends.postgres.connection import (
    PgPool,
    Row,
    first,
    rows,
    scalar,
    storage_errors,
    tenants_clause,
    write_tx,
)
from engine.domain.errors import DuplicateName, NotFound, StaleVersion
from engine.domain.schedule import Schedule
from engine.ports.schedules import ScheduleQuery

if TYPE_CHECKING:
    import psycopg

_NAMES = [c.strip() for c in SCHEDULE_COLUMNS.split(",")]
_INSERT = (
    f"INSERT INTO schedules ({SCHEDULE_COLUMNS}, shard_key) "
    f"VALUES ({', '.join(['%s'] * (len(_NAMES) + 1))})"
)
# Every column but the id; the shard key follows the id and never changes.
_UPDATE = (
    f"UPDATE schedules SET {', '.join(f'{c} = %s' for c in _NAMES[1:])} "
    "WHERE id = %s AND tenant = %s AND version = %s"
)
# Text in byte order, as SQLite compares it, whatever the database's collation.
_ORDER = 'next_fire_at IS NULL, next_fire_at, tenant COLLATE "C", name COLLATE "C"'


def _one_statement(conn: psycopg.Connection[Row]) -> AbstractContextManager[object]:
    """Alone, one statement is atomic without a transaction around it; inside the caller's
    transaction, a savepoint keeps a refused statement from spoiling the rest of it."""
    return nullcontext() if conn.info.transaction_status.name == "IDLE" else write_tx(conn)


def shard_key(schedule_id: str) -> int:
    """The stable hash a schedule's lease shard is chosen by (modulo the shard count)."""
    return zlib.crc32(schedule_id.encode())


class PostgresScheduleStore:
    def __init__(self, pool: PgPool) -> None:
        self._pool = pool

    def insert(self, schedule: Schedule) -> Schedule:
        from psycopg.errors import UniqueViolation  # noqa: PLC0415 - the postgres extra

        conn = self._pool.get()
        with storage_errors(self._pool.where):
            try:
                with _one_statement(conn):
                    conn.execute(_INSERT, (*schedule_values(schedule), shard_key(schedule.id)))
            except UniqueViolation:
                raise DuplicateName(
                    f"a schedule named {schedule.name!r} already exists in tenant "
                    f"{schedule.tenant!r}: choose another name, or change the existing one"
                ) from None
        return schedule

    def get(self, schedule_id: str, tenant: str | None = None) -> Schedule | None:
        sql = f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = %s"
        args: tuple[Any, ...] = (schedule_id,)
        if tenant is not None:
            sql += " AND tenant = %s"
            args += (tenant,)
        return self._one(sql, args)

    def find_by_name(self, tenant: str, name: str) -> Schedule | None:
        return self._one(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = %s AND name = %s",
            (tenant, name),
        )

    def query(self, query: ScheduleQuery) -> list[Schedule]:
        clauses: list[str] = []
        args: list[Any] = []
        if query.tenant is not None:
            clauses.append("tenant = %s")
            args.append(query.tenant)
        scoped, scope_args = tenants_clause("tenant", query.tenants)
        if scoped is not None:
            clauses.append(scoped)
            args += scope_args
        if query.status is not None:
            clauses.append("status = %s")
            args.append(query.status.value)
        if query.name_prefix:
            clauses.append("starts_with(name, %s)")
            args.append(query.name_prefix)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = (
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules {where} ORDER BY {_ORDER} LIMIT %s OFFSET %s"
        )
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), sql, (*args, query.limit, query.offset))
        return [schedule_from_row(r) for r in found]

    def count(self, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            if tenant is None:
                return int(scalar(conn, "SELECT count(*) FROM schedules"))
            return int(scalar(conn, "SELECT count(*) FROM schedules WHERE tenant = %s", (tenant,)))

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
                raise DuplicateName(
                    f"a schedule named {schedule.name!r} already exists in tenant "
                    f"{schedule.tenant!r}"
                ) from None
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
            raise NotFound(f"schedule {schedule_id} does not exist in tenant {tenant!r}")
        raise StaleVersion(
            f"schedule {found[1]!r} changed since it was read (version {expected}, now "
            f"{found[0]}): read it again and retry"
        )

    def _one(self, sql: str, args: tuple[Any, ...]) -> Schedule | None:
        with storage_errors(self._pool.where):
            row = first(self._pool.get(), sql, args)
        return None if row is None else schedule_from_row(row)
