"""Keeping plug-ins that are secondary to firing (audit sinks, metrics backends) from ever
delaying it.

Each such plug-in is called only from a thread of its own. A `Guard` counts what its calls
came to: returned, raised, or still running past the plug-in timeout (a hang: counted once per
call, logged, and shown by doctor through the health report). A call is never interrupted (a
Python thread cannot be), so a hung plug-in holds only its own thread; the runtime's hooks
reach a metrics plug-in through a bounded queue and are dropped, and counted, while it is
behind.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine.domain.clock import Clock
from engine.observability.observer import Observer
from engine.ports.plugin_state import PluginHealth

log = logging.getLogger("vortos.plugins")

ERROR = "error"
TIMEOUT = "timeout"
DROPPED = "dropped"
FAILURE_REASONS = (ERROR, TIMEOUT, DROPPED)

# A plug-in that fails on every call logs its first failures, then one line in this many.
_LOG_EVERY = 100
METRICS_QUEUE = 10_000

FailureHook = Callable[[str, str, str], None]  # (port, plugin, reason)


class Guard:
    """What one plug-in's calls came to. Thread-safe; `call` runs on the plug-in's thread."""

    def __init__(
        self,
        port: str,
        plugin: str,
        clock: Clock,
        timeout_ms: int,
        on_failure: FailureHook | None = None,
    ) -> None:
        self.port = port
        self.plugin = plugin
        self._clock = clock
        self._timeout_s = timeout_ms / 1000
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self.calls = 0
        self.failures = 0
        self.timeouts = 0
        self.dropped = 0
        self.last_error: str | None = None
        self.last_error_at: int | None = None
        self._busy_since: int | None = None  # the clock's instant, for reports
        self._started: float | None = None  # monotonic, for the timeout
        self._timed_out = False  # the running call was already counted as hung

    def call(self, action: Callable[..., Any], *args: Any) -> bool:
        """Run `action(*args)` here; True when it returned. A plug-in's exception is counted
        and logged, never raised."""
        with self._lock:
            self._busy_since = self._clock.now_ms()
            self._started = time.monotonic()
            self._timed_out = False
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001 - whatever a plug-in raises is its failure
            self._failed(ERROR, f"{type(exc).__name__}: {exc}")
            return False
        finally:
            with self._lock:
                self._busy_since = None
                self._started = None
        with self._lock:
            self.calls += 1
        return True

    def check_timeout(self) -> None:
        """Count the running call as hung once it is past the timeout (the health reporter
        calls this; the call itself keeps its thread until it returns)."""
        with self._lock:
            started, counted = self._started, self._timed_out
            if started is None or counted or time.monotonic() - started < self._timeout_s:
                return
            self._timed_out = True
        self._failed(
            TIMEOUT, f"a call has not returned after {self._timeout_s:g}s (plugin_timeout)"
        )

    def drop(self) -> None:
        """An event was not handed to the plug-in: it is behind."""
        with self._lock:
            self.dropped += 1
            first = self.dropped == 1
        if first:
            log.warning(
                "%s %s is behind: events are being dropped (counted in "
                "vortos_plugin_failures_total{reason=dropped})",
                self.port,
                self.plugin,
            )
        if self._on_failure is not None:
            self._on_failure(self.port, self.plugin, DROPPED)

    def report(self, node_id: str, backlog: int = 0) -> PluginHealth:
        with self._lock:
            return PluginHealth(
                node_id=node_id,
                port=self.port,
                plugin=self.plugin,
                calls=self.calls,
                failures=self.failures,
                timeouts=self.timeouts,
                dropped=self.dropped,
                busy_since=self._busy_since,
                backlog=backlog,
                last_error=self.last_error,
                last_error_at=self.last_error_at,
                reported_at=self._clock.now_ms(),
            )

    def _failed(self, reason: str, error: str) -> None:
        with self._lock:
            if reason == TIMEOUT:
                self.timeouts += 1
                count = self.timeouts
            else:
                self.failures += 1
                count = self.failures
            self.last_error = error
            self.last_error_at = self._clock.now_ms()
        if count <= 3 or count % _LOG_EVERY == 0:
            log.warning(
                "%s %s failed (%s, %d so far): %s; firing goes on",
                self.port,
                self.plugin,
                reason,
                count,
                error,
            )
        if self._on_failure is not None:
            self._on_failure(self.port, self.plugin, reason)


class IsolatedObserver(Observer):
    """A metrics plug-in (an Observer) behind a queue and a thread of its own: every hook the
    runtime calls returns at once, whatever the plug-in does.

    `running` is not forwarded (its watch would have to wrap the command on the worker's
    thread); a plug-in learns each run's duration from `settled`.
    """

    def __init__(self, plugin: Observer, guard: Guard) -> None:
        self.plugin = plugin
        self.guard = guard
        self.active = plugin.active
        self._events: queue.Queue[tuple[str, tuple[Any, ...], dict[str, Any]] | None] = queue.Queue(
            METRICS_QUEUE
        )
        self._thread = threading.Thread(
            target=self._deliver, name=f"vortos-metrics-{guard.plugin}", daemon=True
        )
        self._thread.start()

    @property
    def backlog(self) -> int:
        return self._events.qsize()

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued (for up to `timeout_s`), then stop the thread."""
        try:
            self._events.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _forward(self, hook: str, *args: Any, **kwargs: Any) -> None:
        try:
            self._events.put_nowait((hook, args, kwargs))
        except queue.Full:
            self.guard.drop()

    def _deliver(self) -> None:
        while (event := self._events.get()) is not None:
            hook, args, kwargs = event
            self.guard.call(lambda h=hook, a=args, k=kwargs: getattr(self.plugin, h)(*a, **k))

    # -- every hook but `running`, forwarded ------------------------------------------------

    def daemon_started(self, lease: str, node_id: str) -> None:
        self._forward("daemon_started", lease, node_id)

    def tick(self, seconds: float) -> None:
        self._forward("tick", seconds)

    def dispatched(self, report: Any, facts: Any) -> None:
        self._forward("dispatched", report, facts)

    def dispatch_failed(self, error: Exception, facts: Any) -> None:
        self._forward("dispatch_failed", error, facts)

    def held_back(self, due: Sequence[Any]) -> None:
        self._forward("held_back", list(due))

    def breaker_changed(self, breaker: str, state: str) -> None:
        self._forward("breaker_changed", breaker, state)

    def lease_contended(self, lease: str) -> None:
        self._forward("lease_contended", lease)

    def leader_changed(self, lease: str, change: Any) -> None:
        self._forward("leader_changed", lease, change)

    def audit_append_failed(self, event: str) -> None:
        self._forward("audit_append_failed", event)

    def claimed(self, claim: Any, unrun: Sequence[Any]) -> None:
        self._forward("claimed", claim, list(unrun))

    def settled(self, fire: Any, settlement: Any, ran_s: float | None, *, acked: bool) -> None:
        self._forward("settled", fire, settlement, ran_s, acked=acked)

    def commands_ignoring_cancel(self, count: int) -> None:
        self._forward("commands_ignoring_cancel", count)

    def runs_pruned(self, tenant: str, count: int) -> None:
        self._forward("runs_pruned", tenant, count)

    def prune_finished(self, seconds: float, trigger: Any) -> None:
        self._forward("prune_finished", seconds, trigger)

    def deadman_verdicts(self, verdicts: Iterable[Any]) -> None:
        self._forward("deadman_verdicts", list(verdicts))

    def plugin_failed(self, port: str, plugin: str, reason: str) -> None:
        # Not forwarded: a metrics plug-in hearing of its own failures could loop on them.
        return
