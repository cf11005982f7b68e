"""Time limits of Python commands (acceptance 6 of issue 19), with the real clock: a run past
its limit is asked to stop, ends timed_out (retried per its policy) and frees its overlap
slot; a command that ignores the request is reported (log, metric, doctor) and its late
return settles nothing. On SQLite files and the real PostgreSQL, and through a real
`vortos run` process."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
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
from engine.commands.context import FireContext
from engine.domain.retry import RetryPolicy
from engine.domain.run import Run
from engine.domain.timeutil import SECOND_MS
from engine.governance.doctor import DoctorContext, Finding, Status
from engine.governance.execution_checks import CommandsIgnoringCancel, RunsOverLimit
from engine.observability.metrics import PrometheusMetrics
from engine.ports import RunQuery
from engine.ports.fire_queue import Fire
from engine.runtime.consumer import FireQueueConsumer
from engine.runtime.executor import IGNORED_CANCEL, CancelReason
from engine.runtime.time_limits import CANCEL_GRACE_MS
from tests.integration.processes import Daemon, wait_for
from tests.pg import fresh_schema, pg_engine

WAIT_S = 60.0  # generous: the machine is loaded; reached only when a test fails


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, db_path: Path) -> Iterator[Engine]:
    """An engine on the real clock: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        with open_engine(db_path) as opened:
            yield opened
        return
    with fresh_schema() as url:
        opened = pg_engine(url)
        try:
            yield opened
        finally:
            opened.close()


