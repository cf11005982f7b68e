"""Hand-over on PostgreSQL without waiting out the TTL (acceptance 2 of issue 19): a leader
stopped with SIGTERM releases its lease and the release wakes the standbys (NOTIFY), so the
next slot is dispatched by a standby within 1 s; a SIGKILLed advisory leader's lock is freed
as soon as the server sees its socket close, and a standby takes it within about 2 s.

The TTL is the default 15 s: a standby that only looked again at half of it would take 7.5 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.pg_nodes import (
    Reader,
    assert_every_slot_once,
    every_second,
    fresh_database,
    start_node,
    wait_dispatched_through,
)
from tests.integration.processes import Daemon, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def db() -> Iterator[tuple[str, Reader]]:
    with fresh_database() as opened:
        yield opened


def _two_nodes(url: str, reader: Reader, tmp_path: Path, driver: str) -> tuple[Daemon, Daemon]:
    a = start_node(url, "a", tmp_path, ttl="15s", driver=driver)
    wait_for(lambda: reader.holder() == "a", 30, "a to lead")
    b = start_node(url, "b", tmp_path, ttl="15s", driver=driver)
    wait_for(lambda: "vortos b on" in b.log, 30, "b to stand by")
    wait_for(lambda: reader.runs_by("a") >= 2, 30, "a to dispatch")
    return a, b


def _released_at(reader: Reader) -> int:
    """The server instant the lease row stopped naming a (polled closely)."""
    wait_for(lambda: reader.holder() != "a", 30, "a to give the lease up", every=0.005)
    return reader.now_ms()


@pytest.mark.parametrize("driver", ["row", "advisory"])
def test_a_sigterm_hand_over_takes_under_a_second(
    db: tuple[str, Reader], tmp_path: Path, driver: str
) -> None:
    url, reader = db
    firsts = every_second(url, reader, count=5)
    a, b = _two_nodes(url, reader, tmp_path, driver)
    try:
        a.process.terminate()
        released = _released_at(reader)
        assert a.process.wait(20) == 0, a.log
        wait_for(lambda: reader.first_dispatch_by("b", released - 1) is not None, 10, "b")
        took = reader.first_dispatch_by("b", released - 1)
        assert took is not None
        assert took - released <= 1_000, f"b dispatched {took - released} ms after the release"
        window_end = (reader.now_ms() // 1000 + 2) * 1000
        wait_dispatched_through(reader, firsts, window_end)
        assert_every_slot_once(reader, firsts, window_end)
    finally:
        a.terminate()
        b.terminate()


def test_a_killed_advisory_leader_is_replaced_as_soon_as_the_server_notices(
    db: tuple[str, Reader], tmp_path: Path
) -> None:
    url, reader = db
    firsts = every_second(url, reader, count=5)
    a, b = _two_nodes(url, reader, tmp_path, "advisory")
    try:
        killed_at = reader.now_ms()
        a.kill()
        wait_for(lambda: reader.holder() == "b", 10, "b to lead", every=0.01)
        lease = reader.lease()
        assert lease is not None
        assert lease[1] - killed_at <= 2_000, f"b led {lease[1] - killed_at} ms after the kill"
        wait_for(lambda: reader.first_dispatch_by("b", killed_at) is not None, 10, "b")
        took = reader.first_dispatch_by("b", killed_at)
        assert took is not None
        assert took - killed_at <= 2_500, f"b dispatched {took - killed_at} ms after the kill"
        window_end = (reader.now_ms() // 1000 + 2) * 1000
        wait_dispatched_through(reader, firsts, window_end)
        assert_every_slot_once(reader, firsts, window_end)
    finally:
        b.terminate()
