"""A node's Membership (engine.runtime.nodes) over a real SQLite store on a manual clock: its
share as nodes join, stop and die, the refusal of another shard count or lease driver, a node
of another count that slipped in (started at the same moment) getting no share, and the
doctor naming nodes that disagree."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.sqlite import SqliteBackend
from engine.domain.audit import KeyRing
from engine.domain.clock import ManualClock
from engine.domain.errors import InvalidInput
from engine.governance.cluster_checks import NodeShards
from engine.governance.doctor import DoctorContext, Status
from engine.runtime.nodes import Membership

T0 = 1_800_000_000_000
TTL = 3_000
SHARDS = 6


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[SqliteBackend]:
    keys = KeyRing([b"membership-test-audit-key-00001"])
    backend = SqliteBackend(tmp_path / "vortos.db", clock, audit_keys=lambda: keys)
    yield backend
    backend.close()


def member(store: SqliteBackend, clock: ManualClock, name: str, shards: int = SHARDS) -> Membership:
    joined = Membership(store.nodes, clock, name, shards, TTL)
    joined.join()
    return joined


def shares(*members: Membership) -> dict[str, list[int]]:
    return {m.node_id: [s for s in range(m.shards) if m.wants(s)] for m in members}


def test_shares_follow_joins_clean_stops_and_deaths(
    store: SqliteBackend, clock: ManualClock
) -> None:
    a = member(store, clock, "a")
    assert shares(a) == {"a": list(range(SHARDS))}  # alone: every shard
    b = member(store, clock, "b")
    c = member(store, clock, "c")
    clock.advance(a.read_every_ms / 1000)  # a's next read sees them
    got = shares(a, b, c)
    assert sorted(len(s) for s in got.values()) == [2, 2, 2], got
    assert sorted(s for ss in got.values() for s in ss) == list(range(SHARDS)), got

    c.leave()  # a clean stop: seen at the next read, a second later at most
    clock.advance(a.read_every_ms / 1000)
    got = shares(a, b)
    assert sorted(len(s) for s in got.values()) == [3, 3], got

    # b dies: a keeps beating, b's registration expires one TTL after its last beat, and
    # its shards are a's at that moment, even between reads.
    for _ in range(4):
        clock.advance(TTL / 3 / 1000)
        a.wants(0)
    assert shares(a) == {"a": list(range(SHARDS))}


def test_a_node_of_another_shard_count_is_refused_at_join(
    store: SqliteBackend, clock: ManualClock
) -> None:
    member(store, clock, "six")
    with pytest.raises(InvalidInput, match=r"started with --shards 4.*six \(--shards 6\)"):
        member(store, clock, "four", shards=4)
    assert [b.node_id for b in store.nodes.live(clock.now_ms())] == ["six"]


def test_a_node_of_another_count_that_slipped_in_gets_no_share_and_is_logged(
    store: SqliteBackend, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    six = member(store, clock, "six")
    # Registered at the same moment, before either could see the other.
    store.nodes.beat("four", 4, T0, T0, TTL)
    clock.advance(six.read_every_ms / 1000)
    with caplog.at_level(logging.ERROR, logger="vortos.nodes"):
        assert shares(six) == {"six": list(range(SHARDS))}  # every shard keeps a leader
    assert "node four runs with --shards 4" in caplog.text


def test_without_shards_every_node_contends_for_the_one_lease(
    store: SqliteBackend, clock: ManualClock
) -> None:
    one, two = member(store, clock, "one", 1), member(store, clock, "two", 1)
    assert one.wants(0)
    assert two.wants(0)
    assert [b.node_id for b in store.nodes.live(clock.now_ms())] == ["one", "two"]


def test_a_node_of_another_lease_driver_is_refused_and_the_doctor_names_one_that_slipped_in(
    store: SqliteBackend, clock: ManualClock
) -> None:
    """A row-lease node beside Redis-lease nodes: each kind believes it leads, and leadership
    flips whenever one stalls (from the attacker: doctor said PASS)."""
    Membership(store.nodes, clock, "r1", 1, TTL, lease_driver="redis").join()
    with pytest.raises(
        InvalidInput, match=r"lease_driver row, but live node\(s\) r1 \(lease_driver redis\)"
    ):
        Membership(store.nodes, clock, "p1", 1, TTL).join()
    assert [b.node_id for b in store.nodes.live(clock.now_ms())] == ["r1"]

    # One that slipped in (started at the same moment, or by a Vortos that does not refuse).
    store.nodes.beat("p1", 1, T0, T0, TTL)
    store.nodes.beat("r2", 1, T0, T0, TTL, lease_driver="redis")
    ctx = DoctorContext(storage=store, clock=clock, db=store.path)
    finding = NodeShards().run(ctx)
    assert finding.status is Status.FAIL, finding
    assert "2 different lease drivers" in finding.summary
    assert "p1: lease_driver row" in finding.detail
    assert "others: redis" in finding.detail
