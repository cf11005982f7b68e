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
    "f.run_id, f.tenant, f.schedule_id, r.slot_key, f.slot_at, f.command, f.payload, "
    "f.available_at, f.created_at, f.attempts"
)
_FROM = "fire_queue f JOIN runs r ON r.id = f.run_id"
_OPEN = "f.completed_at IS NULL AND f.discarded_at IS NULL"


class SqliteFireQueue:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        sql = f"SELECT {_COLUMNS} FROM {_FROM} WHERE {_OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND f.tenant = ?"
            args = (tenant,)
        sql += " ORDER BY f.available_at, f.run_id LIMIT ?"
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), sql, (*args, limit))
        return [
            Fire(
                run_id=r[0],
                tenant=r[1],
                schedule_id=r[2],
                slot_key=r[3],
                slot_at=r[4],
                command=r[5],
                payload=json.loads(r[6]),
                available_at=r[7],
                created_at=r[8],
                attempts=r[9],
            )
            for r in found
        ]

    def depth(self, tenant: str | None = None) -> int:
        sql = f"SELECT count(*) FROM fire_queue f WHERE {_OPEN}"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " AND f.tenant = ?"
            args = (tenant,)
        with storage_errors(self._pool.path):
            return int(scalar(self._pool.get(), sql, args))
