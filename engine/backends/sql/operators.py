"""Operator grants on either SQL backend, one SQL for both."""

from __future__ import annotations

from typing import Any

from engine.backends.sql import SqlPool, count
from engine.domain.access import Grant, Role


class SqlOperatorStore:
    def __init__(self, pool: SqlPool[Any]) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def grants(self, operator: str | None = None) -> list[Grant]:
        sql = "SELECT operator, role, tenant FROM operator_grants"
        args: tuple[str, ...] = ()
        if operator is not None:
            sql += f" WHERE operator = {self._mark}"
            args = (operator,)
        found = self._pool.read(sql + " ORDER BY operator, tenant, role", args)
        return [Grant(r[0], Role(r[1]), r[2]) for r in found]

    def grant(self, grant: Grant, *, by: str, at: int) -> bool:
        sql = (
            "INSERT INTO operator_grants (operator, role, tenant, granted_by, granted_at) "
            f"VALUES ({self._pool.dialect.marks(5)}) ON CONFLICT DO NOTHING"
        )
        return self._pool.write(sql, (grant.operator, grant.role.value, grant.tenant, by, at)) > 0

    def revoke(self, grant: Grant) -> bool:
        m = self._mark
        sql = f"DELETE FROM operator_grants WHERE operator = {m} AND role = {m} AND tenant = {m}"
        return self._pool.write(sql, (grant.operator, grant.role.value, grant.tenant)) > 0

    def count(self, role: Role | None = None) -> int:
        return count(self._pool, "operator_grants", "role", None if role is None else role.value)
