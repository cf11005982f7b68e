"""execute(): what a command did, turned into one Settlement.

Commands are called through `execute` directly, with fires built here; cancellation comes from
another thread, as the consumer's heartbeat delivers it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from engine.commands.context import (
    CommandCancelled,
    CommandFailed,
    CommandResult,
    FireContext,
    PermanentFailure,
    RescheduleFire,
)
from engine.commands.registry import command_from
from engine.domain.clock import ManualClock
from engine.domain.retry import JITTER_SHARE, RetryPolicy
from engine.domain.run import RunKind, RunState
from engine.ports.fire_queue import Fire, Outcome, Settlement
from engine.runtime import executor as executor_module
from engine.runtime.executor import OUTPUT_MAX, CancelReason, abandoned_too_often, execute

RUN_ID = 41
POLICY = RetryPolicy(max_attempts=3, backoff_ms=2_000, backoff_cap_ms=300_000)
WAIT_S = 10.0  # the most any test waits for another thread; reached only when it fails


def _fire(command: str = "job", payload: dict[str, Any] | None = None, attempts: int = 1) -> Fire:
    return Fire(
        run_id=RUN_ID,
        tenant="default",
        schedule_id="sched-1",
        schedule_name="nightly",
        slot_key="sched-1@2026-01-05T00:00:00+00:00",
        slot_at=0,
        kind=RunKind.SCHEDULED,
        command=command,
        payload={} if payload is None else payload,
        available_at=0,
        created_at=0,
        attempts=attempts,
        failures=attempts - 1,  # the attempts before this one failed
    )


def _context(fire: Fire) -> FireContext:
    return FireContext(
        run_id=fire.run_id,
        tenant=fire.tenant,
        schedule_id=fire.schedule_id,
        schedule_name=fire.schedule_name,
        slot_key=fire.slot_key,
        slot_at=fire.slot_at,
        kind=fire.kind,
        attempt=fire.attempts,
    )


def _policy(policy: RetryPolicy = POLICY) -> Callable[[], RetryPolicy]:
    return lambda: policy


def _run(
    fn: Callable[..., Any],
    clock: ManualClock,
    *,
    payload: dict[str, Any] | None = None,
    attempts: int = 1,
    policy: RetryPolicy = POLICY,
) -> Settlement:
    fire = _fire(payload=payload, attempts=attempts)
    return execute(command_from("job", fn), fire, _context(fire), _policy(policy), clock)


def _failing() -> None:
    raise ValueError("the disk is full")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as workers:
        yield workers


# --- success ---------------------------------------------------------------------------------


def test_a_returned_string_completes_the_run_with_it_as_output(clock: ManualClock) -> None:
    def job() -> str:
        return "sent 3 invoices"

    settlement = _run(job, clock)
    assert settlement == Settlement(
        RUN_ID,
        Outcome.COMPLETE,
        RunState.COMPLETED,
        output="sent 3 invoices",
        finished_at=clock.now_ms(),
    )


def test_a_returned_dict_is_recorded_as_json(clock: ManualClock) -> None:
    def job() -> dict[str, Any]:
        return {"sent": 3, "to": ["a", "b"], "note": "ünïcode"}

    settlement = _run(job, clock)
    assert settlement.outcome is Outcome.COMPLETE
    assert settlement.output == '{"sent": 3, "to": ["a", "b"], "note": "ünïcode"}'


def test_returning_nothing_records_no_output(clock: ManualClock) -> None:
    def job() -> None:
        pass

    settlement = _run(job, clock)
    assert (settlement.run_state, settlement.output, settlement.exit_code) == (
        RunState.COMPLETED,
        None,
        None,
    )


def test_a_command_result_records_its_output_and_exit_code(clock: ManualClock) -> None:
    def job() -> CommandResult:
        return CommandResult(output="done", exit_code=0)

    settlement = _run(job, clock)
    assert (settlement.run_state, settlement.output, settlement.exit_code) == (
        RunState.COMPLETED,
        "done",
        0,
    )


def test_a_long_output_keeps_its_tail(clock: ManualClock) -> None:
    text = "".join(f"line {i}\n" for i in range(2_000))

    def job() -> str:
        return text

    output = _run(job, clock).output
    assert output is not None
    assert len(output) == OUTPUT_MAX
    assert output == "…" + text[-(OUTPUT_MAX - 1) :]


def test_the_payload_is_passed_as_keyword_arguments(clock: ManualClock) -> None:
    def job(region: str, count: int = 1) -> str:
        return f"{region}x{count}"

    assert _run(job, clock, payload={"region": "eu", "count": 2}).output == "eux2"


def test_the_fire_context_is_passed_to_a_command_that_asks_for_it(clock: ManualClock) -> None:
    def job(*, fire: FireContext) -> str:
        return f"{fire.run_id} {fire.schedule_name} {fire.attempt} {fire.slot_key}"

    assert _run(job, clock, attempts=2).output == (
        f"{RUN_ID} nightly 2 sched-1@2026-01-05T00:00:00+00:00"
    )


def test_the_retry_policy_is_not_asked_when_the_attempt_succeeds(clock: ManualClock) -> None:
    def job() -> None:
        pass

    def no_policy() -> RetryPolicy:
        raise AssertionError("asked for the retry policy")

    fire = _fire()
    settlement = execute(command_from("job", job), fire, _context(fire), no_policy, clock)
    assert settlement.outcome is Outcome.COMPLETE


# --- failure, retry and dead letters ---------------------------------------------------------


def test_an_exception_fails_the_attempt_and_retries_after_the_policys_delay(
    clock: ManualClock,
) -> None:
    settlement = _run(_failing, clock, attempts=1)
    assert settlement.outcome is Outcome.FAIL
    assert settlement.run_state is RunState.DISPATCHED
    assert settlement.error == "ValueError: the disk is full"
    assert settlement.finished_at == clock.now_ms()
    assert settlement.available_at == clock.now_ms() + POLICY.delay_ms(RUN_ID, 1)


def test_the_retry_delay_grows_with_the_attempt_number(clock: ManualClock) -> None:
    policy = RetryPolicy(max_attempts=5, backoff_ms=2_000, backoff_cap_ms=300_000)
    delays = []
    for attempt in range(1, 5):
        settlement = _run(_failing, clock, attempts=attempt, policy=policy)
        assert settlement.outcome is Outcome.FAIL
        assert settlement.available_at is not None
        delays.append(settlement.available_at - clock.now_ms())
    assert delays == [policy.delay_ms(RUN_ID, a) for a in range(1, 5)]
    assert delays == sorted(set(delays))
    for attempt, delay in enumerate(delays, start=1):
        base = 2_000 * 2 ** (attempt - 1)
        assert base <= delay <= base * (1 + JITTER_SHARE)


def test_the_retry_delay_is_capped_and_still_spread_by_jitter(clock: ManualClock) -> None:
    policy = RetryPolicy(max_attempts=10, backoff_ms=60_000, backoff_cap_ms=100_000)
    waits = set()
    for attempt in range(2, 10):
        settlement = _run(_failing, clock, attempts=attempt, policy=policy)
        assert settlement.available_at is not None
        wait = settlement.available_at - clock.now_ms()
        assert 100_000 <= wait <= 100_000 * (1 + JITTER_SHARE)
        waits.add(wait)
    assert len(waits) > 1


@pytest.mark.parametrize("attempt", [1, 2, 3, 4])
def test_the_retry_jitter_is_at_most_a_quarter_of_the_backoff(attempt: int) -> None:
    base = 2_000 * 2 ** (attempt - 1)
    delays = [POLICY.delay_ms(run_id, attempt) for run_id in range(1, 201)]
    assert all(base <= d <= base * (1 + JITTER_SHARE) for d in delays)
    assert len(set(delays)) > 100  # fires that failed together spread out
    assert max(delays) > base * (1 + JITTER_SHARE * 0.9)


def test_the_last_attempt_failing_dead_letters_the_fire(clock: ManualClock) -> None:
    settlement = _run(_failing, clock, attempts=POLICY.max_attempts)
    assert settlement.outcome is Outcome.DISCARD
    assert settlement.run_state is RunState.DEAD_LETTERED
    assert settlement.error == "failed 3 of 3 attempts: ValueError: the disk is full"
    assert settlement.available_at is None
    assert settlement.finished_at == clock.now_ms()


def test_a_fire_with_a_single_attempt_is_dead_lettered_at_its_first_failure(
    clock: ManualClock,
) -> None:
    settlement = _run(_failing, clock, policy=RetryPolicy(max_attempts=1))
    assert settlement.run_state is RunState.DEAD_LETTERED


def test_the_traceback_is_the_output_and_starts_at_the_commands_frame(clock: ManualClock) -> None:
    output = _run(_failing, clock).output
    assert output is not None
    lines = output.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].endswith("in _failing")
    assert lines[-1] == "ValueError: the disk is full"
    assert f'"{executor_module.__file__}"' not in output


def test_the_traceback_of_an_async_command_starts_at_the_commands_frame(
    clock: ManualClock,
) -> None:
    async def failing_async() -> None:
        await asyncio.sleep(0)
        raise ValueError("the disk is full")

    output = _run(failing_async, clock).output
    assert output is not None
    assert output.splitlines()[1].endswith("in failing_async")


def test_a_command_failed_records_its_message_output_and_exit_code(clock: ManualClock) -> None:
    def job() -> None:
        raise CommandFailed("backup exited with status 2", output="no space", exit_code=2)

    settlement = _run(job, clock)
    assert settlement.outcome is Outcome.FAIL
    assert (settlement.error, settlement.output, settlement.exit_code) == (
        "backup exited with status 2",
        "no space",
        2,
    )


def test_an_exception_without_a_message_is_named_by_its_type(clock: ManualClock) -> None:
    def job() -> None:
        raise KeyError

    assert _run(job, clock).error == "KeyError"


def test_a_permanent_failure_fails_the_run_without_retrying(clock: ManualClock) -> None:
    def job() -> None:
        raise PermanentFailure("the customer account is closed")

    settlement = _run(job, clock, attempts=1)
    assert settlement.outcome is Outcome.DISCARD
    assert settlement.run_state is RunState.FAILED
    assert settlement.error == "PermanentFailure: the customer account is closed"
    assert settlement.available_at is None
    assert settlement.output is not None
    assert "in job" in settlement.output


def test_reschedule_runs_the_fire_again_after_its_delay_without_an_error(
    clock: ManualClock,
) -> None:
    def job() -> None:
        raise RescheduleFire(30_000, "the upstream file is not there yet")

    settlement = _run(job, clock)
    assert settlement == Settlement(
        RUN_ID,
        Outcome.RESCHEDULE,
        RunState.DISPATCHED,
        error=None,
        output="the upstream file is not there yet",
        finished_at=clock.now_ms(),
        available_at=clock.now_ms() + 30_000,
    )


def test_a_negative_reschedule_delay_means_at_once(clock: ManualClock) -> None:
    def job() -> None:
        raise RescheduleFire(-5)

    settlement = _run(job, clock)
    assert settlement.available_at == clock.now_ms()
    assert settlement.output == "rescheduled in -5 ms"


def test_a_payload_that_no_longer_fits_fails_the_run_without_calling_the_command(
    clock: ManualClock,
) -> None:
    called = []

    def job(region: str) -> None:
        called.append(region)

    settlement = _run(job, clock, payload={"region": 7})
    assert settlement.outcome is Outcome.DISCARD
    assert settlement.run_state is RunState.FAILED
    assert settlement.error is not None
    assert settlement.error.startswith("the payload no longer fits: ")
    assert "field 'region' of command 'job' must be a string" in settlement.error
    assert called == []


def test_a_command_not_registered_here_fails_the_attempt(clock: ManualClock) -> None:
    fire = _fire(command="gone")
    settlement = execute(None, fire, _context(fire), _policy(), clock)
    assert settlement.outcome is Outcome.FAIL
    assert settlement.error == "command 'gone' is not registered here"


def test_command_cancelled_raised_without_a_cancellation_is_a_failed_attempt(
    clock: ManualClock,
) -> None:
    def job(*, fire: FireContext) -> None:
        del fire
        raise CommandCancelled("gave up on its own")

    settlement = _run(job, clock)
    assert settlement.outcome is Outcome.FAIL
    assert settlement.error == "CommandCancelled: gave up on its own"


# --- async commands --------------------------------------------------------------------------


def test_an_async_command_runs_to_completion(clock: ManualClock) -> None:
    async def job(n: int, *, fire: FireContext) -> str:
        await asyncio.sleep(0)
        return f"{n} for run {fire.run_id}"

    assert _run(job, clock, payload={"n": 3}).output == f"3 for run {RUN_ID}"


def test_an_async_command_runs_on_the_runner_given(clock: ManualClock) -> None:
    async def job() -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": 1}

    fire = _fire()
    with asyncio.Runner() as runner:
        settlement = execute(
            command_from("job", job), fire, _context(fire), _policy(), clock, runner.run
        )
        assert json.loads(settlement.output or "") == {"n": 1}
        assert not runner.get_loop().is_closed()  # the loop is the runner's, reused


def test_an_async_command_that_raises_fails_the_attempt(clock: ManualClock) -> None:
    async def job() -> None:
        await asyncio.sleep(0)
        raise ValueError("async failure")

    settlement = _run(job, clock)
    assert settlement.outcome is Outcome.FAIL
    assert settlement.error == "ValueError: async failure"


# --- cancellation ----------------------------------------------------------------------------


def _start(
    pool: ThreadPoolExecutor, fn: Callable[..., Any], clock: ManualClock
) -> tuple[Future[Settlement], FireContext]:
    fire = _fire()
    ctx = _context(fire)
    running = pool.submit(execute, command_from("job", fn), fire, ctx, _policy(), clock)
    return running, ctx


def _waiting_command(started: threading.Event) -> Callable[..., None]:
    """A sync command that waits for cancellation between units of work."""

    def job(*, fire: FireContext) -> None:
        started.set()
        while not fire.wait_cancelled(WAIT_S):
            pass
        fire.check_cancelled()

    return job


def _awaiting_command(started: threading.Event) -> Callable[..., Any]:
    async def job() -> None:
        started.set()
        await asyncio.sleep(60)

    return job


def _cancel_when_started(
    running: Future[Settlement], ctx: FireContext, started: threading.Event, reason: CancelReason
) -> Settlement:
    assert started.wait(WAIT_S), "the command did not start"
    ctx.cancel(reason)
    return running.result(timeout=WAIT_S)


def test_a_sync_command_cancelled_for_overlap_ends_cancelled(
    clock: ManualClock, pool: ThreadPoolExecutor
) -> None:
    started = threading.Event()
    running, ctx = _start(pool, _waiting_command(started), clock)
    settlement = _cancel_when_started(running, ctx, started, CancelReason.OVERLAP)
    assert settlement.outcome is Outcome.COMPLETE
    assert settlement.run_state is RunState.CANCELLED
    assert settlement.error == f"cancelled: {CancelReason.OVERLAP}"
    assert settlement.finished_at == clock.now_ms()


@pytest.mark.parametrize("reason", [CancelReason.SHUTDOWN, CancelReason.LOST_CLAIM])
def test_a_sync_command_stopped_by_shutdown_or_a_lost_claim_releases_the_fire(
    clock: ManualClock, pool: ThreadPoolExecutor, reason: CancelReason
) -> None:
    started = threading.Event()
    running, ctx = _start(pool, _waiting_command(started), clock)
    settlement = _cancel_when_started(running, ctx, started, reason)
    assert settlement == Settlement(RUN_ID, Outcome.RELEASE, RunState.DISPATCHED)


def test_an_exception_raised_after_cancellation_ends_cancelled_with_its_traceback(
    clock: ManualClock, pool: ThreadPoolExecutor
) -> None:
    started = threading.Event()

    def job(*, fire: FireContext) -> None:
        started.set()
        fire.wait_cancelled(WAIT_S)
        raise OSError("connection reset while stopping")

    running, ctx = _start(pool, job, clock)
    settlement = _cancel_when_started(running, ctx, started, CancelReason.OVERLAP)
    assert settlement.run_state is RunState.CANCELLED
    assert settlement.output is not None
    assert "OSError: connection reset while stopping" in settlement.output


def test_an_async_command_cancelled_while_awaiting_ends_cancelled(
    clock: ManualClock, pool: ThreadPoolExecutor
) -> None:
    started = threading.Event()
    running, ctx = _start(pool, _awaiting_command(started), clock)
    settlement = _cancel_when_started(running, ctx, started, CancelReason.OVERLAP)
    assert settlement.outcome is Outcome.COMPLETE
    assert settlement.run_state is RunState.CANCELLED


def test_an_async_command_stopped_by_shutdown_releases_the_fire(
    clock: ManualClock, pool: ThreadPoolExecutor
) -> None:
    started = threading.Event()
    running, ctx = _start(pool, _awaiting_command(started), clock)
    settlement = _cancel_when_started(running, ctx, started, CancelReason.SHUTDOWN)
    assert settlement.outcome is Outcome.RELEASE


def test_an_async_command_cancelled_before_it_awaits_stops_at_its_first_await(
    clock: ManualClock,
) -> None:
    reached = []

    async def job() -> None:
        reached.append("started")
        await asyncio.sleep(60)
        reached.append("slept")

    fire = _fire()
    ctx = _context(fire)
    ctx.cancel(CancelReason.OVERLAP)
    settlement = execute(command_from("job", job), fire, ctx, _policy(), clock)
    assert settlement.run_state is RunState.CANCELLED
    assert reached == ["started"]


def test_a_cancelled_command_failed_keeps_its_output_and_exit_code(clock: ManualClock) -> None:
    def job(*, fire: FireContext) -> None:
        fire.cancel(CancelReason.OVERLAP)  # as if the consumer asked while it ran
        raise CommandFailed("killed", output="partial", exit_code=-15)

    settlement = _run(job, clock)
    assert settlement.run_state is RunState.CANCELLED
    assert (settlement.output, settlement.exit_code) == ("partial", -15)


def test_cancel_callbacks_run_once_even_when_cancelled_twice() -> None:
    ctx = _context(_fire())
    calls: list[str] = []
    ctx.on_cancel(lambda: calls.append("first"))
    ctx.cancel(CancelReason.OVERLAP)
    ctx.cancel(CancelReason.SHUTDOWN)
    ctx.on_cancel(lambda: calls.append("late"))  # registered after: called at once
    assert calls == ["first", "late"]
    assert ctx.cancel_reason == CancelReason.OVERLAP


# --- abandoned fires -------------------------------------------------------------------------


def test_a_fire_whose_consumer_died_more_often_than_the_death_budget_is_dead_lettered(
    clock: ManualClock,
) -> None:
    fire = replace(
        _fire(attempts=POLICY.max_attempts + 1),
        abandoned_count=3,
        last_abandoned_by="node-7:4242",
    )
    settlement = abandoned_too_often(fire, 2, clock)
    assert settlement is not None
    assert settlement.outcome is Outcome.DISCARD
    assert settlement.run_state is RunState.DEAD_LETTERED
    assert settlement.error == (
        "abandoned: 3 consumer deaths (attempts that ended with their consumer gone; last: "
        "node-7:4242), more than consumer_deaths=2; not run again"
    )
    assert settlement.finished_at == clock.now_ms()


def test_deaths_within_their_budget_do_not_stop_a_fire_whatever_its_retry_budget(
    clock: ManualClock,
) -> None:
    fire = replace(_fire(attempts=POLICY.max_attempts + 5), abandoned_count=3)
    assert abandoned_too_often(fire, 3, clock) is None


def test_deaths_before_a_requeue_are_not_counted_again(clock: ManualClock) -> None:
    fire = replace(_fire(attempts=9), abandoned_count=5, abandoned_at_requeue=4)
    assert fire.round_deaths == 1
    assert abandoned_too_often(fire, 1, clock) is None


def test_only_failures_count_against_the_retry_budget(clock: ManualClock) -> None:
    # Five reschedules and a dead consumer before: seven claims, this the first failure.
    fire = replace(_fire(attempts=7), failures=0, reschedules=5, abandoned_count=1)
    policy = RetryPolicy(max_attempts=2)
    settlement = execute(
        command_from("job", _failing), fire, _context(fire), _policy(policy), clock
    )
    assert settlement.outcome is Outcome.FAIL
    again = replace(fire, attempts=8, failures=1)
    last = execute(command_from("job", _failing), again, _context(again), _policy(policy), clock)
    assert last.run_state is RunState.DEAD_LETTERED
    assert last.error == "failed 2 of 2 attempts: ValueError: the disk is full"
