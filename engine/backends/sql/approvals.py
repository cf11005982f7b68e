"""Approval requests on either SQL backend: the row codec and the store, one SQL for both.

A transition is one conditional UPDATE (`WHERE state = expect`): of two approvers, or two
consumers, racing on one request, the second finds the state moved on (SQLite: after the
first's write transaction; PostgreSQL: after the first's row lock) and changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from engine.backends.sql import Row, SqlPool, Where
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


class SqlApprovalStore:
    def __init__(self, pool: SqlPool[Any]) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def add(self, approval: Approval) -> None:
        marks = self._pool.dialect.marks(len(COLUMNS.split(",")))
        self._pool.write(
            f"INSERT INTO approvals ({COLUMNS}) VALUES ({marks})", approval_values(approval)
        )

    def get(self, approval_id: str) -> Approval | None:
        found = self._pool.read(
            f"SELECT {COLUMNS} FROM approvals WHERE id = {self._mark}", (approval_id,)
        )
        return approval_from_row(found[0]) if found else None

    def find(
        self, *, tenant: str, digest: str, state: ApprovalState, now_ms: int
    ) -> Approval | None:
        m = self._mark
        found = self._pool.read(
            f"SELECT {COLUMNS} FROM approvals WHERE tenant = {m} AND digest = {m} "
            f"AND state = {m} AND expires_at > {m} ORDER BY requested_at DESC, id LIMIT 1",
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
        where = Where(self._pool.dialect)
        where.equal("tenant", tenant)
        where.scope("tenant", tenants)
        where.equal("state", None if state is None else state.value)
        sql = (
            f"SELECT {COLUMNS} FROM approvals {where} "
            f"ORDER BY state = 'pending' DESC, requested_at DESC, id LIMIT {self._mark}"
        )
        return [approval_from_row(r) for r in self._pool.read(sql, (*where.args, limit))]

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
        m = self._mark
        if to is ApprovalState.CONSUMED:
            changed = self._pool.write(
                f"UPDATE approvals SET state = {m}, consumed_at = {m} "
                f"WHERE id = {m} AND state = {m}",
                (to.value, at, approval_id, expect.value),
            )
        else:
            changed = self._pool.write(
                f"UPDATE approvals SET state = {m}, decided_by = {m}, decided_at = {m}, "
                f"reason = {m} WHERE id = {m} AND state = {m}",
                (to.value, by, at, reason, approval_id, expect.value),
            )
        return changed > 0
