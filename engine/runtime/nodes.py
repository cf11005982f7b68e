"""Lease shards shared out among the live nodes.

Each node beats into the node registry (engine.ports.nodes) once per beat interval, reads who
else is alive, and computes which shards are its share: every node computes the same answer
from the same live set (`share_out`), so they agree without talking. A daemon whose shard is
another node's share does not try to lead it and gives it up if it holds it
(`SchedulerDaemon(wants_lease=...)`); the owner takes it at its next look. A node that joins
or stops cleanly (deregistering) is seen at the others' next read of the registry, within a
second; a node that dies is dropped when its registration expires (one TTL after its last
beat), and its shards move to the survivors.

Nothing here runs per fire: a daemon's question is answered from the last beat.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence

from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput, StorageError
from engine.ports.nodes import NodeBeat, NodeRegistry

log = logging.getLogger("vortos.nodes")

READ_EVERY_MS = 1_000  # how often the live nodes are read between beats (sharded nodes)
PRUNE_AFTER_MS = 86_400_000  # registrations expired this long ago are deleted at a start


def _rank(node_id: str, shard: int) -> bytes:
    return hashlib.blake2b(f"{shard}\0{node_id}".encode(), digest_size=8).digest()


def share_out(node_ids: Sequence[str], shards: int) -> dict[str, list[int]]:
    """{node id: the shards it leads} for `shards` shards among `node_ids`: every shard has
    exactly one node, and the counts per node differ by at most one. Deterministic (the same
    answer whatever the order of `node_ids`), and a join or leave moves few shards: each shard
    goes to the node that ranks it highest (rendezvous hashing) among those with room left,
    the first `shards % n` nodes by id having room for one more."""
    if shards < 1:
        raise ValueError("at least one shard")
    nodes = sorted(set(node_ids))
    if not nodes:
        return {}
    base, extra = divmod(shards, len(nodes))
    room = {node: base + (1 if i < extra else 0) for i, node in enumerate(nodes)}
    owned: dict[str, list[int]] = {node: [] for node in nodes}
    for shard in range(shards):
        owner = max((n for n in nodes if room[n] > 0), key=lambda n: _rank(n, shard))
        room[owner] -= 1
        owned[owner].append(shard)
    return owned


def mismatched(live: Sequence[NodeBeat], shards: int) -> list[NodeBeat]:
    """The live nodes that run with another shard count than `shards`."""
    return [beat for beat in live if beat.shards != shards]


def other_drivers(live: Sequence[NodeBeat], lease_driver: str) -> list[NodeBeat]:
    """The live nodes that hold their leases with another driver than `lease_driver`: a
    Redis-key leader and a row leader each believe they lead (fencing keeps dispatch exactly
    once, but leadership flips between them whenever one stalls)."""
    return [beat for beat in live if beat.lease_driver != lease_driver]


class Membership:
    """This node's registration and its share of the shards.

    `join()` refuses to start beside live nodes of another shard count; `wants(shard)` is a
    daemon's wants_lease (beating first when the interval is up, on whichever daemon thread
    asks); `leave()` deregisters on a clean stop. A failed beat keeps the last share: the
    database is what dispatch needs too, and fencing holds whatever the share says."""

    def __init__(
        self,
        registry: NodeRegistry,
        clock: Clock,
        node_id: str,
        shards: int,
        ttl_ms: int,
        on_change: Callable[[list[int], list[str]], None] | None = None,
        *,
        lease_driver: str = "row",
    ) -> None:
        self._registry = registry
        self.lease_driver = lease_driver
        self._clock = clock
        self.node_id = node_id
        self.shards = shards
        self.ttl_ms = ttl_ms
        # A beat (a write) per renewal interval of the lease; between beats the registry is
        # read (a read of a row per node) about once a second, so a node that joins or
        # leaves is seen within a second, not at the next beat.
        self.beat_every_ms = max(1, ttl_ms // 3)
        self.read_every_ms = min(READ_EVERY_MS, self.beat_every_ms)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._started_at = clock.now_ms()
        self._beaten_at: int | None = None
        self._read_at = 0
        self._beats: list[NodeBeat] = []  # the last read of the registry
        self._mismatch_seen: set[str] = set()  # nodes of another shard count, logged once
        self.share: frozenset[int] = frozenset()
        self.live: list[str] = []

    def join(self) -> None:
        """Register, unless live nodes run with another shard count or lease driver
        (InvalidInput)."""
        now = self._clock.now_ms()
        others = [b for b in self._registry.live(now) if b.node_id != self.node_id]
        drivers = other_drivers(others, self.lease_driver)
        if drivers:
            named = ", ".join(f"{b.node_id} (lease_driver {b.lease_driver})" for b in drivers)
            theirs = sorted({b.lease_driver for b in drivers})
            raise InvalidInput(
                f"this node was started with lease_driver {self.lease_driver}, but live "
                f"node(s) {named} hold their leases another way: every node must use the same "
                f"driver. Start this one with --lease-driver {theirs[0]}, or stop every node "
                "and start them all with the new driver"
            )
        wrong = mismatched(others, self.shards)
        if wrong:
            counts = sorted({b.shards for b in wrong})
            named = ", ".join(f"{b.node_id} (--shards {b.shards})" for b in wrong)
            raise InvalidInput(
                f"this node was started with --shards {self.shards}, but live node(s) {named} "
                f"run with {' and '.join(map(str, counts))}: every node must use the same "
                f"count. Start this one with --shards {counts[0]}, or stop every node and "
                "start them all with the new count"
            )
        try:
            self._registry.prune(now - PRUNE_AFTER_MS)  # the rows of long-gone nodes
        except StorageError as exc:
            log.warning("could not prune the node registry: %s", exc)
        with self._lock:
            self._beat(now)

    def wants(self, shard: int) -> bool:
        """Whether `shard` is this node's share now. Without shards every node contends for
        the one lease, as standbys always have (a share would slow every hand-over to the
        next beat): the node still beats, for the refusal and the doctor."""
        with self._lock:
            now = self._clock.now_ms()
            if self._beaten_at is None or now - self._beaten_at >= self.beat_every_ms:
                self._beat(now)
            elif self.shards > 1 and now - self._read_at >= self.read_every_ms:
                self._read(now)
            else:
                # A node whose registration expired since the last read is dead now, not at
                # the next read: its shards move the moment it expires.
                self._share_among(now)
            return self.shards == 1 or shard in self.share

    def leave(self) -> None:
        try:
            self._registry.leave(self.node_id)
        except StorageError as exc:
            log.warning("could not deregister node %s: %s", self.node_id, exc)

    def _beat(self, now: int) -> None:
        try:
            self._registry.beat(
                self.node_id,
                self.shards,
                self._started_at,
                now,
                self.ttl_ms,
                lease_driver=self.lease_driver,
            )
        except StorageError as exc:
            log.warning("node heartbeat failed (keeping shards %s): %s", sorted(self.share), exc)
            self._beaten_at = self._read_at = now  # not again before the next interval
            return
        self._beaten_at = now
        self._read(now)

    def _read(self, now: int) -> None:
        self._read_at = now
        try:
            self._beats = self._registry.live(now)
        except StorageError as exc:
            log.warning(
                "reading the live nodes failed (keeping shards %s): %s", sorted(self.share), exc
            )
            return
        self._share_among(now)

    def _share_among(self, now: int) -> None:
        """This node's share among the nodes of the last read still alive at `now`."""
        if self.shards == 1:
            return
        alive = [b for b in self._beats if b.expires_at > now and b.node_id != self.node_id]
        for beat in mismatched(alive, self.shards):
            # Started beside this one at the same moment, or by a Vortos that does not
            # refuse: it leads other leases, so it gets no share here (every shard of ours
            # keeps a leader); the doctor names it too (cluster.nodes).
            if beat.node_id not in self._mismatch_seen:
                self._mismatch_seen.add(beat.node_id)
                log.error(
                    "node %s runs with --shards %d, this one (%s) with %d: every node must "
                    "use the same count; restart it (or this one) with the others' count",
                    beat.node_id,
                    beat.shards,
                    self.node_id,
                    self.shards,
                )
        # Our own row counts whatever a skewed read said.
        live = sorted({b.node_id for b in alive if b.shards == self.shards} | {self.node_id})
        if live == self.live:
            return
        share = frozenset(share_out(live, self.shards)[self.node_id])
        changed = share != self.share
        self.share, self.live = share, live
        log.info(
            "%s leads shard(s) %s of %d (%d live node(s): %s)",
            self.node_id,
            ", ".join(map(str, sorted(share))) or "none",
            self.shards,
            len(live),
            ", ".join(live),
        )
        if changed and self._on_change is not None:
            self._on_change(sorted(share), live)
