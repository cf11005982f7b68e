"""What a running command knows about its fire, and how it tells the consumer what happened."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.domain.run import RunKind


class CommandCancelled(Exception):
    """Raised inside a command (by `FireContext.check_cancelled`) when it was asked to stop."""


class PermanentFailure(Exception):
    """Raise from a command for a failure that retrying cannot fix: the run ends `failed`."""


class RescheduleFire(Exception):
    """Raise from a command to run the same fire again after `delay_ms` (not a failure)."""

    def __init__(self, delay_ms: int, reason: str = "") -> None:
        super().__init__(reason or f"rescheduled in {delay_ms} ms")
        self.delay_ms = max(0, delay_ms)


class CommandFailed(Exception):
    """A failure with what the command printed (the process command raises it)."""

    def __init__(
        self, message: str, *, output: str | None = None, exit_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.output = output
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command may return to have its output and exit code recorded in the run."""

    output: str | None = None
    exit_code: int | None = None


@dataclass(slots=True)
class FireContext:
    """The identity of the fire a command runs for, so the command can be idempotent, and its
    cancellation.

    Vortos dispatches every slot exactly once and settles every run exactly once, but runs a
    command at least once: a consumer killed after the command returned and before its
    settlement was written leaves the fire claimed, and it is run again once the claim
    expires. `idempotency_key` is what makes that harmless. The recipe: record the key in the
    same transaction as the command's effect, in a table where it is unique, and skip the
    effect when it is there already::

        @schedulable
        def bill(fire: FireContext) -> None:
            with db.transaction() as tx:
                done = tx.execute(
                    "INSERT INTO processed (key) VALUES (%s) ON CONFLICT DO NOTHING",
                    (fire.idempotency_key,),
                ).rowcount
                if done:  # 0: an earlier execution of this fire committed the effect
                    tx.execute("UPDATE accounts SET ...")

    A process command finds the key in its environment as VORTOS_IDEMPOTENCY_KEY.
    """

    run_id: int
    tenant: str
    schedule_id: str
    schedule_name: str
    slot_key: str
    slot_at: int
    kind: RunKind
    attempt: int  # 1 for the first attempt
    cancel_reason: str | None = None
    # This run's time limit (its schedule's, else its command's; None: none): once it has
    # passed, the run is asked to stop (see engine.runtime.time_limits).
    timeout_ms: int | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _on_cancel: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def idempotency_key(self) -> str:
        """The fire's slot key: the same across its retries, its re-executions after a
        consumer died and an operator's requeue, and unique per tenant (a schedule's id and
        the slot's instant, or a manual fire's nonce)."""
        return self.slot_key

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop (cancel-other, a time limit, shutdown, a lost
        claim)."""
        return self._cancelled.is_set()

    def check_cancelled(self) -> None:
        """Raise CommandCancelled if the run was asked to stop: call it between units of work."""
        if self._cancelled.is_set():
            raise CommandCancelled("the run was asked to stop")

    def wait_cancelled(self, seconds: float) -> bool:
        """Sleep up to `seconds` (real time), waking at once when asked to stop."""
        return self._cancelled.wait(seconds)

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from another thread) when the run is asked to stop; at once if it
        was already."""
        with self._lock:
            if not self._cancelled.is_set():
                self._on_cancel.append(callback)
                return
        callback()

    def cancel(self, reason: str) -> None:
        """Ask the run to stop (the consumer calls this)."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self.cancel_reason = reason
            self._cancelled.set()
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()
