"""Consumer deaths are counted apart from failures: real `vortos consume` processes SIGKILLed
under a fire do not use up its retry budget (they have a budget of their own, setting
consumer_deaths), and neither do reschedules nor a consumer's graceful release at SIGTERM."""

from __future__ import annotations

import functools
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
    ManualClock,
    RunState,
    ScheduleSpec,
    builtin_commands,
    load_app,
    open_engine,
)
from engine.commands.context import RescheduleFire
from engine.commands.registry import CommandRegistry
from engine.domain.retry import RetryPolicy
from engine.domain.timeutil import SECOND_MS
from engine.ports import RunQuery
from tests.conftest import cli_env
from tests.integration.processes import wait_for

APP = '''
"""Commands for the consumer-death tests: each attempt notes its start in a journal."""

import os

from engine import FireContext, schedulable

JOURNAL = os.environ["VORTOS_TEST_JOURNAL"]


def note(text: str) -> None:
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\\n").encode())
    finally:
        os.close(fd)


@schedulable("hang-until-fourth")
def hang_until_fourth(*, fire: FireContext) -> str:
    note(f"start {fire.attempt}")
    if fire.attempt < 4:
        fire.wait_cancelled(120)  # its consumer is killed long before this ends
    return f"finished on attempt {fire.attempt}"


@schedulable("release-fail-pass")
def release_fail_pass(*, fire: FireContext) -> str:
    note(f"start {fire.attempt}")
    if fire.attempt == 1:
        fire.wait_cancelled(120)  # its consumer is stopped meanwhile, and gives it back
        fire.check_cancelled()
    if fire.attempt == 2:
        raise ValueError("a real failure")
    return f"finished on attempt {fire.attempt}"
'''
WAIT_S = 60.0  # generous: the machine is loaded; reached only when a test fails


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "deaths_app.py").write_text(textwrap.dedent(APP))
    return folder


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.txt"


@pytest.fixture
def prepared(db_path: Path, app_dir: Path, journal: Path) -> Iterator[Engine]:
    sys.path.insert(0, str(app_dir))
    os.environ["VORTOS_TEST_JOURNAL"] = str(journal)
    try:
        app = load_app("deaths_app")
        with open_engine(db_path, commands=app.register_into(builtin_commands())) as engine:
            yield engine
    finally:
        sys.path.remove(str(app_dir))
        sys.modules.pop("deaths_app", None)
        os.environ.pop("VORTOS_TEST_JOURNAL", None)


