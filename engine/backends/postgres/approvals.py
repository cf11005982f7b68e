"""Approval requests in PostgreSQL.

A transition is one conditional UPDATE (`WHERE state = expect`): of two approvers, or two
consumers, racing on one request, the second waits for the first's row lock, finds the state
moved on, and changes nothing.
"""

from __future__ import annotations

from typing import Any

from engine.backends.postgres.connection import (
    PgPool,
    rows,
    storage_errors,
    tenants_clause,
    write_tx,
)
from engine.backends.sqlite.approvals import COLUMNS, approval_from_row, approval_values
from engine.domain.approvals import Approval, ApprovalState

_MARKS = ", ".join(["%s"] * len(COLUMNS.split(",")))


class PostgresApprovalStore:
    def __init__(self, pool: PgPool) -> None:
        self._pool = pool

    def add(self, approval: Approval) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            conn.execute(
                f"INSERT INTO approvals ({COLUMNS}) VALUES ({_MARKS})", approval_values(approval)
            )

    def get(self, approval_id: str) -> Approval | None:
        with storage_errors(self._pool.where):
            found = rows(
                self._pool.get(), f"SELECT {COLUMNS} FROM approvals WHERE id = %s", (approval_id,)
            )
        return approval_from_row(found[0]) if found else None

    def find(
        self, *, tenant: str, digest: str, state: ApprovalState, now_ms: int
    ) -> Approval | None:
        with storage_errors(self._pool.where):
            found = rows(
                self._pool.get(),
                f"SELECT {COLUMNS} FROM approvals WHERE tenant = %s AND digest = %s "
                "AND state = %s AND expires_at > %s ORDER BY requested_at DESC, id LIMIT 1",
                (tenant, digest, state.value, now_ms),
            )
        return approval_from_row(found[0]) if found else None

    def list(
        self,
        *,
        tenant: str | None = None,
        state: ApprovalState | None = None,
        limit: int = 100,
        tenants: frozenset[str] | None = None,
    ) -> list[Approval]:
        where: list[str] = []
        args: list[Any] = []
        if tenant is not None:
            where.append("tenant = %s")
            args.append(tenant)
        scoped, scope_args = tenants_clause("tenant", tenants)
        if scoped is not None:
            where.append(scoped)
            args += scope_args
        if state is not None:
            where.append("state = %s")
            args.append(state.value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = (
            f"SELECT {COLUMNS} FROM approvals {clause} "
            "ORDER BY state = 'pending' DESC, requested_at DESC, id LIMIT %s"
        )
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), sql, [*args, limit])
        return [approval_from_row(r) for r in found]

    def transition(
        self,
        approval_id: str,
        *,
        expect: ApprovalState,
        to: ApprovalState,
        by: str,
        at: int,
        reason: str | None = None,
    ) -> bool:
        conn = self._pool.get()
        with storage_errors(self._pool.where), write_tx(conn):
            if to is ApprovalState.CONSUMED:
                done = conn.execute(
                    "UPDATE approvals SET state = %s, consumed_at = %s "
                    "WHERE id = %s AND state = %s",
                    (to.value, at, approval_id, expect.value),
                )
            else:
                done = conn.execute(
                    "UPDATE approvals SET state = %s, decided_by = %s, decided_at = %s, "
                    "reason = %s WHERE id = %s AND state = %s",
                    (to.value, by, at, reason, approval_id, expect.value),
                )
            return done.rowcount > 0
