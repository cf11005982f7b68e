"""Operator grants in SQLite."""

from __future__ import annotations

from engine.backends.sqlite.connection import ConnectionPool, rows, scalar, storage_errors, write_tx
from engine.domain.access import Grant, Role


class SqliteOperatorStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def grants(self, operator: str | None = None) -> list[Grant]:
        sql = "SELECT operator, role, tenant FROM operator_grants"
        args: tuple[str, ...] = ()
        if operator is not None:
            sql += " WHERE operator = ?"
            args = (operator,)
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), sql + " ORDER BY operator, tenant, role", args)
        return [Grant(r[0], Role(r[1]), r[2]) for r in found]

    def grant(self, grant: Grant, *, by: str, at: int) -> bool:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            before = conn.total_changes()
            conn.execute(
                "INSERT INTO operator_grants (operator, role, tenant, granted_by, granted_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (grant.operator, grant.role.value, grant.tenant, by, at),
            )
            return conn.total_changes() > before

    def revoke(self, grant: Grant) -> bool:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            before = conn.total_changes()
            conn.execute(
                "DELETE FROM operator_grants WHERE operator = ? AND role = ? AND tenant = ?",
                (grant.operator, grant.role.value, grant.tenant),
            )
            return conn.total_changes() > before

    def count(self, role: Role | None = None) -> int:
        with storage_errors(self._pool.path):
            if role is None:
                return int(scalar(self._pool.get(), "SELECT count(*) FROM operator_grants"))
            return int(
                scalar(
                    self._pool.get(),
                    "SELECT count(*) FROM operator_grants WHERE role = ?",
                    (role.value,),
                )
            )
