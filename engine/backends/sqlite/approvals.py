"""Approval requests in SQLite."""

from __future__ import annotations

import json
from typing import Any

from engine.backends.sqlite.connection import (
    ConnectionPool,
    Row,
    rows,
    storage_errors,
    tenants_clause,
    write_tx,
)
from engine.domain.approvals import Approval, ApprovalState, GatedOperation
from engine.domain.audit import canonical

COLUMNS = (
    "id, tenant, schedule, operation, digest, change, requested_by, requested_at, expires_at, "
    "state, decided_by, decided_at, reason, consumed_at"
)


def approval_from_row(r: Row) -> Approval:
    return Approval(
        id=r[0],
        tenant=r[1],
        schedule=r[2],
        operation=GatedOperation(r[3]),
        digest=r[4],
        change=json.loads(r[5]),
        requested_by=r[6],
        requested_at=r[7],
        expires_at=r[8],
        stored_state=ApprovalState(r[9]),
        decided_by=r[10],
        decided_at=r[11],
        reason=r[12],
        consumed_at=r[13],
    )


def approval_values(a: Approval) -> tuple[Any, ...]:
    """The row for COLUMNS, in order."""
    return (
        a.id,
        a.tenant,
        a.schedule,
        a.operation.value,
        a.digest,
        canonical(dict(a.change)),
        a.requested_by,
        a.requested_at,
        a.expires_at,
        a.stored_state.value,
        a.decided_by,
        a.decided_at,
        a.reason,
        a.consumed_at,
    )


class SqliteApprovalStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def add(self, approval: Approval) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            conn.execute(
                f"INSERT INTO approvals ({COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                approval_values(approval),
            )

    def get(self, approval_id: str) -> Approval | None:
        with storage_errors(self._pool.path):
            found = rows(
                self._pool.get(), f"SELECT {COLUMNS} FROM approvals WHERE id = ?", (approval_id,)
            )
        return approval_from_row(found[0]) if found else None

    def find(
        self, *, tenant: str, digest: str, state: ApprovalState, now_ms: int
    ) -> Approval | None:
        with storage_errors(self._pool.path):
            found = rows(
                self._pool.get(),
                f"SELECT {COLUMNS} FROM approvals WHERE tenant = ? AND digest = ? "
                "AND state = ? AND expires_at > ? ORDER BY requested_at DESC, id LIMIT 1",
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
            where.append("tenant = ?")
            args.append(tenant)
        scoped, scope_args = tenants_clause("tenant", tenants)
        if scoped is not None:
            where.append(scoped)
            args += scope_args
        if state is not None:
            where.append("state = ?")
            args.append(state.value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = (
            f"SELECT {COLUMNS} FROM approvals {clause} "
            "ORDER BY state = 'pending' DESC, requested_at DESC, id LIMIT ?"
        )
        params: tuple[Any, ...] = (*args, limit)
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), sql, params)
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
        consumed = to is ApprovalState.CONSUMED
        with storage_errors(self._pool.path), write_tx(conn):
            before = conn.total_changes()
            if consumed:
                conn.execute(
                    "UPDATE approvals SET state = ?, consumed_at = ? WHERE id = ? AND state = ?",
                    (to.value, at, approval_id, expect.value),
                )
            else:
                conn.execute(
                    "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ?, reason = ? "
                    "WHERE id = ? AND state = ?",
                    (to.value, by, at, reason, approval_id, expect.value),
                )
            return conn.total_changes() > before
