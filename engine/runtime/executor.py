"""Running one fire's command and turning what happened into a settlement.

Runs in a consumer's worker thread. Sync commands are called directly; async ones run on the
thread's own event loop. Whatever the command does (returns, raises, hangs until cancelled),
the result is one Settlement; nothing a command raises escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import traceback
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from engine.commands.context import (
    CommandCancelled,
    CommandFailed,
    CommandResult,
    FireContext,
    PermanentFailure,
    RescheduleFire,
)
from engine.commands.registry import Command
from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.run import RunState
from engine.domain.timeutil import format_duration
from engine.ports.enqueuer import Enqueuer
from engine.ports.fire_queue import Fire, Outcome, Settlement

log = logging.getLogger("vortos.consumer")

# In the error of a run whose command ignored its cancellation (doctor looks for it).
IGNORED_CANCEL = "the command ignored its cancellation and went on running"

# Room for a process's stdout and stderr tails (4 KiB each) with their headers.
OUTPUT_MAX = 9000
ERROR_MAX = 2000


class CancelReason(StrEnum):
    OVERLAP = "a newer fire of the schedule started (overlap policy cancel-other)"
    TIMEOUT = "the run outran its time limit"
    SHUTDOWN = "the consumer is shutting down"
    LOST_CLAIM = "the claim was taken over by another consumer"


def execute(
    command: Command | None,
    fire: Fire,
    ctx: FireContext,
    retry: Callable[[], RetryPolicy],
    clock: Clock,
    runner: Callable[[Any], Any] | None = None,
) -> Settlement:
    """Run `fire` with `command` (None: not known here) and decide its settlement.

    `retry` gives the schedule's retry policy, asked only when the attempt failed. `runner`
    runs a coroutine to completion on this thread's event loop (default asyncio.run).
    """
    if command is None:
        return _failed(fire, retry(), clock, f"command {fire.command!r} is not registered here")
    try:
        kwargs = _arguments(command, fire, ctx)
    except InvalidInput as exc:
        return _final(fire, clock, RunState.FAILED, f"the payload no longer fits: {exc}")
    # The command is called in this frame, not a helper's: _trace starts a traceback without
    # the command's own code (a callable object) at the frame below this one.
    try:
        if command.is_async:
            returned = (runner or asyncio.run)(_cancellable(command, kwargs, ctx))
        else:
            returned = command.run(**kwargs)
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 (a command may raise anything)
        return _settle_raised(exc, command, fire, ctx, retry, clock)
    output, code = _output(returned)
    if ctx.cancel_reason == CancelReason.TIMEOUT:
        # It stopped when asked, past its limit: what it returned is not the run's success.
        return timed_out(fire, retry(), clock, ctx.timeout_ms or 0, ignored=False, output=output)
    return Settlement(
        fire.run_id,
        Outcome.COMPLETE,
        RunState.COMPLETED,
        output=output,
        exit_code=code,
        finished_at=clock.now_ms(),
    )


def _arguments(command: Command, fire: Fire, ctx: FireContext) -> dict[str, Any]:
    """The command's keyword arguments: the payload checked (InvalidInput when it no longer
    fits) and the fire's context, when the command takes one."""
    # Against the command as registered now (it may have changed since the fire was
    # written). The payload's shape and size were checked when it was stored: only the
    # command's own parameters and check are asked again.
    payload = command.schema.validate(command.name, fire.payload)
    if command.check is not None:
        payload = command.check(payload)
    kwargs: dict[str, Any] = dict(payload)
    if command.schema.context_parameter is not None:
        kwargs[command.schema.context_parameter] = ctx
    return kwargs


