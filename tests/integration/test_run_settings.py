"""`vortos run` and `vortos consume` in real processes: settings reach them (file < environment
< flags), `vortos run` installs the retention sweep without disabling an app's schedules, and a
process with metrics reports the dead-man detector's verdicts (acceptance 5: a schedule whose
daemon stopped for three periods is overdue in the metric too)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import IntervalTrigger, ManualClock, ScheduleSpec, open_engine
from engine.domain.timeutil import MINUTE_MS
from engine.retention.command import SWEEP_SCHEDULE, SWEEP_TENANT
from tests.conftest import cli_env
from tests.helpers import settle
from tests.integration.processes import wait_for
from tests.integration.test_metrics_endpoint import free_port, scrape, total


def start(db: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(env),
    )


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return out


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def started_line(db: Path, out_so_far: list[str], process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        if not line:
            raise AssertionError("vortos exited:\n" + "".join(out_so_far))
        out_so_far.append(line)
        if " on " in line and str(db) in line:
            return line


def test_settings_from_the_file_and_the_environment_reach_vortos_run(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "vortos.db"
    config = tmp_path / "vortos.toml"
    config.write_text('[vortos]\nlease_ttl = "40s"\nconsumers = 3\n')
    env = {"VORTOS_CONFIG": str(config), "VORTOS_CONSUMERS": "2"}
    process = start(db, "run", env=env)
    processes.append(process)
    seen: list[str] = []
    line = started_line(db, seen, process)
    assert "lease ttl 40s" in line  # from the file
    assert "2 consumer thread(s)" in line  # the environment beats the file
    stop(process)
    flagged = start(db, "run", "--consumers", "5", env=env)
    processes.append(flagged)
    assert "5 consumer thread(s)" in started_line(db, [], flagged)  # a flag beats both
    stop(flagged)


def test_vortos_run_installs_the_retention_sweep_and_keeps_an_apps_schedules(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "vortos.db"
    app = tmp_path / "app"
    app.mkdir()
    (app / "jobs.py").write_text(
        "from engine import schedulable, scheduled\n\n"
        "@scheduled(every='1h')\n@schedulable\ndef hourly() -> None:\n    pass\n"
    )
    env = {"PYTHONPATH": str(app)}
    with_app = start(db, "--app", "jobs", "run", env=env)
    processes.append(with_app)
    started_line(db, [], with_app)
    stop(with_app)
    without = start(db, "run")  # the app not given: its schedule must not be disabled
    processes.append(without)
    started_line(db, [], without)
    stop(without)
    with open_engine(db, create=False, readonly=True) as engine:
        sweep = engine.storage.schedules.find_by_name(SWEEP_TENANT, SWEEP_SCHEDULE)
        hourly = engine.storage.schedules.find_by_name("default", "hourly")
    assert sweep is not None
    assert sweep.status.value == "active"
    assert hourly is not None
    assert hourly.status.value == "active"


def test_a_schedule_whose_daemon_stopped_for_three_periods_is_overdue_in_the_metric(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db) as engine:
        now = engine.clock.now_ms()
    created = now - 3 * MINUTE_MS - 5_000
    with open_engine(db, clock=ManualClock(created)) as engine:
        engine.service.create(
            ScheduleSpec("forgotten", IntervalTrigger(MINUTE_MS, created), "noop"),
            actor="setup",
        )
        settle(engine.daemon(node_id="gone"))  # it fired once; then its daemon stopped
    port = free_port()
    # Consumers only: no daemon dispatches, as when the scheduler itself is down.
    consumer = start(db, "consume", "--metrics-port", str(port))
    processes.append(consumer)

    def overdue() -> bool:
        text = scrape(port)
        return total(text, "vortos_deadman_verdict", schedule="forgotten", verdict="overdue") == 1.0

    wait_for(overdue, 30, "the dead-man verdict of 'forgotten' in the metrics")
    stop(consumer)
