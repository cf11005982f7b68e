"""Approval requests in PostgreSQL: the shared store (engine.backends.approvals).

A transition is one conditional UPDATE (`WHERE state = expect`): of two approvers, or two
consumers, racing on one request, the second waits for the first's row lock, finds the state
moved on, and changes nothing.
"""

from __future__ import annotations

from engine.backends.approvals import SqlApprovalStore
from engine.backends.postgres.connection import PgPool


class PostgresApprovalStore(SqlApprovalStore):
    def __init__(self, pool: PgPool) -> None:
        super().__init__(pool)
