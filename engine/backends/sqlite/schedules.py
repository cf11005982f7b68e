"""Schedules in SQLite."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import apsw

from engine.backends.codec import SCHEDULE_COLUMNS, schedule_from_row, schedule_values
from engine.backends.sqlite.connection import (
    ConnectionPool,
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

_PLACEHOLDERS = ", ".join("?" * len(SCHEDULE_COLUMNS.split(",")))
_ASSIGN = ", ".join(f"{c.strip()} = ?" for c in SCHEDULE_COLUMNS.split(",")[1:])


class SqliteScheduleStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

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
                raise DuplicateName(
                    f"a schedule named {schedule.name!r} already exists in tenant "
                    f"{schedule.tenant!r}: choose another name, or change the existing one"
                ) from None
        return schedule

    def get(self, schedule_id: str, tenant: str | None = None) -> Schedule | None:
        sql = f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?"
        args: tuple[Any, ...] = (schedule_id,)
        if tenant is not None:
            sql += " AND tenant = ?"
            args += (tenant,)
        return self._one(sql, args)

    def find_by_name(self, tenant: str, name: str) -> Schedule | None:
        return self._one(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = ? AND name = ?",
            (tenant, name),
        )

    def query(self, query: ScheduleQuery) -> list[Schedule]:
        clauses: list[str] = []
        args: list[Any] = []
        if query.tenant is not None:
            clauses.append("tenant = ?")
            args.append(query.tenant)
        scoped, scope_args = tenants_clause("tenant", query.tenants)
        if scoped is not None:
            clauses.append(scoped)
            args += scope_args
        if query.status is not None:
            clauses.append("status = ?")
            args.append(query.status.value)
        if query.name_prefix:
            clauses.append("substr(name, 1, ?) = ?")
            args += [len(query.name_prefix), query.name_prefix]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = (
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules {where} "
            "ORDER BY next_fire_at IS NULL, next_fire_at, tenant, name LIMIT ? OFFSET ?"
        )
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), sql, (*args, query.limit, query.offset))
        return [schedule_from_row(r) for r in found]

    def count(self, tenant: str | None = None) -> int:
        conn = self._pool.get()
        with storage_errors(self._pool.path):
            if tenant is None:
                return int(scalar(conn, "SELECT count(*) FROM schedules"))
            return int(scalar(conn, "SELECT count(*) FROM schedules WHERE tenant = ?", (tenant,)))

    def update(self, schedule: Schedule, expected_version: int) -> Schedule:
        conn = self._pool.get()
        # The store, not the caller, decides the new version: a caller that forgot to bump it
        # must not let a later stale writer through.
        stored = replace(schedule, version=expected_version + 1)
        values = schedule_values(stored)
        with storage_errors(self._pool.path), write_tx(conn):
            self._check_version(conn, schedule.id, schedule.tenant, expected_version)
            try:
                conn.execute(
                    f"UPDATE schedules SET {_ASSIGN} WHERE id = ? AND version = ?",
                    (*values[1:], schedule.id, expected_version),
                )
            except apsw.ConstraintError:
                raise DuplicateName(
                    f"a schedule named {schedule.name!r} already exists in tenant "
                    f"{schedule.tenant!r}"
                ) from None
        return stored

    def delete(self, schedule_id: str, tenant: str, expected_version: int | None = None) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
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
            raise NotFound(f"schedule {schedule_id} does not exist in tenant {tenant!r}")
        if expected is not None and found[0][0] != expected:
            raise StaleVersion(
                f"schedule {found[0][1]!r} changed since it was read (version {expected}, now "
                f"{found[0][0]}): read it again and retry"
            )

    def _one(self, sql: str, args: tuple[Any, ...]) -> Schedule | None:
        with storage_errors(self._pool.path):
            row = first(self._pool.get(), sql, args)
        return None if row is None else schedule_from_row(row)