class Running:
    """A consumer running on its own thread until the test ends."""

    def __init__(self, consumer: FireQueueConsumer) -> None:
        self.consumer = consumer
        self.thread = threading.Thread(target=consumer.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _schedule(engine: Engine, command: str, *, timeout_ms: int, attempts: int) -> None:
    engine.service.create(
        ScheduleSpec(
            name=command,
            trigger=IntervalTrigger(3600 * SECOND_MS, 0),
            command=command,
            retry=RetryPolicy(max_attempts=attempts, backoff_ms=0, backoff_cap_ms=0),
            timeout_ms=timeout_ms,
        ),
        actor="test",
    )
    engine.service.pause(command, actor="test")  # only the fires triggered here run


def _only_run(engine: Engine) -> Run:
    (run,) = engine.service.runs(RunQuery())
    return run


def _doctor(
    engine: Engine, db_path: Path, check: RunsOverLimit | CommandsIgnoringCancel
) -> Finding:
    ctx = DoctorContext(
        engine.storage, engine.clock, db_path, diagnostics=engine.storage.diagnostics()
    )
    return check.run(ctx)


def test_a_cooperative_command_is_asked_to_stop_at_its_limit_and_retried_then_timed_out(
    engine: Engine,
) -> None:
    seen: list[tuple[int, int | None, str | None, float]] = []

    def cooperative(*, fire: FireContext) -> None:
        started = time.monotonic()
        fire.wait_cancelled(WAIT_S)  # wakes when asked to stop
        seen.append((fire.attempt, fire.timeout_ms, fire.cancel_reason, time.monotonic() - started))
        fire.check_cancelled()

    engine.commands.register("cooperative", cooperative)
    _schedule(engine, "cooperative", timeout_ms=1_000, attempts=2)
    run_id = engine.service.trigger("cooperative", actor="test").id
    running = Running(engine.consumer(consumer_id="c", concurrency=2))
    try:
        wait_for(
            lambda: engine.service.runs(RunQuery())[0].state is RunState.TIMED_OUT,
            timeout=WAIT_S,
            what="the run to end timed_out after its two attempts",
        )
    finally:
        running.stop()
    run = engine.storage.runs.get(run_id)
    assert run is not None
    assert run.error == "failed 2 of 2 attempts: timed out after 1s"
    assert IGNORED_CANCEL not in run.error
    assert [(a, limit, why) for a, limit, why, _ in seen] == [
        (1, 1_000, CancelReason.TIMEOUT),
        (2, 1_000, CancelReason.TIMEOUT),
    ]
    for *_, took in seen:  # stopped at the limit, not left to the grace
        assert 0.9 <= took < 1.0 + CANCEL_GRACE_MS / 1000
    fire = engine.storage.fire_queue.get(run_id)
    assert fire is not None
    assert (fire.attempts, fire.failures) == (2, 1)
    assert fire.discarded_at is not None  # a dead letter operators can requeue


def test_a_command_ignoring_its_cancellation_is_settled_timed_out_once_and_reported(
    engine: Engine, db_path: Path
) -> None:
    release = threading.Event()
    fires: list[FireContext] = []

    def stubborn(*, fire: FireContext) -> str:
        fires.append(fire)
        release.wait(WAIT_S)  # ignores the request to stop
        return "late"

    engine.commands.register("stubborn", stubborn)
    _schedule(engine, "stubborn", timeout_ms=1_000, attempts=1)
    run_id = engine.service.trigger("stubborn", actor="test").id
    metrics = PrometheusMetrics()
    consumer = engine.consumer(consumer_id="c", concurrency=2, observer=metrics)
    running = Running(consumer)
    try:
        wait_for(lambda: bool(fires) and fires[0].cancelled, timeout=WAIT_S, what="the cancel")
        # Asked to stop, still running within the grace: doctor sees it over its limit.
        over = _doctor(engine, db_path, RunsOverLimit())
        if engine.service.runs(RunQuery())[0].state is RunState.RUNNING:
            assert over.status is Status.WARN
            assert f"run {run_id} " in over.detail
        wait_for(
            lambda: engine.service.runs(RunQuery())[0].state is RunState.TIMED_OUT,
            timeout=WAIT_S,
            what="the watchdog to settle the run without its command",
        )
        assert consumer.time_limits.ignoring == 1
        sample = metrics.registry.get_sample_value
        assert sample("vortos_commands_ignoring_cancel") == 1
        labels = {"schedule": "stubborn", "tenant": "default"}
        assert sample("vortos_runs_timed_out_total", labels) == 1
        assert sample("vortos_runs_total", {"outcome": "timed_out", **labels}) == 1
        ignored = _doctor(engine, db_path, CommandsIgnoringCancel())
        assert ignored.status is Status.WARN
        assert f"run {run_id} (stubborn)" in ignored.detail
        assert _doctor(engine, db_path, RunsOverLimit()).status is Status.PASS
        # Its thread is held: a second fire runs on the other worker meanwhile.
        second = engine.service.trigger("stubborn", actor="test").id
        wait_for(lambda: len(fires) == 2, timeout=WAIT_S, what="the second fire to start")
        release.set()  # both return now, the first long after it was settled
        wait_for(
            lambda: (
                consumer.time_limits.ignoring == 0
                and engine.service.runs(RunQuery(limit=5))[0].state is RunState.COMPLETED
            ),
            timeout=WAIT_S,
            what="the late return, and the second fire to complete",
        )
    finally:
        release.set()
        running.stop()
    first = engine.storage.runs.get(run_id)
    assert first is not None
    assert first.state is RunState.TIMED_OUT  # the late return changed nothing
    assert first.output is None
    assert first.error == f"failed 1 of 1 attempts: timed out after 1s ({IGNORED_CANCEL})"
    done = engine.storage.runs.get(second)
    assert done is not None
    assert (done.state, done.output) == (RunState.COMPLETED, "late")
    assert consumer.stats.stale == 0  # nothing was settled twice
    assert sample("vortos_commands_ignoring_cancel") == 0


# -- a real `vortos run` process ---------------------------------------------------------------

APP = '''
"""A command that hangs, ignoring every request to stop, under a 2 s limit of its own."""

import threading

from engine import FireContext, schedulable

_FOREVER = threading.Event()


@schedulable("hang", timeout="2s")
def hang(*, fire: FireContext) -> None:
    _FOREVER.wait()  # never set: the thread is held until the process ends
'''


@pytest.fixture
def hang_app(tmp_path: Path, db_path: Path) -> Iterator[tuple[Engine, Path]]:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "hang_app.py").write_text(textwrap.dedent(APP))
    sys.path.insert(0, str(folder))
    try:
        app = load_app("hang_app")
        with open_engine(db_path, commands=app.register_into(builtin_commands())) as engine:
            yield engine, folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("hang_app", None)