class Consumer:
    """One `vortos consume` process with a 1 s claim TTL."""

    def __init__(
        self, db: Path, app_dir: Path, journal: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = app_dir.parent / f"{name}.log"
        environment = cli_env(
            {
                "VORTOS_TEST_JOURNAL": str(journal),
                "PYTHONPATH": os.pathsep.join([str(app_dir), os.getcwd()]),
                **(env or {}),
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
                    "deaths_app",
                    "consume",
                    "--node-id",
                    name,
                    "--claim-ttl",
                    "1s",
                    "--grace",
                    "0s",
                ],
                cwd=app_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def _starts(journal: Path) -> list[str]:
    return journal.read_text().splitlines() if journal.exists() else []


def _one_fire(engine: Engine, command: str, max_attempts: int) -> int:
    engine.service.create(
        ScheduleSpec(
            name="victim",
            trigger=IntervalTrigger(3600 * SECOND_MS, 0),
            command=command,
            retry=RetryPolicy(max_attempts=max_attempts, backoff_ms=0, backoff_cap_ms=0),
        ),
        actor="test",
    )
    engine.service.pause("victim", actor="test")  # only the fire triggered here runs
    return engine.service.trigger("victim", actor="test").id


def _kill_under_three_attempts(engine: Engine, db: Path, app_dir: Path, journal: Path) -> None:
    """Three consumers in turn, each SIGKILLed once its attempt started."""
    for n in range(1, 4):
        consumer = Consumer(db, app_dir, journal, f"doomed-{n}")
        try:
            wait_for(
                functools.partial(lambda k: f"start {k}" in _starts(journal), n),
                timeout=WAIT_S,
                what=f"attempt {n} to start",
            )
        finally:
            consumer.kill()


def test_a_fire_whose_consumers_are_killed_three_times_is_not_dead_lettered_and_completes(
    prepared: Engine, db_path: Path, app_dir: Path, journal: Path
) -> None:
    engine = prepared
    run_id = _one_fire(engine, "hang-until-fourth", max_attempts=2)
    _kill_under_three_attempts(engine, db_path, app_dir, journal)
    survivor = Consumer(db_path, app_dir, journal, "survivor")
    try:
        wait_for(
            lambda: (
                engine.service.runs(RunQuery())[0].state
                not in (RunState.DISPATCHED, RunState.RUNNING)
            ),
            timeout=WAIT_S,
            what="the run to end on the survivor",
        )
    finally:
        assert survivor.stop() == 0
    (run,) = engine.service.runs(RunQuery())
    assert run.id == run_id
    assert (run.state, run.error) == (RunState.COMPLETED, None)
    assert run.output == "finished on attempt 4"
    assert (run.attempts, run.abandoned) == (4, 3)
    fire = engine.storage.fire_queue.get(run_id)
    assert fire is not None
    assert (fire.failures, fire.round_deaths, fire.last_abandoned_by) == (0, 3, "doomed-3")
    assert _starts(journal) == ["start 1", "start 2", "start 3", "start 4"]


def test_more_consumer_deaths_than_its_budget_dead_letter_a_fire_saying_so(
    prepared: Engine, db_path: Path, app_dir: Path, journal: Path
) -> None:
    engine = prepared
    run_id = _one_fire(engine, "hang-until-fourth", max_attempts=10)
    _kill_under_three_attempts(engine, db_path, app_dir, journal)
    survivor = Consumer(db_path, app_dir, journal, "survivor", env={"VORTOS_CONSUMER_DEATHS": "2"})
    try:
        wait_for(
            lambda: engine.service.runs(RunQuery())[0].state is RunState.DEAD_LETTERED,
            timeout=WAIT_S,
            what="the fire to be dead-lettered for its consumers' deaths",
        )
    finally:
        assert survivor.stop() == 0
    (run,) = engine.service.runs(RunQuery())
    assert run.id == run_id
    assert run.error is not None
    assert run.error.startswith("abandoned: 3 consumer deaths")
    assert "more than consumer_deaths=2" in run.error
    assert "doomed-3" in run.error
    assert _starts(journal) == ["start 1", "start 2", "start 3"]  # not run a fourth time


def test_a_graceful_release_at_sigterm_uses_no_attempt(
    prepared: Engine, db_path: Path, app_dir: Path, journal: Path
) -> None:
    engine = prepared
    # Two attempts: the release, then a real failure, then success. Were the release an
    # attempt, the failure would be the second of two and dead-letter the fire.
    run_id = _one_fire(engine, "release-fail-pass", max_attempts=2)
    stopped = Consumer(db_path, app_dir, journal, "stopped")
    try:
        wait_for(lambda: "start 1" in _starts(journal), timeout=WAIT_S, what="attempt 1")
    finally:
        assert stopped.stop() == 0
    assert "released for another consumer" in stopped.log
    fire = engine.storage.fire_queue.get(run_id)
    assert fire is not None
    assert (fire.lease_token, fire.failures, fire.abandoned_count) == (None, 0, 0)
    survivor = Consumer(db_path, app_dir, journal, "survivor")
    try:
        wait_for(
            lambda: (
                engine.service.runs(RunQuery())[0].state
                not in (RunState.DISPATCHED, RunState.RUNNING)
            ),
            timeout=WAIT_S,
            what="the run to end on the survivor",
        )
    finally:
        assert survivor.stop() == 0
    (run,) = engine.service.runs(RunQuery())
    assert (run.state, run.output) == (RunState.COMPLETED, "finished on attempt 3")
    fire = engine.storage.fire_queue.get(run_id)
    assert fire is not None
    assert (fire.attempts, fire.failures, fire.abandoned_count) == (3, 1, 0)


# -- reschedules (in process, on a real file and a manual clock) ------------------------------


def test_five_reschedules_then_a_failure_leave_the_fire_retried_failed_1_of_2(
    db_path: Path, clock: ManualClock
) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(len(calls))
        if len(calls) <= 5:
            raise RescheduleFire(1_000, "not yet")
        raise ValueError("a real failure")

    commands = CommandRegistry()
    commands.register("flaky", flaky)
    with open_engine(db_path, clock=clock, commands=commands) as engine:
        engine.service.create(
            ScheduleSpec(
                name="flaky",
                trigger=IntervalTrigger(3600 * SECOND_MS, 0),
                command="flaky",
                retry=RetryPolicy(max_attempts=2, backoff_ms=1_000, backoff_cap_ms=1_000),
            ),
            actor="test",
        )
        engine.service.pause("flaky", actor="test")
        run_id = engine.service.trigger("flaky", actor="test").id
        consumer = engine.consumer(consumer_id="c", concurrency=1)
        try:
            for attempt in range(1, 8):  # five reschedules, a failure, then the last failure
                _step_until_settled(consumer, engine, run_id, attempt)
                if attempt == 6:
                    # Before: "failed 6 of 2 attempts", dead-lettered. A reschedule is no
                    # failure: this is the first of two, retried.
                    (retried,) = engine.service.runs(RunQuery())
                    assert retried.state is RunState.DISPATCHED
                    assert retried.error == "ValueError: a real failure"
                clock.advance(2)  # past the 1 s reschedule or backoff
        finally:
            consumer.close(join_s=5)
        fire = engine.storage.fire_queue.get(run_id)
        assert fire is not None
        (run,) = engine.service.runs(RunQuery())
    assert len(calls) == 7
    assert (fire.attempts, fire.failures) == (7, 1)  # the retried one; the last ended it
    assert run.state is RunState.DEAD_LETTERED
    assert run.error == "failed 2 of 2 attempts: ValueError: a real failure"


def _step_until_settled(consumer: object, engine: Engine, run_id: int, calls: int) -> None:
    """Step the consumer until the fire's attempt `calls` settled (its claim cleared)."""
    from engine.runtime.consumer import FireQueueConsumer  # noqa: PLC0415

    assert isinstance(consumer, FireQueueConsumer)

    def settled() -> bool:
        consumer.step()
        consumer.settle_finished()
        fire = engine.storage.fire_queue.get(run_id)
        return fire is not None and fire.attempts == calls and fire.lease_token is None

    wait_for(settled, timeout=WAIT_S, what=f"attempt {calls} to settle", every=0.01)


# -- doctor -----------------------------------------------------------------------------------


def test_doctor_warns_of_fires_abandoned_by_dead_consumers_and_near_their_death_budget(
    db_path: Path, clock: ManualClock
) -> None:
    from engine.governance.doctor import DoctorContext, Status  # noqa: PLC0415
    from engine.governance.execution_checks import ConsumerDeaths  # noqa: PLC0415

    with open_engine(db_path, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec(
                name="crashy", trigger=IntervalTrigger(3600 * SECOND_MS, 0), command="noop"
            ),
            actor="test",
        )
        engine.service.pause("crashy", actor="test")
        run_id = engine.service.trigger("crashy", actor="test").id

        def finding() -> tuple[Status, str]:
            ctx = DoctorContext(
                engine.storage, engine.clock, db_path, diagnostics=engine.storage.diagnostics()
            )
            found = ConsumerDeaths().run(ctx)
            return found.status, found.detail

        assert finding()[0] is Status.PASS
        for n in range(9):  # nine consumers die holding it (the default budget is 10)
            claim = engine.storage.fire_queue.claim(consumer=f"dead-{n}", ttl_ms=1_000, limit=1)
            assert [f.run_id for f in claim.fires] == [run_id]
            clock.advance(2)
        status, detail = finding()
        assert status is Status.WARN
        assert "1 fire(s) abandoned by a dead consumer in the last hour" in detail
        assert f"run {run_id} (crashy) 8 death(s)" in detail  # the ninth is still claimed
        clock.advance(2 * 3600)  # two hours later only the budget is worth a word
        status, detail = finding()
        assert status is Status.WARN
        assert detail.startswith("0 fire(s) abandoned")


def test_doctor_still_warns_once_a_fire_was_dead_lettered_for_its_deaths(
    db_path: Path, clock: ManualClock
) -> None:
    """The fire a crash-looping consumer got dead-lettered a minute ago is the finding most
    worth a warning (from the attacker: doctor said PASS, 'no open fire lost its consumer')."""
    from engine.governance.doctor import DoctorContext, Status  # noqa: PLC0415
    from engine.governance.execution_checks import ConsumerDeaths  # noqa: PLC0415

    with open_engine(db_path, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec(
                name="crashy", trigger=IntervalTrigger(3600 * SECOND_MS, 0), command="noop"
            ),
            actor="test",
        )
        engine.service.pause("crashy", actor="test")
        run_id = engine.service.trigger("crashy", actor="test").id
        for n in range(3):  # three consumers die holding it
            claim = engine.storage.fire_queue.claim(consumer=f"dead-{n}", ttl_ms=1_000, limit=1)
            assert [f.run_id for f in claim.fires] == [run_id]
            clock.advance(2)
        consumer = engine.consumer(consumer_id="c", concurrency=1, consumer_deaths=2)
        try:
            for _ in range(50):
                consumer.step()
                if engine.storage.runs.get(run_id).state is RunState.DEAD_LETTERED:  # type: ignore[union-attr]
                    break
        finally:
            consumer.stop()
        assert engine.storage.runs.get(run_id).state is RunState.DEAD_LETTERED  # type: ignore[union-attr]
        clock.advance(60)  # a minute later
        ctx = DoctorContext(
            engine.storage, engine.clock, db_path, diagnostics=engine.storage.diagnostics()
        )
        found = ConsumerDeaths().run(ctx)
        assert found.status is Status.WARN, found
        assert "1 fire(s) abandoned by a dead consumer in the last hour" in found.detail
