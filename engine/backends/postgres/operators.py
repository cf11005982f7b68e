"""Operator grants in PostgreSQL: the shared store (engine.backends.operators)."""

from __future__ import annotations

from engine.backends.operators import SqlOperatorStore
from engine.backends.postgres.connection import PgPool


class PostgresOperatorStore(SqlOperatorStore):
    def __init__(self, pool: PgPool) -> None:
        super().__init__(pool)
