"""A leader frozen (SIGSTOP) inside its dispatch transaction, on every lease driver: a standby
takes over within TTL + 1 s, the thawed leader dispatches nothing, no slot is lost or doubled
(acceptance 1 of issue 19). And what a wait must not do: a standby that waited for the lease
row writes a live lease, and a dispatch that waited records how late it really was."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engine.ports.lease import LEADER_LEASE
from tests.integration.pg_nodes import (
    DRIVERS,
    Reader,
    assert_every_slot_once,
    every_second,
    freeze_inside_dispatch,
    freeze_outside_dispatch,
    fresh_database,
    start_node,
    wait_dispatched_through,
)
from tests.integration.processes import wait_for

pytestmark = pytest.mark.slow

TTL_MS = 3_000


@pytest.fixture
def db() -> Iterator[tuple[str, Reader]]:
    with fresh_database() as opened:
        yield opened


@pytest.mark.parametrize("where", ["inside", "outside"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_frozen_leader_is_replaced_within_the_ttl_and_dispatches_nothing_after(
    db: tuple[str, Reader], tmp_path: Path, driver: str, where: str
) -> None:
    """Frozen inside its dispatch transaction (the lease row locked) or outside it (between
    transactions; on the advisory driver its session still holds the lock)."""
    url, reader = db
    firsts = every_second(url, reader, count=20)
    a = start_node(url, "a", tmp_path, ttl="3s", driver=driver)
    b = None
    try:
        wait_for(lambda: reader.holder() == "a", 30, "a to lead")
        b = start_node(url, "b", tmp_path, ttl="3s", driver=driver)
        wait_for(lambda: "vortos b on" in b.log, 30, "b to stand by")
        freeze = freeze_inside_dispatch if where == "inside" else freeze_outside_dispatch
        frozen_at = freeze(reader, a)
        runs_of_a = reader.runs_by("a")
        try:
            wait_for(
                lambda: reader.first_dispatch_by("b", frozen_at) is not None,
                30,
                "b to dispatch while a is frozen",
            )
            took = reader.first_dispatch_by("b", frozen_at)
            assert took is not None
            assert took - frozen_at <= TTL_MS + 1_000, (
                f"b dispatched {took - frozen_at} ms after a froze (TTL {TTL_MS} ms)\n{b.log}"
            )
            # Still frozen: it holds no lock anyone waits on (the server ended its session).
            assert not reader.holds_lease_row_lock(a.pid)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        thawed_at = reader.now_ms()
        window_end = (thawed_at // 1000 + 4) * 1000
        wait_dispatched_through(reader, firsts, window_end)
        assert reader.holder() == "b"
        assert reader.runs_by("a") == runs_of_a, "the thawed leader dispatched"
        assert_every_slot_once(reader, firsts, window_end)
        assert a.process.poll() is None, a.log  # it lives on, as a standby
    finally:
        a.terminate()
        if b is not None:
            b.terminate()


def _hold_lease_row(
    url: str, locked: threading.Event, hold_s: float, mode: str, released: list[int] | None = None
) -> None:
    """Lock the lease row (FOR `mode`) for `hold_s` seconds; `released` gets the server instant
    just before the commit that frees it."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(f"SELECT 1 FROM leases WHERE key = %s FOR {mode}", (LEADER_LEASE,))
        locked.set()
        threading.Event().wait(hold_s)
        if released is not None:
            row = conn.execute(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
            ).fetchone()
            assert row is not None
            released.append(int(row[0]))


def test_a_standby_that_waited_for_the_lease_row_writes_a_live_lease(
    db: tuple[str, Reader], tmp_path: Path
) -> None:
    url, reader = db
    # An expired lease whose row another transaction holds (as a frozen leader's would).
    now = reader.now_ms()
    reader.conn.execute(
        "INSERT INTO leases (key, token, holder, acquired_at, renewed_at, expires_at) "
        "VALUES (%s, 'ghost', 'ghost', %s, %s, %s)",
        (LEADER_LEASE, now - 10_000, now - 10_000, now - 5_000),
    )
    locked = threading.Event()
    released: list[int] = []
    # Held longer than the TTL: a lease dated from before the wait is expired when granted.
    holder = threading.Thread(target=_hold_lease_row, args=(url, locked, 8.0, "SHARE", released))
    holder.start()
    assert locked.wait(10)
    b = start_node(url, "b", tmp_path, ttl="3s")
    try:
        wait_for(
            lambda: (
                reader.one(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE NOT l.granted AND a.application_name LIKE %s",
                    (f"vortos %:{b.pid}",),
                )
                > 0
            ),
            30,
            "b's upsert to wait for the row",
        )
        holder.join()
        granted_at = released[0]
        wait_for(lambda: reader.holder() == "b", 10, "b to lead")
        lease = reader.lease()
        assert lease is not None
        assert lease[2] > granted_at + TTL_MS // 2, (lease, granted_at)
        every_second(url, reader)
        wait_for(lambda: reader.runs_by("b") >= 3, 30, "b to dispatch")
        assert "lost the lease" not in b.log, b.log
    finally:
        holder.join()
        b.terminate()


def test_a_dispatch_that_waited_records_its_true_lateness(
    db: tuple[str, Reader], tmp_path: Path
) -> None:
    url, reader = db
    every_second(url, reader)
    a = start_node(url, "a", tmp_path, ttl="15s", args=("--lookahead", "0s"))
    try:
        wait_for(lambda: reader.runs_by("a") >= 2, 30, "a to dispatch")
        locked = threading.Event()
        # FOR UPDATE: the dispatch's FOR SHARE of the lease row waits for it.
        holder = threading.Thread(target=_hold_lease_row, args=(url, locked, 4.0, "UPDATE"))
        holder.start()
        assert locked.wait(10)
        stalled_from = reader.now_ms()
        holder.join()
        wait_for(
            lambda: reader.first_dispatch_by("a", stalled_from + 3_000) is not None,
            20,
            "a to dispatch after the stall",
        )
        late = reader.one(
            "SELECT max(dispatched_at - due_at) FROM runs WHERE dispatched_at > %s",
            (stalled_from,),
        )
        assert late >= 3_000, f"the stalled batch recorded {late} ms late"
        logged = [int(m) for m in re.findall(r"late (\d+) ms", a.log)]
        assert max(logged) >= 3_000, a.log
    finally:
        a.terminate()