def _settle_raised(
    exc: BaseException,
    command: Command,
    fire: Fire,
    ctx: FireContext,
    retry: Callable[[], RetryPolicy],
    clock: Clock,
) -> Settlement:
    """The settlement of an attempt whose command raised `exc`, checked most specific first."""
    if isinstance(exc, RescheduleFire):
        return Settlement(
            fire.run_id,
            Outcome.RESCHEDULE,
            RunState.DISPATCHED,
            error=None,
            output=_clip(str(exc), OUTPUT_MAX),
            finished_at=clock.now_ms(),
            available_at=clock.now_ms() + exc.delay_ms,
        )
    if ctx.cancel_reason == CancelReason.TIMEOUT:
        # Whatever it raised once asked to stop for its time limit (CommandCancelled, a
        # CancelledError, a killed process's CommandFailed): the attempt timed out.
        return timed_out(
            fire,
            retry(),
            clock,
            ctx.timeout_ms or 0,
            ignored=False,
            output=exc.output if isinstance(exc, CommandFailed) else _trace(exc, command),
            exit_code=exc.exit_code if isinstance(exc, CommandFailed) else None,
        )
    if isinstance(exc, (CommandCancelled, asyncio.CancelledError)):
        if ctx.cancelled:
            return _cancelled(fire, ctx, clock)
        return _failed(fire, retry(), clock, _describe(exc), _trace(exc, command))
    if isinstance(exc, PermanentFailure):
        return _final(fire, clock, RunState.FAILED, _describe(exc), _trace(exc, command))
    if isinstance(exc, CommandFailed):
        if ctx.cancelled:
            return _cancelled(fire, ctx, clock, output=exc.output, exit_code=exc.exit_code)
        return _failed(fire, retry(), clock, str(exc), exc.output, exc.exit_code)
    if ctx.cancelled:
        return _cancelled(fire, ctx, clock, output=_trace(exc, command))
    return _failed(fire, retry(), clock, _describe(exc), _trace(exc, command))


async def _cancellable(command: Command, kwargs: dict[str, Any], ctx: FireContext) -> Any:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        if task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to cancel
                loop.call_soon_threadsafe(task.cancel)

    ctx.on_cancel(cancel)
    return await command.run(**kwargs)


def _cancelled(
    fire: Fire,
    ctx: FireContext,
    clock: Clock,
    *,
    output: str | None = None,
    exit_code: int | None = None,
) -> Settlement:
    if ctx.cancel_reason != CancelReason.OVERLAP:
        # Stopped by a shutdown or a lost claim, not by a decision about this run: give the
        # fire back so another consumer runs it (a lost claim's release is simply stale).
        return Settlement(fire.run_id, Outcome.RELEASE, RunState.DISPATCHED)
    return Settlement(
        fire.run_id,
        Outcome.COMPLETE,
        RunState.CANCELLED,
        error=f"cancelled: {ctx.cancel_reason}",
        output=output,
        exit_code=exit_code,
        finished_at=clock.now_ms(),
    )


def unstarted(fire: Fire, ctx: FireContext, clock: Clock) -> Settlement:
    """The settlement of a fire asked to stop before its command started (it waited for a
    worker): cancelled by cancel-other, or given back (a shutdown, a lost claim)."""
    return _cancelled(fire, ctx, clock)


def hand_over(
    enqueuer: Enqueuer, fire: Fire, retry: Callable[[], RetryPolicy], clock: Clock
) -> Settlement:
    """Give `fire` to the enqueuer's transport instead of running it here: completed once the
    transport took it, retried (then dead-lettered) like a failing command when it raised."""
    try:
        enqueuer.enqueue(fire)
    except Exception as exc:  # noqa: BLE001 - an enqueuer may raise anything; it is recorded
        return _failed(fire, retry(), clock, f"the enqueuer refused it: {_describe(exc)}")
    return Settlement(
        fire.run_id,
        Outcome.COMPLETE,
        RunState.COMPLETED,
        output=_clip(f"handed to enqueuer {type(enqueuer).__name__}", OUTPUT_MAX),
        finished_at=clock.now_ms(),
    )


