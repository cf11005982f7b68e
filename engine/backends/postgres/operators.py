"""Operator grants in PostgreSQL."""

from __future__ import annotations

from engine.backends.postgres.connection import PgPool, rows, scalar, storage_errors, write_tx
from engine.domain.access import Grant, Role


class PostgresOperatorStore:
    def __init__(self, pool: PgPool) -> None:
        self._pool = pool

    def grants(self, operator: str | None = None) -> list[Grant]:
        sql = "SELECT operator, role, tenant FROM operator_grants"
        args: tuple[str, ...] = ()
        if operator is not None:
            sql += " WHERE operator = %s"
            args = (operator,)
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), sql + " ORDER BY operator, tenant, role", args)
        return [Grant(r[0], Role(r[1]), r[2]) for r in found]

    def grant(self, grant: Grant, *, by: str, at: int) -> bool:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            done = conn.execute(
                "INSERT INTO operator_grants (operator, role, tenant, granted_by, granted_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (grant.operator, grant.role.value, grant.tenant, by, at),
            )
            return done.rowcount > 0

    def revoke(self, grant: Grant) -> bool:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            done = conn.execute(
                "DELETE FROM operator_grants WHERE operator = %s AND role = %s AND tenant = %s",
                (grant.operator, grant.role.value, grant.tenant),
            )
            return done.rowcount > 0

    def count(self, role: Role | None = None) -> int:
        sql = "SELECT count(*) FROM operator_grants"
        args: tuple[str, ...] = ()
        if role is not None:
            sql += " WHERE role = %s"
            args = (role.value,)
        with storage_errors(self._pool.where):
            return int(scalar(self._pool.get(), sql, args))
