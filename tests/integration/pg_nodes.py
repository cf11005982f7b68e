"""Real `vortos run` nodes on a fresh PostgreSQL schema, and the test's own view of the
database: who holds the lease, what was dispatched by whom, which locks a node's sessions
hold (the frozen-leader, hand-over and session tests)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from engine import IntervalTrigger, MisfireKind, MisfirePolicy, OverlapPolicy, ScheduleSpec
from engine.domain.timeutil import SECOND_MS
from engine.ports.lease import LEADER_LEASE
from tests.integration.processes import Daemon, wait_for
from tests.pg import REDIS_URL, fresh_schema, need_redis, pg_engine, pg_env

DRIVERS = ("row", "advisory", "redis")


class Reader:
    """The test's own view of the database, on one connection of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, args).fetchall()

    def one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        return self.rows(sql, args)[0][0]

    def now_ms(self) -> int:
        return int(self.one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"))

    def lease(self, key: str = LEADER_LEASE) -> tuple[str, int, int] | None:
        """(holder, acquired_at, expires_at) of the lease row while it is live."""
        found = self.rows(
            "SELECT holder, acquired_at, expires_at FROM leases WHERE key = %s AND expires_at > %s",
            (key, self.now_ms()),
        )
        return (str(found[0][0]), int(found[0][1]), int(found[0][2])) if found else None

    def holder(self, key: str = LEADER_LEASE) -> str | None:
        lease = self.lease(key)
        return None if lease is None else lease[0]

    def runs_by(self, node_id: str) -> int:
        return int(self.one("SELECT count(*) FROM runs WHERE node_id = %s", (node_id,)))

    def first_dispatch_by(self, node_id: str, after_ms: int) -> int | None:
        found = self.one(
            "SELECT min(dispatched_at) FROM runs WHERE node_id = %s AND dispatched_at > %s",
            (node_id, after_ms),
        )
        return None if found is None else int(found)

    def holds_lease_row_lock(self, pid: int) -> bool:
        """Whether a pool session of process `pid` (application_name 'vortos host:pid') holds
        the RowShareLock of a dispatch transaction (SELECT ... FOR SHARE) on the lease table."""
        return bool(
            self.one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.relation = 'leases'::regclass AND l.mode = 'RowShareLock' "
                "AND l.granted AND a.application_name LIKE %s",
                (f"vortos %:{pid}",),
            )
        )

    def terminate_pool_sessions(self, pid: int) -> int:
        """pg_terminate_backend on every session of process `pid` (its pool, its lease's, its
        change listener: each is named `vortos HOST:PID`); how many."""
        return len(
            self.rows(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE %s",
                (f"vortos %:{pid}",),
            )
        )

    def close(self) -> None:
        self.conn.close()


@contextmanager
def fresh_database() -> Iterator[tuple[str, Reader]]:
    """A fresh schema's URL, and the test's reader of it."""
    with fresh_schema() as url:
        opened = Reader(url)
        try:
            yield url, opened
        finally:
            opened.close()


def every_second(url: str, reader: Reader, count: int = 1) -> dict[str, int]:
    """`count` schedules firing every second (misfire each: a slot late is still fired); each
    one's first slot, as stored."""
    anchor_ms = (reader.now_ms() // 1000 - 1) * 1000
    with pg_engine(url) as engine:
        for i in range(count):
            engine.service.create(
                ScheduleSpec(
                    name=f"s{i:03d}",
                    trigger=IntervalTrigger(SECOND_MS, anchor_ms),
                    command="noop",
                    misfire=MisfirePolicy(MisfireKind.EACH),
                    overlap=OverlapPolicy.ALLOW,
                ),
                actor="test",
            )
    return {
        str(sid): int(first) for sid, first in reader.rows("SELECT id, next_slot_at FROM schedules")
    }


def start_node(
    url: str, name: str, log_dir: Path, *, ttl: str, driver: str = "row", args: tuple[str, ...] = ()
) -> Daemon:
    """`vortos run` dispatching only (no consumers: nothing but the daemon touches the rows)."""
    extra: tuple[str, ...] = ("--lease-driver", driver)
    if driver == "redis":
        need_redis()
        extra += ("--redis-url", REDIS_URL)
    return Daemon(
        url, name, log_dir, lease_ttl=ttl, args=(*extra, "--no-consume", *args), env=pg_env()
    )


def assert_every_slot_once(reader: Reader, firsts: dict[str, int], window_end: int) -> None:
    """Every schedule has each slot of its 1 s grid from its first slot to `window_end`, once."""
    for sid, first in firsts.items():
        got = [
            int(r[0])
            for r in reader.rows(
                "SELECT slot_at FROM runs WHERE schedule_id = %s AND slot_at <= %s "
                "ORDER BY slot_at",
                (sid, window_end),
            )
        ]
        want = list(range(first, window_end + 1, SECOND_MS))
        assert got == want, (
            f"schedule {sid}: missing {sorted(set(want) - set(got))[:5]}, "
            f"twice {sorted({s for s in got if got.count(s) > 1})[:5]}"
        )


def wait_dispatched_through(reader: Reader, firsts: dict[str, int], window_end: int) -> None:
    wanted = sum(len(range(f, window_end + 1, SECOND_MS)) for f in firsts.values())
    wait_for(
        lambda: (
            reader.one("SELECT count(*) FROM runs WHERE slot_at <= %s", (window_end,)) >= wanted
        ),
        60,
        f"every slot up to {window_end} to be dispatched",
    )


def freeze_inside_dispatch(reader: Reader, daemon: Daemon, deadline_s: float = 90.0) -> int:
    """SIGSTOP `daemon` while a dispatch transaction of it holds the lease row lock (seen in
    pg_locks, and still seen once it is stopped); the server instant it was frozen at.

    A dispatch transaction lasts milliseconds: the lock is watched in a tight loop and the
    process stopped the moment it shows; a stop that came too late (the transaction had
    committed) is undone and tried again."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not reader.holds_lease_row_lock(daemon.pid):
            continue
        os.kill(daemon.pid, signal.SIGSTOP)
        frozen_at = reader.now_ms()
        if reader.holds_lease_row_lock(daemon.pid):
            return frozen_at
        os.kill(daemon.pid, signal.SIGCONT)
    raise AssertionError(f"{daemon.node_id} never froze inside a dispatch transaction")


def freeze_outside_dispatch(reader: Reader, daemon: Daemon, deadline_s: float = 30.0) -> int:
    """SIGSTOP `daemon` while it holds no lease row lock (between transactions: its sessions
    idle, the advisory driver's lock still held); the server instant it was frozen at."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        os.kill(daemon.pid, signal.SIGSTOP)
        frozen_at = reader.now_ms()
        if not reader.holds_lease_row_lock(daemon.pid):
            return frozen_at
        os.kill(daemon.pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"{daemon.node_id} was always inside a dispatch transaction")
