"""The share-out of lease shards among live nodes (engine.runtime.nodes.share_out): every
shard has one node, counts differ by at most one, and every node computes the same answer."""

from __future__ import annotations

import random

import pytest

from engine.runtime.nodes import share_out


@pytest.mark.parametrize("nodes", range(1, 9))
@pytest.mark.parametrize("shards", [1, 2, 3, 4, 6, 7, 16, 64])
def test_every_shard_has_one_node_and_counts_stay_within_one(nodes: int, shards: int) -> None:
    ids = [f"host-{i}:{1000 + i}" for i in range(nodes)]
    owned = share_out(ids, shards)
    assert set(owned) == set(ids)
    every = sorted(s for shares in owned.values() for s in shares)
    assert every == list(range(shards))  # each shard once
    counts = [len(shares) for shares in owned.values()]
    assert max(counts) - min(counts) <= 1, owned


def test_the_answer_does_not_depend_on_the_order_the_nodes_were_read_in() -> None:
    ids = [f"n{i}" for i in range(5)]
    expected = share_out(ids, 16)
    chooser = random.Random(3)
    for _ in range(20):
        chooser.shuffle(ids)
        assert share_out(ids, 16) == expected
    assert share_out([*ids, "n0"], 16) == expected  # a node read twice is one node


def test_three_nodes_six_shards_lead_two_each() -> None:
    assert sorted(len(s) for s in share_out(["a", "b", "c"], 6).values()) == [2, 2, 2]


def test_a_leaving_node_moves_little_more_than_its_own_shards() -> None:
    ids = [f"n{i}" for i in range(4)]
    before = share_out(ids, 64)
    after = share_out(ids[:-1], 64)
    moved = sum(
        1 for node, shards in after.items() for s in shards if s not in before.get(node, [])
    )
    # n3 had 16; the rest must take them, and the caps may move a few more.
    assert 16 <= moved <= 24, moved


def test_no_nodes_no_owners_and_no_shards_refused() -> None:
    assert share_out([], 4) == {}
    with pytest.raises(ValueError, match="at least one shard"):
        share_out(["a"], 0)
