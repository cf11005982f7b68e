"""Approval requests in SQLite: the shared store (engine.backends.approvals) on one file."""

from __future__ import annotations

from engine.backends.approvals import (
    COLUMNS,
    SqlApprovalStore,
    approval_from_row,
    approval_values,
)
from engine.backends.sqlite.connection import ConnectionPool

# The codec stays importable from here (the read model reads approvals through it).
__all__ = ["COLUMNS", "SqliteApprovalStore", "approval_from_row", "approval_values"]


class SqliteApprovalStore(SqlApprovalStore):
    def __init__(self, pool: ConnectionPool) -> None:
        super().__init__(pool)
