"""The fire queue in SQLite (reads; claims arrive with the execution issue)."""

from __future__ import annotations

import json
from typing import Any

from engine.backends.sqlite.connection import (
    ConnectionPool,
    rows,
    scalar,
    storage_errors,
)
from engine.ports.fire_queue import Fire

_COLUMNS = (
    "id, run_id, tenant, schedule_id, slot_key, slot_at, command, payload, available_at, "
    "created_at, attempts"
)
_OPEN = "completed_at IS NULL AND discarded_at IS NULL"


class SqliteFireQueue:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        sql = f"SELECT {_COLUMNS} FROM fire_queue WHERE {_OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND tenant = ?"
            args = (tenant,)
        sql += " ORDER BY available_at, id LIMIT ?"
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), sql, (*args, limit))
        return [
            Fire(
                id=r[0],
                run_id=r[1],
                tenant=r[2],
                schedule_id=r[3],
                slot_key=r[4],
                slot_at=r[5],
                command=r[6],
                payload=json.loads(r[7]),
                available_at=r[8],
                created_at=r[9],
                attempts=r[10],
            )
            for r in found
        ]

    def depth(self, tenant: str | None = None) -> int:
        sql = f"SELECT count(*) FROM fire_queue WHERE {_OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND tenant = ?"
            args = (tenant,)
        with storage_errors(self._pool.path):
            return int(scalar(self._pool.get(), sql, args))
