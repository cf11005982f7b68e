"""The deployment's node registry: each running node beats (a row that expires unless renewed),
so every node can tell which others are alive and share the lease shards out among them
(engine.runtime.nodes), and the doctor can name nodes started with another shard count or
lease driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class NodeBeat:
    """One node's registration as last renewed."""

    node_id: str
    shards: int  # the shard count it runs with (1: no shards)
    started_at: int
    heartbeat_at: int
    expires_at: int  # alive until then unless it beats again
    lease_driver: str = "row"  # how it holds its leases (the lease_driver setting)


class NodeRegistry(Protocol):
    """Contract: each method is one atomic statement; instants are the caller's clock's."""

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
        """Register `node_id` or renew its registration: alive until `now_ms + ttl_ms`."""
        ...

    def live(self, now_ms: int) -> list[NodeBeat]:
        """The nodes alive at `now_ms` (expiring after it), by node id."""
        ...

    def leave(self, node_id: str) -> None:
        """Deregister `node_id` (a clean stop): the others share its shards out at once."""
        ...

    def prune(self, before_ms: int) -> int:
        """Delete the registrations that expired before `before_ms`; how many."""
        ...
