"""The execution CLI's happy paths, each through real `vortos` processes on a real database file.

An app module (Python commands marked @schedulable, a static schedule marked @scheduled) is written
into the test's directory and loaded with `--app`. Background `vortos run` / `vortos consume`
processes are waited on by polling the CLI itself, always with a deadline, and stopped with
SIGTERM; a process left over by a failing test is killed at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import (
    CronTrigger,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    ScheduleSpec,
    open_engine,
)
from engine.domain.timeutil import MINUTE_MS, iso_local
from tests.cli.support import assert_clean_error, cli_json, db_state, no_traceback
from tests.conftest import T0, CliResult, cli_env, run_cli
from tests.helpers import fired_slots, settle

APP_MODULE = "vortos_exec_app"
APP_SOURCE = '''
"""Commands for the execution CLI tests."""

from engine import FireContext, schedulable, scheduled


@schedulable("greet")
def greet(name: str, times: int = 1, *, fire: FireContext) -> str:
    """Returns a greeting (recorded as the run's output)."""
    return " ".join([f"hello {name}"] * times) + f" (attempt {fire.attempt})"


@schedulable("explode")
def explode(reason: str = "boom") -> None:
    """Always fails."""
    raise RuntimeError(reason)


@scheduled(every="1h", name="static-hourly", payload={"region": "eu"})
@schedulable("sync-region")
def sync_region(region: str) -> str:
    return f"synced {region}"
'''

# Every background process and every wait ends within these bounds.
START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / f"{APP_MODULE}.py").write_text(textwrap.dedent(APP_SOURCE))
    return folder


def app_env(app_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a process needs to import the app module (the repository stays importable)."""
    return {"PYTHONPATH": os.pathsep.join([str(app_dir), os.getcwd()]), **(extra or {})}


def with_app(*args: str, db: Path, app_dir: Path, env: dict[str, str] | None = None) -> CliResult:
    """`vortos --app APP_MODULE ARGS`."""
    return run_cli("--app", APP_MODULE, *args, db=db, env=app_env(app_dir, env))


def ok(result: CliResult) -> CliResult:
    assert result.code == 0, result.stderr
    no_traceback(result)
    return result


def ok_json(result: CliResult) -> Any:
    return json.loads(ok(result).stdout)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def z(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def whole_hour_a_day_ago() -> datetime:
    return (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


@dataclass
class Background:
    """One long-running `vortos` process, its output in a log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, how: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM (or `how`), then its exit code (it must end within STOP_TIMEOUT)."""
        if self.process.poll() is None:
            self.process.send_signal(how)
        try:
            return self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"{self.name} did not stop on SIGTERM:\n{self.log}") from None


Start = Callable[..., Background]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start `vortos --db DB ARGS` in the background; whatever is still running is killed after
    the test."""
    started: list[Background] = []

    def launch(*args: str, db: Path, name: str, env: dict[str, str] | None = None) -> Background:
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=cli_env(env),
            )
        started.append(Background(name, process, log_path))
        return started[-1]

    yield launch
    for background in started:
        if background.process.poll() is None:
            background.process.kill()
            background.process.wait(10)


def wait_for_json(
    args: Sequence[str],
    condition: Callable[[Any], bool],
    *,
    db: Path,
    what: str,
    watch: Sequence[Background] = (),
    timeout: float = START_TIMEOUT,
) -> Any:
    """Poll `vortos ARGS --json` until `condition` holds of what it prints; return that.

    A failing read (the database not created yet) counts as not yet. Fails at the deadline, or
    as soon as a watched process exits, with the processes' logs.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = run_cli(*args, "--json", db=db)
        last: Any = result.stderr
        if result.code == 0:
            last = json.loads(result.stdout)
            if condition(last):
                return last
        ended = [b for b in watch if b.process.poll() is not None]
        if ended or time.monotonic() > deadline:
            logs = "\n".join(f"--- {b.name} ---\n{b.log}" for b in watch)
            why = f"{ended[0].name} exited" if ended else f"timed out after {timeout}s"
            raise AssertionError(f"{why} waiting for {what}; last: {last!r}\n{logs}")
        time.sleep(0.2)


def runs_of(name: str, state: str | None = None) -> list[str]:
    return ["runs", "list", "--schedule", name, *(["--state", state] if state else [])]


# -- schedule add with an app command -------------------------------------------------------------


def test_add_with_an_app_command_stores_its_payload_and_retry_policy(
    db_path: Path, app_dir: Path
) -> None:
    created = ok_json(
        with_app(
            *("schedule", "add", "nightly-greeting", "--cron", "0 3 * * *"),
            *("--command", "greet", "--payload", '{"name": "ada", "times": 2}'),
            *("--max-attempts", "5", "--retry-backoff", "10s", "--retry-backoff-cap", "1m"),
            "--json",
            db=db_path,
            app_dir=app_dir,
        )
    )
    shown = cli_json("schedule", "show", "nightly-greeting", db=db_path)
    assert shown == created
    assert shown["command"] == "greet"
    assert shown["payload"] == {"name": "ada", "times": 2}
    assert shown["retry"] == {"max_attempts": 5, "backoff_ms": 10_000, "backoff_cap_ms": 60_000}
    assert shown["origin"] == "dynamic"


def test_add_takes_the_default_retry_policy(db_path: Path) -> None:
    ok(run_cli("schedule", "add", "poll", "--every", "1m", "--command", "noop", db=db_path))
    retry = cli_json("schedule", "show", "poll", db=db_path)["retry"]
    assert retry == {"max_attempts": 3, "backoff_ms": 2_000, "backoff_cap_ms": 300_000}


def test_the_app_can_be_named_by_vortos_app_instead_of_app(db_path: Path, app_dir: Path) -> None:
    result = run_cli(
        *("schedule", "add", "greeting", "--every", "1h", "--command", "greet"),
        *("--payload", '{"name": "ada"}'),
        db=db_path,
        env=app_env(app_dir, {"VORTOS_APP": APP_MODULE}),
    )
    ok(result)
    assert cli_json("schedule", "show", "greeting", db=db_path)["command"] == "greet"


def test_a_process_command_on_the_allowlist_is_accepted(db_path: Path) -> None:
    payload = json.dumps({"argv": [sys.executable, "-c", "print('hi')"], "timeout": "30s"})
    by_option = run_cli(
        *("--allow-exec", sys.executable, "schedule", "add", "by-option", "--every", "1h"),
        *("--command", "process", "--payload", payload),
        db=db_path,
    )
    ok(by_option)
    by_env = run_cli(
        *("schedule", "add", "by-env", "--every", "1h", "--command", "process"),
        *("--payload", payload),
        db=db_path,
        env={"VORTOS_PROCESS_ALLOW": os.pathsep.join(["/nonexistent/tool", sys.executable])},
    )
    ok(by_env)
    for name in ("by-option", "by-env"):
        assert cli_json("schedule", "show", name, db=db_path)["payload"] == json.loads(payload)


# -- trigger --------------------------------------------------------------------------------------


def test_trigger_creates_a_manual_run_and_leaves_the_next_fire_alone(
    db_path: Path, app_dir: Path
) -> None:
    ok(
        with_app(
            *("schedule", "add", "greeting", "--every", "1h", "--command", "greet"),
            *("--payload", '{"name": "ada"}'),
            db=db_path,
            app_dir=app_dir,
        )
    )
    before = cli_json("schedule", "show", "greeting", db=db_path)
    run = ok_json(
        with_app("schedule", "trigger", "greeting", "--json", db=db_path, app_dir=app_dir)
    )
    assert run["kind"] == "manual"
    assert run["state"] == "dispatched"
    assert run["schedule"] == "greeting"
    assert run["schedule_id"] == before["id"]
    assert "@manual:" in run["slot_key"]
    listed = cli_json("runs", "list", db=db_path)
    assert [(r["id"], r["kind"], r["state"]) for r in listed] == [
        (run["id"], "manual", "dispatched")
    ]
    after = cli_json("schedule", "show", "greeting", db=db_path)
    for key in ("next_slot_at", "next_fire_at", "version", "status", "updated_at"):
        assert after[key] == before[key], key

    # A paused schedule can be triggered too, and each trigger is a run of its own.
    ok(run_cli("schedule", "pause", "greeting", db=db_path))
    second = ok(run_cli("schedule", "trigger", "greeting", db=db_path))
    assert "triggered default/greeting: run " in second.stderr
    manual = [r for r in cli_json("runs", "list", db=db_path) if r["kind"] == "manual"]
    assert len(manual) == 2
    assert len({r["slot_key"] for r in manual}) == 2


# -- backfill -------------------------------------------------------------------------------------


def test_backfill_of_two_hours_of_a_five_minute_cron_dispatches_24_runs_once(
    db_path: Path,
) -> None:
    """Acceptance 6, through the CLI: a second backfill of the same range dispatches nothing."""
    ok(run_cli("schedule", "add", "five", "--cron", "*/5 * * * *", "--command", "noop", db=db_path))
    schedule_before = cli_json("schedule", "show", "five", db=db_path)
    end = whole_hour_a_day_ago()
    start = end - timedelta(hours=2)
    window = ("--from", z(start), "--to", z(end))

    first = ok_json(run_cli("schedule", "backfill", "five", *window, "--json", db=db_path))
    assert first == {
        "schedule": "five",
        "slots": 24,
        "dispatched": 24,
        "already_dispatched": 0,
        "first_slot": z(start),
        "last_slot": z(end - timedelta(minutes=5)),
    }
    runs = cli_json(*runs_of("five"), db=db_path)
    expected = {start + timedelta(minutes=5 * n) for n in range(24)}
    assert {instant(r["slot_at"]) for r in runs} == expected  # [from, to): `to` is not a slot
    assert {(r["kind"], r["state"]) for r in runs} == {("backfill", "dispatched")}

    again = ok(run_cli("schedule", "backfill", "five", *window, db=db_path))
    assert "24 slot(s) in range, 0 dispatched, 24 already dispatched before" in again.stderr
    third = ok_json(run_cli("schedule", "backfill", "five", *window, "--json", db=db_path))
    assert (third["slots"], third["dispatched"], third["already_dispatched"]) == (24, 0, 24)
    assert cli_json(*runs_of("five"), db=db_path) == runs
    schedule_after = cli_json("schedule", "show", "five", db=db_path)
    assert schedule_after["next_slot_at"] == schedule_before["next_slot_at"]


def test_backfill_reads_instants_without_offset_in_the_schedules_zone(db_path: Path) -> None:
    ok(
        run_cli(
            *("schedule", "add", "tokyo", "--cron", "0 * * * *", "--tz", "Asia/Tokyo"),
            *("--command", "noop"),
            db=db_path,
        )
    )
    day = (datetime.now(UTC) - timedelta(days=2)).date().isoformat()
    report = ok_json(
        run_cli(
            *("schedule", "backfill", "tokyo"),
            *("--from", f"{day}T00:00:00", "--to", f"{day}T03:00:00", "--json"),
            db=db_path,
        )
    )
    assert report["slots"] == 3
    midnight_in_tokyo = datetime.fromisoformat(f"{day}T00:00:00+09:00")
    assert instant(report["first_slot"]) == midnight_in_tokyo


def test_backfill_of_exactly_10000_slots_needs_no_yes_and_more_with_yes_is_accepted(
    db_path: Path,
) -> None:
    ok(run_cli("schedule", "add", "five", "--cron", "*/5 * * * *", "--command", "noop", db=db_path))
    end = whole_hour_a_day_ago()
    start = end - timedelta(minutes=5 * 10_000)
    exactly = ok_json(
        run_cli(
            *("schedule", "backfill", "five", "--from", z(start), "--to", z(end), "--json"),
            db=db_path,
        )
    )
    assert (exactly["slots"], exactly["dispatched"]) == (10_000, 10_000)
    earlier = start - timedelta(minutes=5)  # one slot more: 10,001 in range
    confirmed = ok_json(
        run_cli(
            *("schedule", "backfill", "five", "--from", z(earlier), "--to", z(end)),
            *("--yes", "--json"),
            db=db_path,
        )
    )
    assert (confirmed["slots"], confirmed["dispatched"], confirmed["already_dispatched"]) == (
        10_001,
        1,
        10_000,
    )


def test_runs_list_until_is_exclusive_and_combines_with_since(db_path: Path) -> None:
    ok(run_cli("schedule", "add", "five", "--cron", "*/5 * * * *", "--command", "noop", db=db_path))
    end = whole_hour_a_day_ago()
    start = end - timedelta(hours=2)
    middle = start + timedelta(hours=1)
    ok(run_cli("schedule", "backfill", "five", "--from", z(start), "--to", z(end), db=db_path))
    before_middle = cli_json("runs", "list", "--until", z(middle), db=db_path)
    assert len(before_middle) == 12
    assert max(instant(r["slot_at"]) for r in before_middle) == middle - timedelta(minutes=5)
    from_middle = cli_json(
        "runs", "list", "--since", z(middle), "--until", z(end), "--limit", "1000", db=db_path
    )
    assert len(from_middle) == 12
    assert min(instant(r["slot_at"]) for r in from_middle) == middle


# -- vortos run --app: commands run to completion, a clean stop releases the lease ---------------


def test_run_with_an_app_runs_commands_to_completion_and_releases_the_lease_on_sigterm(
    db_path: Path, app_dir: Path, start: Start
) -> None:
    ok(
        with_app(
            *("schedule", "add", "greeting", "--every", "1s", "--command", "greet"),
            *("--payload", '{"name": "ada", "times": 2}'),
            # every fire runs, even one claimed together with its predecessor (skip would skip it)
            *("--overlap", "allow"),
            db=db_path,
            app_dir=app_dir,
        )
    )
    runner = start(
        *("--app", APP_MODULE, "run", "--node-id", "runner-1", "--lease-ttl", "60s"),
        db=db_path,
        name="runner-1",
        env=app_env(app_dir),
    )
    completed = wait_for_json(
        runs_of("greeting", "completed"),
        lambda runs: len(runs) >= 2,
        db=db_path,
        what="two completed runs of greeting",
        watch=[runner],
    )
    assert cli_json("db", "info", db=db_path)["leader"] == "runner-1"
    assert runner.stop() == 0, runner.log
    for run in completed:
        assert run["kind"] == "scheduled"
        assert run["node"] == "runner-1"
        assert run["consumer"] == "runner-1"
        assert run["attempts"] == 1
        assert run["error"] is None
        assert run["output"] == "hello ada hello ada (attempt 1)"
    # A 60 s lease gone at once: the stop released it (a standby can take over now).
    assert cli_json("db", "info", db=db_path)["leader"] is None
    assert "released the lease" in runner.log
    assert "Traceback" not in runner.log
    # Nothing was left half-done: every run of the schedule settled or waits in the queue.
    all_runs = cli_json(*runs_of("greeting"), db=db_path)
    states = {r["state"] for r in all_runs}
    assert states <= {"completed", "dispatched"}, (all_runs, runner.log)


# -- static schedules -----------------------------------------------------------------------------


def test_run_with_an_app_syncs_its_static_schedule_which_can_be_paused_but_not_deleted(
    db_path: Path, app_dir: Path, start: Start
) -> None:
    runner = start(
        *("--app", APP_MODULE, "run", "--no-consume", "--node-id", "syncer"),
        db=db_path,
        name="syncer",
        env=app_env(app_dir),
    )
    listed = wait_for_json(
        ["schedule", "list"],
        lambda schedules: any(s["name"] == "static-hourly" for s in schedules),
        db=db_path,
        what="the static schedule to be synced",
        watch=[runner],
    )
    assert runner.stop() == 0, runner.log
    (static,) = [s for s in listed if s["name"] == "static-hourly"]
    assert static["origin"] == "static"
    assert static["status"] == "active"
    assert static["command"] == "sync-region"
    assert static["payload"] == {"region": "eu"}
    assert static["trigger"]["every_ms"] == 3_600_000
    assert static["metadata"]["vortos.source"] == f"{APP_MODULE}.sync_region"

    before = db_state(db_path)
    line = assert_clean_error(
        run_cli("schedule", "delete", "static-hourly", db=db_path), 5, "static-hourly", "static"
    )
    assert "pause" in line  # it says what can be done instead
    assert db_state(db_path) == before

    ok(run_cli("schedule", "pause", "static-hourly", "--note", "maintenance", db=db_path))
    paused = cli_json("schedule", "show", "static-hourly", db=db_path)
    assert (paused["status"], paused["pause_note"]) == ("paused", "maintenance")
    ok(run_cli("schedule", "resume", "static-hourly", db=db_path))
    assert cli_json("schedule", "show", "static-hourly", db=db_path)["status"] == "active"

    before = db_state(db_path)
    clash = with_app(
        *("schedule", "add", "static-hourly", "--every", "1m", "--command", "noop"),
        db=db_path,
        app_dir=app_dir,
    )
    assert_clean_error(clash, 5, "static-hourly", "static")
    assert db_state(db_path) == before


# -- vortos consume beside vortos run --no-consume ------------------------------------------------


def test_consume_runs_the_fires_a_no_consume_scheduler_dispatches(
    db_path: Path, app_dir: Path, start: Start
) -> None:
    ok(
        with_app(
            *("schedule", "add", "ticker", "--every", "1s", "--command", "greet"),
            *("--payload", '{"name": "bob"}'),
            db=db_path,
            app_dir=app_dir,
        )
    )
    script = "print('hi from a process')"
    ok(
        run_cli(
            *("--allow-exec", sys.executable, "schedule", "add", "proc", "--every", "1h"),
            *("--command", "process", "--payload"),
            json.dumps({"argv": [sys.executable, "-c", script]}),
            db=db_path,
        )
    )
    # The scheduler knows neither the app nor the allowlist: it only dispatches.
    dispatcher = start(
        *("run", "--no-consume", "--node-id", "dispatcher", "--lease-ttl", "60s"),
        db=db_path,
        name="dispatcher",
    )
    worker = start(
        *("--app", APP_MODULE, "--allow-exec", sys.executable, "consume"),
        *("--node-id", "worker", "--consumers", "2", "--claim-ttl", "10s", "--grace", "5s"),
        db=db_path,
        name="worker",
        env=app_env(app_dir),
    )
    # The trigger checks the payload of a command it knows: the allowlist is needed here too.
    ok(run_cli("--allow-exec", sys.executable, "schedule", "trigger", "proc", db=db_path))
    wait_for_json(
        runs_of("ticker", "completed"),
        lambda runs: len(runs) >= 2,
        db=db_path,
        what="two completed runs of ticker",
        watch=[dispatcher, worker],
    )
    (proc,) = wait_for_json(
        runs_of("proc", "completed"),
        lambda runs: len(runs) == 1,
        db=db_path,
        what="the process run to complete",
        watch=[dispatcher, worker],
    )
    assert dispatcher.stop(signal.SIGINT) == 0, dispatcher.log  # Ctrl-C stops as cleanly
    assert worker.stop() == 0, worker.log

    ticks = [r for r in cli_json(*runs_of("ticker"), db=db_path) if r["state"] == "completed"]
    assert ticks
    for run in ticks:
        assert run["node"] == "dispatcher"  # dispatched by the scheduler process
        assert run["consumer"] == "worker"  # run by the consumer process
        assert run["output"] == "hello bob (attempt 1)"
    assert proc["consumer"] == "worker"
    assert proc["exit_code"] == 0
    assert "hi from a process" in proc["output"]
    assert "no consumers" in dispatcher.log
    assert "greet" in worker.log  # it lists the commands it knows
    assert "Traceback" not in dispatcher.log + worker.log


# -- a failing command: retries, dead letter, requeue, purge, runs show ---------------------------


def test_a_failing_command_is_dead_lettered_then_requeued_or_purged(
    db_path: Path, app_dir: Path, start: Start
) -> None:
    ok(
        with_app(
            *("schedule", "add", "doomed", "--every", "1h", "--command", "explode"),
            *("--payload", '{"reason": "disk on fire"}', "--max-attempts", "2"),
            *("--retry-backoff", "100ms", "--retry-backoff-cap", "200ms"),
            db=db_path,
            app_dir=app_dir,
        )
    )
    first = ok_json(run_cli("schedule", "trigger", "doomed", "--json", db=db_path))["id"]
    second = ok_json(run_cli("schedule", "trigger", "doomed", "--json", db=db_path))["id"]
    worker = start(
        *("--app", APP_MODULE, "consume", "--node-id", "worker", "--claim-ttl", "10s"),
        db=db_path,
        name="worker",
        env=app_env(app_dir),
    )
    wait_for_json(
        runs_of("doomed", "dead_lettered"),
        lambda runs: len(runs) == 2,
        db=db_path,
        what="both runs to be dead-lettered",
        watch=[worker],
    )
    assert worker.stop() == 0, worker.log

    # runs show: the error and the output (the command's traceback is data here, not a crash)
    dead = cli_json("runs", "show", str(first), db=db_path)
    assert dead["id"] == first
    assert dead["state"] == "dead_lettered"
    assert dead["attempts"] == 2
    assert dead["consumer"] == "worker"
    assert dead["error"] == "failed 2 of 2 attempts: RuntimeError: disk on fire"
    assert "RuntimeError: disk on fire" in dead["output"]
    assert dead["finished_at"] is not None
    table = run_cli("runs", "show", str(first), db=db_path)
    assert table.code == 0, table.stderr
    assert table.stderr == ""
    assert "failed 2 of 2 attempts: RuntimeError: disk on fire" in table.stdout
    assert "dead_lettered" in table.stdout
    assert "raise RuntimeError(reason)" in table.stdout  # the output tail

    letters = cli_json("queue", "list", db=db_path)
    assert [f["run_id"] for f in letters] == [first, second]  # oldest run first
    for letter in letters:
        assert letter["schedule"] == "doomed"
        assert letter["command"] == "explode"
        assert letter["attempts"] == 2
        assert letter["state"] == "discarded"
        assert letter["reason"] == "failed 2 of 2 attempts: RuntimeError: disk on fire"
    listed = ok(run_cli("queue", "list", db=db_path))
    assert str(first) in listed.stdout
    assert "disk on fire" in listed.stdout

    requeued = ok(run_cli("queue", "requeue", str(first), db=db_path))
    assert "requeued 1 dead letter(s)" in requeued.stderr
    back = cli_json("runs", "show", str(first), db=db_path)
    assert back["state"] == "dispatched"
    assert back["attempts"] == 2  # counted on, not reset
    assert [f["run_id"] for f in cli_json("queue", "list", db=db_path)] == [second]

    purged = ok(run_cli("queue", "purge", str(second), db=db_path))
    assert "purged 1 dead letter(s)" in purged.stderr
    assert cli_json("queue", "list", db=db_path) == []
    kept = cli_json("runs", "show", str(second), db=db_path)
    assert kept["state"] == "dead_lettered"  # the run stays in the ledger
    assert kept["error"] == dead["error"]
    assert {r["id"] for r in cli_json(*runs_of("doomed"), db=db_path)} == {first, second}

    # The operator fixes the command; the requeued run now completes, the purged one stays.
    (app_dir / f"{APP_MODULE}.py").write_text(
        textwrap.dedent(APP_SOURCE).replace(
            "raise RuntimeError(reason)", 'return f"fixed: {reason}"'
        )
    )
    again = start(
        *("--app", APP_MODULE, "consume", "--node-id", "worker-2", "--claim-ttl", "10s"),
        db=db_path,
        name="worker-2",
        env=app_env(app_dir),
    )
    wait_for_json(
        ["runs", "show", str(first)],
        lambda run: run["state"] == "completed",
        db=db_path,
        what="the requeued run to complete",
        watch=[again],
    )
    assert again.stop() == 0, again.log
    rerun = cli_json("runs", "show", str(first), db=db_path)
    assert (rerun["consumer"], rerun["attempts"]) == ("worker-2", 3)
    assert rerun["output"] == "fixed: disk on fire"
    assert rerun["error"] is None  # the old failure is not carried into the completed run
    assert cli_json("runs", "show", str(second), db=db_path)["state"] == "dead_lettered"


def test_requeue_all_and_purge_all_on_an_empty_queue_do_nothing(db_path: Path) -> None:
    open_engine(db_path).close()
    before = db_state(db_path)
    assert "requeued 0" in ok(run_cli("queue", "requeue", "--all", db=db_path)).stderr
    assert "purged 0" in ok(run_cli("queue", "purge", "--all", "--yes", db=db_path)).stderr
    listed = ok(run_cli("queue", "list", db=db_path))
    assert (listed.stdout, "no dead letters" in listed.stderr) == ("", True)
    assert db_state(db_path) == before


# -- resume --catch-up ----------------------------------------------------------------------------


def test_resume_catch_up_keeps_the_cursor_on_the_missed_slot(db_path: Path) -> None:
    for name in ("kept", "skipped"):
        ok(
            run_cli(
                *("schedule", "add", name, "--every", "1s", "--misfire", "each"),
                *("--command", "noop"),
                db=db_path,
            )
        )
        ok(run_cli("schedule", "pause", name, db=db_path))
    paused = {n: cli_json("schedule", "show", n, db=db_path) for n in ("kept", "skipped")}
    missed = max(instant(s["next_slot_at"]) for s in paused.values())
    while datetime.now(UTC) < missed + timedelta(seconds=1):  # at least one slot is missed
        time.sleep(0.1)
    resumed_at = datetime.now(UTC)

    kept = ok_json(run_cli("schedule", "resume", "kept", "--catch-up", "--json", db=db_path))
    assert kept["status"] == "active"
    assert kept["next_slot_at"] == paused["kept"]["next_slot_at"]
    assert instant(kept["next_slot_at"]) < resumed_at  # the missed slot is still to fire

    skipped = ok_json(run_cli("schedule", "resume", "skipped", "--json", db=db_path))
    assert skipped["status"] == "active"
    assert instant(skipped["next_slot_at"]) > resumed_at  # missed slots were passed over


def test_resume_catch_up_fires_the_slots_missed_while_paused(db_path: Path) -> None:
    """The same through the service, on a manual clock: the missed slots really fire."""
    clock = ManualClock(T0)
    with open_engine(db_path, clock=clock) as engine:
        for name in ("kept", "skipped"):
            engine.service.create(
                ScheduleSpec(
                    name=name,
                    trigger=CronTrigger("*/5 * * * *"),
                    command="noop",
                    misfire=MisfirePolicy(MisfireKind.EACH),
                ),
                actor="test",
            )
        daemon = engine.daemon(node_id="d", lease_ttl_ms=3_600_000)
        settle(daemon)  # the slot at T0
        for name in ("kept", "skipped"):
            engine.service.pause(name, actor="test")
        clock.advance(32 * 60)  # six slots pass while paused: T0+5m ... T0+30m
        engine.service.resume("kept", actor="test", catch_up=True)
        engine.service.resume("skipped", actor="test")
        settle(daemon)
        every_five = [iso_local(T0 + n * 5 * MINUTE_MS, "UTC") for n in range(7)]
        assert fired_slots(engine, "kept") == every_five  # T0, and each missed slot
        assert fired_slots(engine, "skipped") == every_five[:1]
        assert engine.service.get("skipped").next_slot_at == T0 + 35 * MINUTE_MS