def test_a_hung_command_with_a_2s_limit_ends_timed_out_and_the_next_slot_runs(
    hang_app: tuple[Engine, Path], db_path: Path, tmp_path: Path
) -> None:
    engine, folder = hang_app
    start = (engine.clock.now_ms() // 1000 + 2) * 1000
    engine.service.create(
        ScheduleSpec(
            name="hung",
            trigger=IntervalTrigger(4 * SECOND_MS, start),
            command="hang",
            overlap=OverlapPolicy.SKIP,
            retry=RetryPolicy(max_attempts=1),
        ),
        actor="test",
    )
    daemon = Daemon(
        db_path,
        "node-1",
        tmp_path,
        env={"VORTOS_APP": "hang_app", "PYTHONPATH": os.pathsep.join([str(folder), os.getcwd()])},
    )

    def runs() -> list[Run]:
        return sorted(engine.service.runs(RunQuery(limit=50)), key=lambda r: r.slot_at)

    try:
        wait_for(
            lambda: any(r.state is RunState.TIMED_OUT for r in runs()),
            timeout=WAIT_S,
            what="the hung run to end timed_out",
            every=0.2,
        )
        first = next(r for r in runs() if r.state is RunState.TIMED_OUT)
        # Under overlap skip, a later slot runs once the hung one's slot was freed.
        wait_for(
            lambda: any(r.slot_at > first.slot_at and r.started_at is not None for r in runs()),
            timeout=WAIT_S,
            what="a later slot to run",
            every=0.2,
        )
    finally:
        code = daemon.terminate()
    assert code == 0, daemon.log
    assert first.error is not None
    assert first.error.startswith("failed 1 of 1 attempts: timed out after 2s")
    assert IGNORED_CANCEL in first.error
    assert "over its time limit of 2s: asked to stop" in daemon.log
    assert "ignored its cancellation" in daemon.log


def test_the_schedules_own_timeout_overrides_the_commands_and_a_static_one_is_stored(
    db_path: Path,
) -> None:
    from engine import schedulable, scheduled  # noqa: PLC0415
    from engine.commands.decorators import command_of, schedules_of  # noqa: PLC0415
    from engine.runtime.time_limits import TimeLimits  # noqa: PLC0415

    @scheduled(every="1h", name="declared", timeout="5s")
    @schedulable("limited", timeout="2s")
    def limited() -> None: ...

    command = command_of(limited)
    assert command is not None
    with open_engine(db_path) as engine:
        engine.commands.register("limited", limited)
        engine.service.sync_static(schedules_of(limited), actor="test")
        plain = engine.service.create(
            ScheduleSpec(
                name="plain", trigger=IntervalTrigger(3600 * SECOND_MS, 0), command="noop"
            ),
            actor="test",
        )
        declared = engine.service.get("declared")
        assert declared.timeout_ms == 5_000
        limits = TimeLimits(engine.storage.schedules)
        fires = {s.name: s.id for s in (declared, plain)}

        def limit(name: str, command_ms: int | None) -> int | None:
            fire = _fire_of(fires[name])
            return limits.limit_ms(fire, command_ms)

        assert limit("declared", 2_000) == 5_000  # the schedule's wins
        assert limit("plain", 2_000) == 2_000  # none of its own: the command's
        assert limit("plain", None) is None


def _fire_of(schedule_id: str) -> Fire:
    from engine.domain.run import RunKind  # noqa: PLC0415

    return Fire(
        run_id=1,
        tenant="default",
        schedule_id=schedule_id,
        schedule_name="x",
        slot_key=f"{schedule_id}@0",
        slot_at=0,
        kind=RunKind.SCHEDULED,
        command="limited",
        payload={},
        available_at=0,
        created_at=0,
        attempts=1,
    )
