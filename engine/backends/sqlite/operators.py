"""Operator grants in SQLite: the shared store (engine.backends.operators) on one file."""

from __future__ import annotations

from engine.backends.operators import SqlOperatorStore
from engine.backends.sqlite.connection import ConnectionPool


class SqliteOperatorStore(SqlOperatorStore):
    def __init__(self, pool: ConnectionPool) -> None:
        super().__init__(pool)
