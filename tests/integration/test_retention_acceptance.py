"""Acceptance 4 of the observability issue: a million old runs are pruned in batches while a
real daemon keeps dispatching every-second schedules on time (lateness p99 under 100 ms);
a legal-hold tenant loses nothing; open runs are untouched.

Real clock, a real `vortos run` process (daemon and consumers); the sweep is the built-in
sweeper's fire, triggered here and run by that process's consumer on one of its worker threads.
The daemon runs in its own process, not in pytest's: the suite's heap would make pytest's GC
pauses part of the measurement.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import apsw
import pytest

from engine import Engine, IntervalTrigger, RunState, ScheduleSpec, open_engine
from engine.backends.sqlite.connection import scalar
from engine.domain.timeutil import DAY_MS
from engine.retention import SWEEP_SCHEDULE, SWEEP_TENANT, RetentionSettings, retention_schedule
from tests.helpers import sqlite_pool
from tests.integration.processes import Daemon, wait_for

OLD_RUNS = 1_000_000  # tenant acme, completed 40 days ago: every one goes
HELD_EVERY = 101  # every 101st old run is the legal-hold tenant's instead
OPEN_RUNS = 100  # as old, but dispatched or running: untouched
LIVE_SCHEDULES = 50  # every second, tenant live, dispatched throughout
LATENESS_P99_MS = 100


def fill(db: Path, old_at: int) -> None:
    """The old history, written in SQL (the engine would take minutes): runs with their
    completed fires, the legal-hold tenant's interleaved, then open runs whose fires no
    consumer here runs (their command is registered elsewhere)."""
    total = OLD_RUNS + OLD_RUNS // (HELD_EVERY - 1)
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?1) "
        "INSERT INTO runs (id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
        "kind, state, dispatched_at, node_id, attempts, finished_at, started_at, consumer) "
        "SELECT x, CASE WHEN x % ?2 = 0 THEN 'held' ELSE 'acme' END, 'gone', 'old-job', "
        "'gone@' || x, ?3 + x, ?3 + x, 'scheduled', 'completed', ?3 + x, 'old-node', 1, "
        "?3 + x + 5, ?3 + x + 1, 'old-consumer' FROM n",
        (total, HELD_EVERY, old_at),
    )
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?1) "
        "INSERT INTO runs (id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
        "kind, state, dispatched_at, node_id) "
        "SELECT ?2 + x, 'acme', 'gone', 'old-job', 'open@' || x, ?3 + x, ?3 + x, 'scheduled', "
        "CASE WHEN x % 2 = 0 THEN 'running' ELSE 'dispatched' END, ?3 + x, 'old-node' FROM n",
        (OPEN_RUNS, total, old_at),
    )
    conn.execute(
        "INSERT INTO fire_queue (run_id, tenant, schedule_id, slot_at, command, payload, "
        "available_at, created_at, attempts, completed_at) "
        "SELECT id, tenant, schedule_id, slot_at, "
        "CASE WHEN state = 'completed' THEN 'noop' ELSE 'registered-elsewhere' END, '{}', "
        "due_at, dispatched_at, attempts, CASE WHEN state = 'completed' THEN finished_at END "
        "FROM runs"
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def count(engine: Engine, sql: str, *args: object) -> int:
    return int(scalar(sqlite_pool(engine).get(), sql, args))


def p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, (len(ordered) * 99) // 100)]


@pytest.mark.slow
def test_a_million_old_runs_are_pruned_while_dispatch_stays_on_time(tmp_path: Path) -> None:
    db = tmp_path / "big.db"
    with open_engine(db) as engine:
        old_at = engine.clock.now_ms() - 40 * DAY_MS
        engine.service.sync_static([retention_schedule()], actor="deploy")
        engine.service.set_retention("held", 0, actor="counsel", reason="litigation hold")
        for n in range(LIVE_SCHEDULES):
            engine.service.create(
                ScheduleSpec(
                    name=f"tick-{n}",
                    trigger=IntervalTrigger(1000, 0),
                    command="noop",
                    tenant="live",
                ),
                actor="ops",
            )
    fill(db, old_at)

    with open_engine(db) as engine:
        held_before = count(engine, "SELECT count(*) FROM runs WHERE tenant = 'held'")
        held_fires_before = count(engine, "SELECT count(*) FROM fire_queue WHERE tenant = 'held'")
        assert held_before == OLD_RUNS // (HELD_EVERY - 1)
        daemon = Daemon(db, "n1", tmp_path)
        try:
            wait_for(
                lambda: (
                    count(engine, "SELECT count(*) FROM runs WHERE tenant = 'live'")
                    >= 2 * LIVE_SCHEDULES
                ),
                60,
                "the daemon to dispatch the live schedules twice",
            )
            sweep = engine.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="ops")
            deadline = time.monotonic() + 45
            while True:
                run = engine.storage.runs.get(sweep.id)
                assert run is not None
                if run.state is RunState.COMPLETED:
                    break
                assert run.state in (RunState.DISPATCHED, RunState.RUNNING), run.error
                assert time.monotonic() < deadline, "the sweep did not finish in 45 s"
                time.sleep(0.2)
            time.sleep(1.5)  # and after it
        finally:
            assert daemon.terminate() == 0, daemon.log

        assert run.started_at is not None
        assert run.finished_at is not None
        lateness = [
            r[0]
            for r in sqlite_pool(engine)
            .get()
            .execute(
                "SELECT dispatched_at - due_at FROM runs WHERE tenant = 'live' "
                "AND dispatched_at BETWEEN ? AND ?",
                (run.started_at, run.finished_at),
            )
        ]
        seconds = (run.finished_at - run.started_at) / 1000
        assert len(lateness) >= LIVE_SCHEDULES * int(seconds), (len(lateness), seconds)
        assert p99(lateness) < LATENESS_P99_MS, (p99(lateness), max(lateness), seconds)

        old_acme = "SELECT count(*) FROM runs WHERE tenant = 'acme' AND id <= ?"
        assert count(engine, old_acme, OLD_RUNS + held_before) == 0
        assert count(engine, "SELECT count(*) FROM runs WHERE tenant = 'held'") == held_before
        assert (
            count(engine, "SELECT count(*) FROM fire_queue WHERE tenant = 'held'")
            == held_fires_before
        )
        assert (
            count(
                engine,
                "SELECT count(*) FROM runs r JOIN fire_queue f ON f.run_id = r.id "
                "WHERE r.tenant = 'acme' AND r.state IN ('dispatched', 'running') "
                "AND f.completed_at IS NULL AND r.slot_key LIKE 'open@%'",
            )
            == OPEN_RUNS
        )
        report = json.loads(run.output or "{}")
        assert (report["runs"], report["fires"], report["truncated"]) == (OLD_RUNS, OLD_RUNS, False)
        assert report["batches"] >= OLD_RUNS // RetentionSettings().batch_size
