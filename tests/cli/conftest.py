"""A seeded database, built once through the engine's API and copied into each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import (
    CronTrigger,
    IntervalTrigger,
    ManualClock,
    MissingHour,
    RepeatedHour,
    ScheduleSpec,
    open_engine,
)
from tests.cli.support import checkpoint, copy_database, table_count
from tests.conftest import T0

MINUTE_MS = 60_000


def build_seeded_database(path: Path) -> None:
    """Three schedules in two tenants, and a few minutes of dispatched runs."""
    clock = ManualClock(T0)
    with open_engine(path, clock=clock) as engine:
        service = engine.service
        for tenant in ("default", "acme"):
            service.create(
                ScheduleSpec(
                    name="heartbeat",
                    trigger=IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS),
                    command="noop",
                    tenant=tenant,
                ),
                actor="seed",
            )
        service.create(
            ScheduleSpec(
                name="nightly-report",
                trigger=CronTrigger("30 2 * * *", RepeatedHour.FIRST, MissingHour.SHIFT),
                command="echo",
                payload={"to": "ops@example.com"},
                timezone="Europe/Berlin",
                metadata={"owner": "ops"},
            ),
            actor="seed",
        )
        daemon = engine.daemon(node_id="seed-node", lease_ttl_ms=3_600_000)
        daemon.step()  # takes the lease
        for _ in range(3):
            clock.advance(60)
            daemon.step()
        daemon.release()


@pytest.fixture(scope="session")
def seed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seed") / "template.db"
    build_seeded_database(path)
    checkpoint(path)
    assert not path.with_name("template.db-wal").exists()
    assert table_count(path, "schedules") == 3
    assert table_count(path, "runs") >= 6
    return path


@pytest.fixture
def seeded_db(tmp_path: Path, seed_template: Path) -> Path:
    """This test's own copy of a database holding schedules, runs and a lease."""
    return copy_database(seed_template, tmp_path / "vortos.db")