def _failed(
    fire: Fire,
    retry: RetryPolicy,
    clock: Clock,
    error: str,
    output: str | None = None,
    exit_code: int | None = None,
    *,
    expired: bool = False,
) -> Settlement:
    """A failed attempt: retried after a backoff, or, when none are left, dead-lettered (or
    left `timed_out` when it outran its time limit: `expired`). Only failures count against
    the retry budget: not the attempts rescheduled, given back, or lost with their consumer."""
    now = clock.now_ms()
    failures = fire.failures + 1  # this attempt's included
    if retry.exhausted(failures):
        since = " since its requeue" if fire.requeued_at_attempt else ""
        return Settlement(
            fire.run_id,
            Outcome.DISCARD,
            RunState.TIMED_OUT if expired else RunState.DEAD_LETTERED,
            error=_clip(f"failed {failures} of {retry.max_attempts} attempts{since}: {error}"),
            output=_clip(output, OUTPUT_MAX),
            exit_code=exit_code,
            finished_at=now,
            timed_out=expired,
        )
    return Settlement(
        fire.run_id,
        Outcome.FAIL,
        RunState.DISPATCHED,
        error=_clip(error),
        output=_clip(output, OUTPUT_MAX),
        exit_code=exit_code,
        finished_at=now,
        available_at=now + retry.delay_ms(fire.run_id, failures),
        timed_out=expired,
    )


def timed_out(
    fire: Fire,
    retry: RetryPolicy,
    clock: Clock,
    limit_ms: int,
    *,
    ignored: bool,
    output: str | None = None,
    exit_code: int | None = None,
) -> Settlement:
    """The settlement of an attempt that outran its time limit: a failure (retried per the
    policy), the run `timed_out` once no retry is left. `ignored`: the command did not stop
    when asked (it still holds its worker thread)."""
    error = f"timed out after {format_duration(limit_ms)}" + (
        f" ({IGNORED_CANCEL})" if ignored else ""
    )
    return _failed(fire, retry, clock, error, output, exit_code, expired=True)


def _final(
    fire: Fire, clock: Clock, state: RunState, error: str, output: str | None = None
) -> Settlement:
    return Settlement(
        fire.run_id,
        Outcome.DISCARD,
        state,
        error=_clip(error),
        output=_clip(output, OUTPUT_MAX),
        finished_at=clock.now_ms(),
    )


def abandoned_too_often(fire: Fire, deaths: int, clock: Clock) -> Settlement | None:
    """A fire whose consumer vanished more than `deaths` times since its last requeue (a
    command that kills its process, say) is dead-lettered without running again. Deaths have
    their own budget (setting consumer_deaths): a crash-looping cluster must not use up the
    retry budget of healthy fires."""
    if fire.round_deaths <= deaths:
        return None
    return _final(
        fire,
        clock,
        RunState.DEAD_LETTERED,
        f"abandoned: {fire.round_deaths} consumer deaths (attempts that ended with their "
        f"consumer gone; last: {fire.last_abandoned_by}), more than consumer_deaths={deaths}; "
        "not run again",
    )


def _output(returned: Any) -> tuple[str | None, int | None]:
    if isinstance(returned, CommandResult):
        return _clip(returned.output, OUTPUT_MAX), returned.exit_code
    if returned is None:
        return None, None
    if isinstance(returned, str):
        return _clip(returned, OUTPUT_MAX), None
    try:
        text = json.dumps(returned, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(returned)
    return _clip(text, OUTPUT_MAX), None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _trace(exc: BaseException, command: Command) -> str:
    """The traceback from the command's own frame down: the executor's and the event loop's
    frames above it say nothing about the failure."""
    code = getattr(command.run, "__code__", None) or getattr(
        getattr(command.run, "__func__", None), "__code__", None
    )
    tb = exc.__traceback__
    start = tb.tb_next if tb is not None else None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            start = tb
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, start))


def _clip(text: str | None, limit: int = ERROR_MAX) -> str | None:
    """The tail of `text`: the end of an output or a traceback says the most."""
    if text is None or len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :]
