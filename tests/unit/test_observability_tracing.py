"""Spans through the OpenTelemetry API (the `otel` extra), recorded by a minimal tracer provider
written against the API alone (no SDK needed); and a true no-op without the package."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine import (
    CommandRegistry,
    Engine,
    IntervalTrigger,
    ManualClock,
    RetryPolicy,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.domain.timeutil import SECOND_MS
from engine.observability import Tracing, tracing
from tests.conftest import T0
from tests.helpers import settle

try:
    from opentelemetry import trace
except ImportError:
    pytest.skip("the otel extra (opentelemetry-api) is not installed", allow_module_level=True)

_ids = itertools.count(1)


class Recorded(trace.Span):
    """A span that keeps what it is told."""

    context: trace.SpanContext

    def __init__(
        self, name: str, parent: Any, attributes: Mapping[str, Any] | None, start: int | None
    ) -> None:
        self.name = name
        self.parent = parent if isinstance(parent, Recorded) else None
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.start_time = start or time.time_ns()
        self.end_time: int | None = None
        self.status: Any = None
        self.exceptions: list[BaseException] = []
        trace_id = self.parent.context.trace_id if self.parent else next(_ids)
        self.context = trace.SpanContext(
            trace_id, next(_ids), is_remote=False, trace_flags=trace.TraceFlags(1)
        )

    def end(self, end_time: int | None = None) -> None:
        self.end_time = end_time or time.time_ns()

    def get_span_context(self) -> Any:
        return self.context

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
        pass

    def update_name(self, name: str) -> None:
        self.name = name

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_status(self, status: Any, description: str | None = None) -> None:
        self.status = status

    def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        self.exceptions.append(exception)


class Recorder(trace.Tracer):
    def __init__(self) -> None:
        self.spans: list[Recorded] = []
        self._lock = threading.Lock()

    def start_span(
        self,
        name: str,
        context: Any = None,
        kind: Any = None,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[Any] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Recorded:
        span = Recorded(name, trace.get_current_span(context), attributes, start_time)
        with self._lock:
            self.spans.append(span)
        return span

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Vortos starts its spans with start_span")

    def named(self, name: str) -> list[Recorded]:
        with self._lock:
            return [s for s in self.spans if s.name == name]


class Provider(trace.TracerProvider):
    def __init__(self) -> None:
        self.tracer = Recorder()

    def get_tracer(self, *args: Any, **kwargs: Any) -> Recorder:
        return self.tracer


@pytest.fixture
def provider() -> Provider:
    return Provider()


@pytest.fixture
def spans(provider: Provider) -> Tracing:
    made = tracing(provider)
    assert made is not None
    return made


inner: list[Any] = []


def nested() -> str:
    """A command that makes its own span: it must nest in the run's."""
    inner.append(trace.get_current_span().get_span_context())
    return "ok"


def fails() -> None:
    raise RuntimeError("planned failure")


@pytest.fixture
def engine(db_path: Path, clock: ManualClock) -> Iterator[Engine]:
    registry: CommandRegistry = builtin_commands()
    registry.register("nested", nested)
    registry.register("fails", fails)
    with open_engine(db_path, clock=clock, commands=registry) as opened:
        yield opened


def every_minute(name: str, command: str = "noop", **extra: Any) -> ScheduleSpec:
    return ScheduleSpec(
        name=name, trigger=IntervalTrigger(60 * SECOND_MS, T0), command=command, **extra
    )


def test_a_dispatch_transaction_is_one_span_with_a_child_per_fire(
    engine: Engine, clock: ManualClock, provider: Provider, spans: Tracing
) -> None:
    engine.service.create(every_minute("a"), actor="t")
    engine.service.create(every_minute("b", tenant="acme"), actor="t")
    settle(engine.daemon(node_id="n1", observer=spans))
    (dispatch,) = provider.tracer.named("vortos.dispatch")
    assert dispatch.attributes["vortos.fires"] == 2
    assert dispatch.attributes["vortos.result"] == "ok"
    assert dispatch.attributes["vortos.node"] == "n1"
    assert dispatch.end_time is not None
    assert dispatch.end_time >= dispatch.start_time
    fires = provider.tracer.named("vortos.fire")
    assert {(f.attributes["vortos.tenant"], f.attributes["vortos.schedule"]) for f in fires} == {
        ("default", "a"),
        ("acme", "b"),
    }
    for fire in fires:
        assert fire.parent is dispatch
        assert fire.attributes["vortos.result"] == "dispatched"
        assert fire.attributes["vortos.slot"].endswith("@2026-01-05T00:00:00+00:00")
        assert "vortos.duration_ms" in fire.attributes


def test_a_run_is_a_span_current_while_its_command_runs(
    engine: Engine, provider: Provider, spans: Tracing
) -> None:
    inner.clear()
    engine.service.create(every_minute("n", "nested"), actor="t")
    settle(engine.daemon(node_id="n1"))
    consumer = engine.consumer(consumer_id="c1", observer=spans)
    drive(consumer, lambda: bool(provider.tracer.named("vortos.run")) and consumer.busy == 0)
    (run,) = provider.tracer.named("vortos.run")
    assert run.attributes["vortos.schedule"] == "n"
    assert run.attributes["vortos.tenant"] == "default"
    assert run.attributes["vortos.attempt"] == 1
    assert run.attributes["vortos.result"] == "completed"
    assert run.attributes["vortos.duration_ms"] >= 0
    assert run.end_time is not None
    assert inner == [run.context]  # the command saw the run's span as the current one


def test_a_failed_attempt_is_a_run_span_with_an_error_status(
    engine: Engine, provider: Provider, spans: Tracing
) -> None:
    engine.service.create(every_minute("f", "fails", retry=RetryPolicy(max_attempts=1)), actor="t")
    settle(engine.daemon(node_id="n1"))
    consumer = engine.consumer(consumer_id="c1", observer=spans)
    drive(consumer, lambda: bool(provider.tracer.named("vortos.run")) and consumer.busy == 0)
    (run,) = provider.tracer.named("vortos.run")
    assert run.attributes["vortos.result"] == "dead_lettered"
    assert run.status.status_code is trace.StatusCode.ERROR


def drive(consumer: Any, until: Any) -> None:
    deadline = time.monotonic() + 10
    while not until():
        assert time.monotonic() < deadline, "timed out"
        consumer.step()
        time.sleep(0.002)
