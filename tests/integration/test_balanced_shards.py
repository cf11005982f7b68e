"""Lease shards shared out among the live nodes (engine.runtime.nodes), with real `vortos run`
processes on PostgreSQL: 3 nodes x 6 shards lead 2 each, a killed node's shards move to the
others with the counts within one and no slot lost or repeated, a node started with another
--shards is refused, and the doctor names a mismatched node (acceptance 4 of the many-machines
issue)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.processes import Daemon, wait_for
from tests.integration.test_multinode_postgres import (
    TTL_MS,
    Reader,
    assert_every_slot_once,
    create_schedules,
    node,
    shard_holders,
    wait_for_window,
)
from tests.pg import fresh_schema, pg_env

pytestmark = pytest.mark.slow

SHARDS = 6


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema() as fresh:
        yield fresh


@pytest.fixture
def reader(url: str) -> Iterator[Reader]:
    opened = Reader(url)
    yield opened
    opened.close()


def counts(reader: Reader) -> Counter[str | None]:
    return Counter(shard_holders(reader, SHARDS).values())


def balanced(reader: Reader, nodes: list[Daemon]) -> bool:
    held = counts(reader)
    share = SHARDS // len(nodes)
    return all(held[n.node_id] == share for n in nodes) and held[None] == 0


def test_three_nodes_lead_two_of_six_shards_each_and_a_killed_nodes_two_move(
    url: str, reader: Reader, tmp_path: Path
) -> None:
    firsts = create_schedules(url, reader, 30)
    nodes = [node(url, f"n{i}", tmp_path, "--shards", str(SHARDS)) for i in range(3)]
    try:
        wait_for(
            lambda: reader.one("SELECT count(*) FROM nodes") == 3, 60, "the three nodes to register"
        )
        last_start = int(reader.one("SELECT max(started_at) FROM nodes"))
        wait_for(lambda: balanced(reader, nodes), 30, "two shards led by each node")
        balanced_after = reader.now_ms() - last_start
        assert balanced_after < TTL_MS + 1_000, (balanced_after, counts(reader))
        time.sleep(1.0)
        assert balanced(reader, nodes), counts(reader)  # and it stays so

        victim = nodes.pop(1)
        moving = [i for i, h in shard_holders(reader, SHARDS).items() if h == victim.node_id]
        assert len(moving) == 2
        victim.kill()
        killed_at = reader.now_ms()
        wait_for(lambda: balanced(reader, nodes), 30, "the killed node's two shards to move")
        moved_after = reader.now_ms() - killed_at
        held = counts(reader)
        assert sorted(held[n.node_id] for n in nodes) == [3, 3], held
        # The registration expires a TTL after the last beat; the share moves at once then.
        assert moved_after < 2 * TTL_MS + 1_000, moved_after

        time.sleep(2.0)
        window_end = reader.now_ms() - 1_000
        wait_for_window(reader, firsts, window_end)
        # Every survivor dispatched its shards' schedules: the shards really spread.
        dispatchers = {r[0] for r in reader.rows("SELECT DISTINCT node_id FROM runs")}
        assert {n.node_id for n in nodes} <= dispatchers, dispatchers
    finally:
        for n in nodes:
            n.terminate()
    assert_every_slot_once(reader, firsts, window_end)


def test_a_node_with_another_shard_count_is_refused_and_the_doctor_names_mismatched_nodes(
    url: str, reader: Reader, tmp_path: Path
) -> None:
    running = node(url, "n-six", tmp_path, "--shards", str(SHARDS))
    try:
        wait_for(lambda: reader.one("SELECT count(*) FROM nodes") == 1, 60, "a node to register")
        odd = node(url, "n-four", tmp_path, "--shards", "4")
        assert odd.process.wait(60) == 2, odd.log
        said = " ".join(odd.log.split())
        assert "started with --shards 4" in said, said
        assert "n-six (--shards 6)" in said, said
        assert "Start this one with --shards 6" in said, said
        assert "Traceback" not in said
        assert reader.rows("SELECT node_id FROM nodes") == [("n-six",)]  # nothing registered

        env = {**pg_env(), "VORTOS_SHARDS": str(SHARDS)}
        assert _nodes_finding(url, env)["status"] == "pass"
        unset = _nodes_finding(url, pg_env())  # the doctor's shards setting left at 1
        assert unset["status"] == "warn", unset
        assert "set shards = 6" in unset["remediation"], unset
        # A node the CLI would refuse, as a node of an older Vortos would have registered.
        far = reader.now_ms() + 600_000
        reader.conn.execute(
            "INSERT INTO nodes (node_id, shards, started_at, heartbeat_at, expires_at) "
            "VALUES ('rogue-node', 4, %s, %s, %s)",
            (far - 600_000, far - 600_000, far),
        )
        finding = _nodes_finding(url, env)
        assert finding["status"] == "fail", finding
        assert "rogue-node: --shards 4" in finding["detail"], finding
        assert "n-six" not in finding["detail"], finding
    finally:
        running.terminate()


def test_a_stopped_nodes_shards_move_within_seconds_not_a_ttl(
    url: str, reader: Reader, tmp_path: Path
) -> None:
    # The default TTL: a registration that only expired would hold the shards 15 s.
    args = ("--shards", str(SHARDS))
    nodes = [
        Daemon(url, f"n{i}", tmp_path, lease_ttl="15s", args=args, env=pg_env()) for i in range(2)
    ]
    try:
        wait_for(lambda: balanced(reader, nodes), 60, "three shards led by each node")
        leaving = nodes.pop()
        assert leaving.terminate() == 0, leaving.log
        stopped_at = reader.now_ms()
        wait_for(lambda: balanced(reader, nodes), 30, "the survivor to lead all six")
        # Deregistered and its leases released, so seen at the survivor's next read of the
        # registry (about a second).
        moved_after = reader.now_ms() - stopped_at
        assert moved_after < 4_000, moved_after
    finally:
        for n in nodes:
            n.terminate()


def _nodes_finding(url: str, env: dict[str, str]) -> dict[str, str]:
    done = run_cli("--db", url, "doctor", "--json", env=env)
    found = [f for f in json.loads(done.stdout)["findings"] if f["check_id"] == "cluster.nodes"]
    assert len(found) == 1, done.stderr
    return dict(found[0])


def test_a_node_with_another_lease_driver_is_refused_naming_the_others(
    url: str, reader: Reader, tmp_path: Path
) -> None:
    """A row-lease node beside an advisory-lease one: each would believe it leads (from the
    attacker: leadership flipped between them and the doctor said PASS)."""
    running = node(url, "n-row", tmp_path)
    try:
        wait_for(lambda: reader.one("SELECT count(*) FROM nodes") == 1, 60, "a node to register")
        odd = node(url, "n-advisory", tmp_path, "--lease-driver", "advisory")
        assert odd.process.wait(60) == 2, odd.log
        said = " ".join(odd.log.split())
        assert "started with lease_driver advisory" in said, said
        assert "n-row (lease_driver row)" in said, said
        assert "Start this one with --lease-driver row" in said, said
        assert "Traceback" not in said
        assert reader.rows("SELECT node_id, lease_driver FROM nodes") == [("n-row", "row")]
        assert _nodes_finding(url, pg_env())["status"] == "pass"
    finally:
        running.terminate()
