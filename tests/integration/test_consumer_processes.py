"""Real consumer processes: many of them draining one queue, and one killed mid-command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import (
    Engine,
    IntervalTrigger,
    OverlapPolicy,
    RunState,
    ScheduleSpec,
    builtin_commands,
    load_app,
    open_engine,
)
from engine.domain.timeutil import SECOND_MS
from engine.ports import RunQuery
from tests.conftest import cli_env
from tests.integration.processes import wait_for

APP = '''
"""Commands for the consumer process tests: each run appends one line to a journal."""

import os
import time

from engine import FireContext, schedulable

JOURNAL = os.environ["VORTOS_TEST_JOURNAL"]


def note(text: str) -> None:
    # One write of a short line with O_APPEND: lines from processes never interleave.
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\\n").encode())
    finally:
        os.close(fd)


@schedulable("mark")
def mark(*, fire: FireContext) -> None:
    note(f"ran {fire.run_id} {fire.slot_key} {os.getpid()}")


@schedulable("slow-first")
def slow_first(*, fire: FireContext) -> str:
    note(f"start {fire.run_id} attempt {fire.attempt} {os.getpid()}")
    if fire.attempt == 1:
        time.sleep(60)  # killed long before this ends
    note(f"done {fire.run_id} attempt {fire.attempt} {os.getpid()}")
    return f"finished on attempt {fire.attempt}"
'''


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "consumer_app.py").write_text(textwrap.dedent(APP))
    return folder


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.txt"


class Consumer:
    """One `vortos consume` process."""

    def __init__(self, db: Path, app_dir: Path, journal: Path, name: str, *extra: str) -> None:
        self.name = name
        self.log_path = app_dir.parent / f"{name}.log"
        env = cli_env(
            {
                "VORTOS_TEST_JOURNAL": str(journal),
                "PYTHONPATH": os.pathsep.join([str(app_dir), os.getcwd()]),
            }
        )
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vortos_tui.cli",
                    "--db",
                    str(db),
                    "--app",
                    "consumer_app",
                    "consume",
                    "--node-id",
                    name,
                    *extra,
                ],
                cwd=app_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def prepared(db_path: Path, app_dir: Path, journal: Path) -> Iterator[Engine]:
    """An engine on the test database that knows the app's commands (to create schedules)."""
    sys.path.insert(0, str(app_dir))
    os.environ["VORTOS_TEST_JOURNAL"] = str(journal)
    try:
        app = load_app("consumer_app")
        with open_engine(db_path, commands=app.register_into(builtin_commands())) as engine:
            yield engine
    finally:
        sys.path.remove(str(app_dir))
        sys.modules.pop("consumer_app", None)
        os.environ.pop("VORTOS_TEST_JOURNAL", None)


def test_four_consumer_processes_run_each_of_2000_fires_exactly_once(
    prepared: Engine, db_path: Path, app_dir: Path, journal: Path
) -> None:
    engine = prepared
    now = engine.clock.now_ms() // 1000 * 1000
    engine.service.create(
        ScheduleSpec(
            name="marks",
            trigger=IntervalTrigger(SECOND_MS, now - 2000 * SECOND_MS),
            command="mark",
            overlap=OverlapPolicy.ALLOW,  # the 2,000 slots may run side by side
        ),
        actor="test",
    )
    engine.service.pause("marks", actor="test")  # only the backfill below fires
    consumers = [Consumer(db_path, app_dir, journal, f"c{n}") for n in range(4)]
    try:
        # Each one up (its stop signals handled) before there is anything to drain: stopped
        # while still starting, a process would die of the signal itself.
        wait_for(
            lambda: all(f"consumer {c.name} on " in c.log for c in consumers),
            timeout=120,
            what="every consumer to start",
            every=0.2,
        )
        # Fires only once all four are up, so that they share them.
        report = engine.service.backfill(
            "marks", start_ms=now - 2000 * SECOND_MS, end_ms=now, actor="test"
        )
        assert report.dispatched == 2000
        wait_for(
            lambda: engine.storage.fire_queue.depth() == 0,
            timeout=120,
            what="the queue to drain",
            every=0.2,
        )
    finally:
        codes = [c.stop() for c in consumers]
    assert codes == [0, 0, 0, 0]
    lines = journal.read_text().splitlines()
    ran = [int(line.split()[1]) for line in lines]
    assert len(ran) == 2000
    assert len(set(ran)) == 2000  # nothing ran twice
    runs = engine.service.runs(RunQuery(limit=10_000))
    assert {r.state for r in runs} == {RunState.COMPLETED}
    assert {r.id for r in runs} == set(ran)  # the ledger agrees with what ran
    assert all(r.attempts == 1 for r in runs)
    busy = {line.split()[3] for line in lines}
    assert len(busy) >= 2  # the work was shared


def test_a_consumer_killed_mid_command_loses_nothing_and_runs_it_again_after_the_ttl(
    prepared: Engine, db_path: Path, app_dir: Path, journal: Path
) -> None:
    engine = prepared
    engine.service.create(
        ScheduleSpec(
            name="slow", trigger=IntervalTrigger(3600 * SECOND_MS, 0), command="slow-first"
        ),
        actor="test",
    )
    engine.service.pause("slow", actor="test")
    run = engine.service.trigger("slow", actor="test")
    doomed = Consumer(db_path, app_dir, journal, "doomed", "--claim-ttl", "2s")
    try:
        wait_for(
            lambda: journal.exists() and "start" in journal.read_text(),
            timeout=30,
            what="the command to start",
        )
    finally:
        doomed.kill()
    survivor = Consumer(db_path, app_dir, journal, "survivor", "--claim-ttl", "2s")
    try:
        wait_for(
            lambda: engine.service.runs(RunQuery())[0].state is RunState.COMPLETED,
            timeout=30,
            what="the run to complete on the survivor",
        )
    finally:
        assert survivor.stop() == 0
    (done,) = engine.service.runs(RunQuery())
    assert done.id == run.id
    assert done.attempts == 2
    assert done.abandoned == 1
    assert done.consumer == "survivor"
    assert done.output == "finished on attempt 2"
    fire = engine.storage.fire_queue.get(run.id)
    assert fire is not None
    assert fire.abandoned_count == 1
    assert fire.last_abandoned_by == "doomed"
    assert fire.completed_at is not None
    lines = journal.read_text().splitlines()
    assert [line.rsplit(" ", 1)[0] for line in lines] == [
        f"start {run.id} attempt 1",
        f"start {run.id} attempt 2",
        f"done {run.id} attempt 2",
    ]
