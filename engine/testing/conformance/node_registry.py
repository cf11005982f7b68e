"""The node registry's conformance suite."""

from __future__ import annotations

from engine.ports.nodes import NodeBeat
from engine.ports.storage import Storage
from engine.testing.conformance.storage import T0, StorageConformance

TTL = 3_000


class NodeRegistryConformance(StorageConformance):
    """The deployment's node registry (`Storage.nodes`, engine.ports.nodes.NodeRegistry): each
    running node's registration, which the nodes share lease shards out by and the doctor
    reads.

    Guarantees checked: a beat registers a node alive until now + ttl, and a later beat renews
    it (keeping one row per node, with the shard count it gave last); `live` lists the nodes
    expiring after the instant asked, by node id; `leave` deregisters one node only; `prune`
    deletes only registrations expired before the instant given.

    Subclass it and implement `open_storage` (see StorageConformance).
    """

    def test_a_beat_registers_a_node_until_its_ttl(self, storage: Storage) -> None:
        storage.nodes.beat("node-a", 4, T0 - 10, T0, TTL)
        assert storage.nodes.live(T0) == [NodeBeat("node-a", 4, T0 - 10, T0, T0 + TTL)], (
            "beat: a node is registered with its shard count, start, beat and expiry"
        )
        assert storage.nodes.live(T0 + TTL) == [], "live: a registration expires at now + ttl"

    def test_a_later_beat_renews_the_one_row(self, storage: Storage) -> None:
        storage.nodes.beat("node-a", 4, T0, T0, TTL)
        storage.nodes.beat("node-a", 4, T0, T0 + 2_000, TTL)
        assert storage.nodes.live(T0 + TTL) == [NodeBeat("node-a", 4, T0, T0 + 2_000, T0 + 5_000)]

    def test_a_beat_records_the_lease_driver_and_a_later_one_changes_it(
        self, storage: Storage
    ) -> None:
        storage.nodes.beat("node-a", 1, T0, T0, TTL, lease_driver="redis")
        assert [b.lease_driver for b in storage.nodes.live(T0)] == ["redis"], (
            "beat: a node is registered with the lease driver it holds its leases with"
        )
        storage.nodes.beat("node-a", 1, T0, T0 + 1_000, TTL, lease_driver="advisory")
        assert [b.lease_driver for b in storage.nodes.live(T0)] == ["advisory"]
        storage.nodes.beat("node-b", 1, T0, T0, TTL)
        assert storage.nodes.live(T0)[1].lease_driver == "row", "the default driver is row"

    def test_live_lists_the_nodes_alive_by_id(self, storage: Storage) -> None:
        for name, at in (("node-c", T0), ("node-a", T0 + 1_000), ("node-b", T0 - 2_000)):
            storage.nodes.beat(name, 2, at, at, TTL)
        alive = [b.node_id for b in storage.nodes.live(T0 + 1_500)]
        assert alive == ["node-a", "node-c"], "live: only unexpired nodes, ordered by node id"

    def test_leave_deregisters_that_node_only(self, storage: Storage) -> None:
        storage.nodes.beat("node-a", 2, T0, T0, TTL)
        storage.nodes.beat("node-b", 2, T0, T0, TTL)
        storage.nodes.leave("node-a")
        storage.nodes.leave("never-registered")
        assert [b.node_id for b in storage.nodes.live(T0)] == ["node-b"]

    def test_prune_deletes_only_what_expired_before(self, storage: Storage) -> None:
        storage.nodes.beat("old", 2, T0, T0, TTL)
        storage.nodes.beat("new", 2, T0, T0 + 10_000, TTL)
        assert storage.nodes.prune(T0 + TTL + 1) == 1
        assert storage.nodes.prune(T0 + TTL + 1) == 0
        assert [b.node_id for b in storage.nodes.live(T0 + 10_000)] == ["new"]
