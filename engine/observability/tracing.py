"""Tracing with OpenTelemetry, when its API is installed (the `otel` extra).

This module imports nothing from OpenTelemetry until `tracing()` is called, and `tracing()`
returns None when the package is absent: without the extra there is no import cost and no
error. With the API but no SDK configured, spans are OpenTelemetry's own no-ops; an SDK set up
by the application (or `opentelemetry-instrument`) makes them real.

Spans:
- `vortos.dispatch`, one per dispatch transaction (its duration is the transaction's), with a
  child `vortos.fire` per slot it dispatched when the trace is sampled (recording). One span per
  transaction keeps the unsampled cost at one no-op span however many slots a backlog puts in a
  transaction; the per-fire children make "did this schedule's 02:00 slot fire, and how late"
  answerable from the tracing backend.
- `vortos.run`, one per attempt at running a fire's command, current while the command runs
  (a command's own spans become its children).
"""

from __future__ import annotations

from types import ModuleType, TracebackType
from typing import Any

from engine.domain.timeutil import iso_utc
from engine.observability.observer import DispatchFacts, Observer, RunWatch, run_result
from engine.ports.dispatch import DispatchReport
from engine.ports.fire_queue import Fire, Outcome, Settlement

TRACER_NAME = "vortos"
_FAILED = frozenset({Outcome.FAIL, Outcome.DISCARD})


def tracing(tracer_provider: Any | None = None) -> Tracing | None:
    """A tracing observer on `tracer_provider` (default: OpenTelemetry's global one), or None
    when opentelemetry-api is not installed."""
    try:
        from opentelemetry import trace  # noqa: PLC0415 (optional: imported only when asked)
    except ImportError:
        return None
    return Tracing(trace, trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider))


class Tracing(Observer):
    """Spans for dispatch transactions, their fires, and runs. Build with `tracing()`."""

    def __init__(self, trace: ModuleType, tracer: Any) -> None:
        self._trace = trace
        self._tracer = tracer

    def dispatched(self, report: DispatchReport, facts: DispatchFacts) -> None:
        end = facts.started_ns + int(facts.seconds * 1e9)
        span = self._tracer.start_span(
            "vortos.dispatch",
            start_time=facts.started_ns,
            attributes={
                "vortos.node": facts.node_id,
                "vortos.result": "ok",
                "vortos.fires": len(report.dispatched),
                "vortos.already_dispatched": report.already_dispatched,
                "vortos.schedules": report.scanned,
                "vortos.misfire_skipped": report.skipped_missed,
                "vortos.dropped_catchup_age": report.dropped_aged,
                "vortos.duration_ms": facts.seconds * 1000,
            },
        )
        if span.is_recording() and report.dispatched:
            parent = self._trace.set_span_in_context(span)
            commit_ms = facts.now_ms + facts.seconds * 1000
            for fire in report.dispatched:
                self._tracer.start_span(
                    "vortos.fire",
                    context=parent,
                    start_time=facts.started_ns,
                    attributes={
                        "vortos.schedule": fire.schedule_name,
                        "vortos.schedule_id": fire.schedule_id,
                        "vortos.tenant": fire.tenant,
                        "vortos.slot": fire.slot_key,
                        "vortos.slot_at": iso_utc(fire.slot_at),
                        "vortos.run_id": fire.run_id,
                        "vortos.result": "dispatched",
                        "vortos.lateness_ms": max(0.0, commit_ms - fire.due_at),
                        "vortos.duration_ms": facts.seconds * 1000,
                    },
                ).end(end_time=end)
        span.end(end_time=end)

    def dispatch_failed(self, error: Exception, facts: DispatchFacts) -> None:
        span = self._tracer.start_span(
            "vortos.dispatch",
            start_time=facts.started_ns,
            attributes={
                "vortos.node": facts.node_id,
                "vortos.result": "error",
                "vortos.duration_ms": facts.seconds * 1000,
            },
        )
        span.record_exception(error)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))
        span.end(end_time=facts.started_ns + int(facts.seconds * 1e9))

    def running(self, fire: Fire) -> RunWatch:
        return _RunSpan(self._trace, self._tracer, fire)


class _RunSpan(RunWatch):
    def __init__(self, trace: ModuleType, tracer: Any, fire: Fire) -> None:
        self._trace = trace
        self._span = tracer.start_span(
            "vortos.run",
            attributes={
                "vortos.schedule": fire.schedule_name,
                "vortos.schedule_id": fire.schedule_id,
                "vortos.tenant": fire.tenant,
                "vortos.slot": fire.slot_key,
                "vortos.slot_at": iso_utc(fire.slot_at),
                "vortos.run_id": fire.run_id,
                "vortos.attempt": fire.attempts,
                "vortos.command": fire.command,
                "vortos.kind": fire.kind.value,
            },
        )
        self._current: Any = None

    def __enter__(self) -> RunWatch:
        # The span is current while the command runs, so the command's own spans nest in it.
        self._current = self._trace.use_span(self._span, end_on_exit=False)
        self._current.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._current is not None:
                self._current.__exit__(kind, value, tb)
        finally:
            self._span.end()

    def finished(self, settlement: Settlement, seconds: float) -> None:
        self._span.set_attributes(
            {"vortos.result": run_result(settlement), "vortos.duration_ms": seconds * 1000}
        )
        if settlement.outcome in _FAILED:
            self._span.set_status(
                self._trace.Status(self._trace.StatusCode.ERROR, settlement.error or "failed")
            )
