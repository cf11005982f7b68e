"""Exactly once across real processes that are SIGKILLed at random (acceptance 2 and 3)."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from engine import IntervalTrigger, MisfireKind, MisfirePolicy, ScheduleSpec, open_engine
from engine.domain.timeutil import SECOND_MS
from tests.integration.processes import Daemon, wait_for

pytestmark = pytest.mark.slow

SCHEDULES = 50
RUN_FOR_S = 11.0
KILL_EVERY_S = 2.0


def create_schedules(db: Path, count: int, anchor_ms: int) -> None:
    with open_engine(db) as engine:
        for i in range(count):
            engine.service.create(
                ScheduleSpec(
                    name=f"s{i:03d}",
                    trigger=IntervalTrigger(SECOND_MS, anchor_ms),
                    command="noop",
                    misfire=MisfirePolicy(MisfireKind.EACH),
                ),
                actor="test",
            )


def read(db: Path, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(sql, args).fetchall()


def leader(db: Path) -> str | None:
    rows = read(db, "SELECT holder FROM leases WHERE expires_at > ?", (int(time.time() * 1000),))
    return str(rows[0][0]) if rows else None


def test_every_slot_lands_exactly_once_while_daemons_are_killed(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    anchor = (int(time.time()) + 2) * 1000
    create_schedules(db, SCHEDULES, anchor)
    chooser = random.Random(2026)
    generation = 0
    daemons = [Daemon(db, f"p{i}-g0", tmp_path) for i in range(4)]
    try:
        started = time.monotonic()
        while time.monotonic() - started < RUN_FOR_S:
            time.sleep(KILL_EVERY_S * chooser.uniform(0.75, 1.25))
            generation += 1
            # Half the time the leader itself, so failover is exercised, not just standbys.
            current = leader(db)
            pick = next((d for d in daemons if d.node_id == current), None)
            victim = (
                pick if pick is not None and chooser.random() < 0.5 else chooser.choice(daemons)
            )
            victim.kill()
            index = daemons.index(victim)
            daemons[index] = Daemon(db, f"p{index}-g{generation}", tmp_path)
        window_end = int(time.time() * 1000)
        expected_slots = (window_end - anchor) // SECOND_MS + 1
        wait_for(
            lambda: (
                read(db, "SELECT count(*) FROM runs WHERE slot_at <= ?", (window_end,))[0][0]
                == SCHEDULES * expected_slots
            ),
            timeout=15,
            what="every slot of the window to be dispatched",
        )
    finally:
        for daemon in daemons:
            daemon.terminate()

    per_slot = read(
        db,
        "SELECT schedule_id, slot_at, count(*) FROM runs WHERE slot_at <= ? "
        "GROUP BY schedule_id, slot_at",
        (window_end,),
    )
    assert all(count == 1 for _, _, count in per_slot)
    by_schedule: dict[object, set[object]] = {}
    for sid, slot_at, _ in per_slot:
        by_schedule.setdefault(sid, set()).add(slot_at)
    grid = {anchor + k * SECOND_MS for k in range(expected_slots)}
    assert len(by_schedule) == SCHEDULES
    assert all(slots == grid for slots in by_schedule.values())
    orphans = read(
        db,
        "SELECT count(*) FROM runs r LEFT JOIN fire_queue f ON f.run_id = r.id "
        "WHERE f.run_id IS NULL",
    )[0][0]
    doubles = read(
        db,
        "SELECT count(*) FROM (SELECT run_id FROM fire_queue GROUP BY run_id HAVING count(*) > 1)",
    )[0][0]
    assert orphans == 0
    assert doubles == 0
    nodes = {row[0] for row in read(db, "SELECT DISTINCT node_id FROM runs")}
    assert len(nodes) > 1, "no failover happened: the test did not exercise what it claims"


def test_a_standby_dispatches_the_next_slot_within_ttl_plus_one_second(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    ttl_ms = 2_000
    anchor = (int(time.time()) + 1) * 1000
    create_schedules(db, 1, anchor)
    daemons = [Daemon(db, f"n{i}", tmp_path, lease_ttl="2s") for i in range(3)]
    try:
        wait_for(
            lambda: leader(db) is not None and read(db, "SELECT count(*) FROM runs")[0][0] >= 2,
            timeout=20,
            what="a leader dispatching",
        )
        holder = leader(db)
        victim = next(d for d in daemons if d.node_id == holder)
        victim.kill()
        killed_at = int(time.time() * 1000)
        wait_for(
            lambda: (
                read(
                    db,
                    "SELECT count(*) FROM runs WHERE node_id != ? AND slot_at > ?",
                    (holder, killed_at),
                )[0][0]
                > 0
            ),
            timeout=10,
            what="a standby to dispatch",
        )
        first_after = read(db, "SELECT min(slot_at) FROM runs WHERE slot_at > ?", (killed_at,))[0][
            0
        ]
        taken_over = read(db, "SELECT dispatched_at FROM runs WHERE slot_at = ?", (first_after,))[
            0
        ][0]
        assert isinstance(taken_over, int)
        assert taken_over - killed_at <= ttl_ms + 1_000
    finally:
        for daemon in daemons:
            daemon.terminate()


def test_sigterm_releases_the_lease_and_exits_zero(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    create_schedules(db, 1, (int(time.time()) + 1) * 1000)
    daemon = Daemon(db, "solo", tmp_path, lease_ttl="30s")
    wait_for(lambda: leader(db) == "solo", timeout=20, what="the daemon to lead")
    assert daemon.terminate() == 0
    assert read(db, "SELECT count(*) FROM leases")[0][0] == 0
    assert "released the lease" in daemon.log
