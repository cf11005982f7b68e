"""The node registry on either SQL backend, one SQL for both (both speak ON CONFLICT)."""

from __future__ import annotations

from typing import Any

from engine.backends.sql import SqlPool
from engine.ports.nodes import NodeBeat

_COLUMNS = "node_id, shards, started_at, heartbeat_at, expires_at, lease_driver"


class SqlNodeRegistry:
    def __init__(self, pool: SqlPool[Any]) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def beat(
        self,
        node_id: str,
        shards: int,
        started_at: int,
        now_ms: int,
        ttl_ms: int,
        *,
        lease_driver: str = "row",
    ) -> None:
        self._pool.write(
            f"INSERT INTO nodes ({_COLUMNS}) VALUES ({self._pool.dialect.marks(6)}) "
            "ON CONFLICT (node_id) DO UPDATE SET shards = excluded.shards, "
            "started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, "
            "expires_at = excluded.expires_at, lease_driver = excluded.lease_driver",
            (node_id, shards, started_at, now_ms, now_ms + ttl_ms, lease_driver),
        )

    def live(self, now_ms: int) -> list[NodeBeat]:
        rows = self._pool.read(
            f"SELECT {_COLUMNS} FROM nodes WHERE expires_at > {self._mark} ORDER BY node_id",
            (now_ms,),
        )
        return [
            NodeBeat(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), str(r[5])) for r in rows
        ]

    def leave(self, node_id: str) -> None:
        self._pool.write(f"DELETE FROM nodes WHERE node_id = {self._mark}", (node_id,))

    def prune(self, before_ms: int) -> int:
        return self._pool.write(f"DELETE FROM nodes WHERE expires_at < {self._mark}", (before_ms,))
