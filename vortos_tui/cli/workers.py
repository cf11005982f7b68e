"""Options and the signal handling shared by `vortos run` and `vortos consume`."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from engine import Engine, FireQueueConsumer, open_read_model
from engine.domain.database import Database, PlainDatabase
from engine.domain.errors import InvalidInput
from engine.domain.redact import ScrubbingFormatter
from engine.domain.timeutil import format_duration, parse_duration
from engine.governance.deadman import DeadmanWatch, Judgement
from engine.observability import (
    NULL_OBSERVER,
    MetricsServer,
    Observer,
    Observers,
    PruneTrigger,
    ScheduleVerdict,
    serve_metrics,
    tracing,
)
from engine.plugins.runtime import Builder, Runtime, build_runtime
from engine.ports.enqueuer import Enqueuer
from engine.retention import PruneReport, attach_sweeper
from engine.runtime.consumer import DEFAULT_CONCURRENCY, DEFAULT_CONSUMER_DEATHS, MIN_CLAIM_TTL_MS
from engine.runtime.isolation import FAILURE_REASONS
from vortos_tui.cli.context import CliState

if TYPE_CHECKING:
    # Loaded only when metrics are asked for: they import prometheus_client.
    from engine.observability import PrometheusMetrics, StoreGauges

log = logging.getLogger("vortos.run")

LOG_LEVELS = ("debug", "info", "warning", "error")

Consumers = Annotated[
    int,
    typer.Option(
        "--consumers", min=1, max=256, help="Worker threads that run commands in this process."
    ),
]
ClaimTtl = Annotated[
    str,
    typer.Option(
        "--claim-ttl",
        help="How long a claimed fire stays ours without a heartbeat; a killed consumer's "
        "fires are run again after it.",
    ),
]
Grace = Annotated[
    str,
    typer.Option(
        "--grace",
        help="On SIGTERM, how long running commands may take to finish before their fires are "
        "given back.",
    ),
]
NodeId = Annotated[
    str | None,
    typer.Option("--node-id", help="This node's name in leases and runs [default: host:pid]."),
]
LogLevel = Annotated[
    str,
    typer.Option("--log-level", help="debug, info, warning or error.", envvar="VORTOS_LOG_LEVEL"),
]

MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        envvar="VORTOS_METRICS_PORT",
        min=1,
        max=65535,
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (9464 is the usual port) "
        "[default: no metrics].",
        show_default=False,
    ),
]
MetricsHost = Annotated[
    str,
    typer.Option(
        "--metrics-host",
        envvar="VORTOS_METRICS_HOST",
        help="The address the metrics are served on (0.0.0.0: every interface; they name "
        "tenants and schedules).",
    ),
]
Tracing = Annotated[
    bool,
    typer.Option(
        "--tracing/--no-tracing",
        envvar="VORTOS_TRACING",
        help="A span per dispatch transaction and per run through OpenTelemetry, when "
        "opentelemetry-api is installed (the otel extra) and the process configures an SDK "
        "(opentelemetry-instrument, say); otherwise nothing.",
    ),
]

DEFAULT_CONSUMERS = DEFAULT_CONCURRENCY


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    concurrency: int
    claim_ttl_ms: int
    grace_ms: int
    consumer_deaths: int = DEFAULT_CONSUMER_DEATHS


def configure_logging(level: str) -> None:
    if level.lower() not in LOG_LEVELS:
        raise InvalidInput(f"log level {level!r} is unknown: use one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(ScrubbingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def check_node_id(node_id: str | None) -> None:
    if node_id is not None and (
        len(node_id) > 200 or not node_id.isprintable() or not node_id.strip()
    ):
        raise InvalidInput("--node-id must be printable text of at most 200 characters")


def consumer_settings(
    consumers: int, claim_ttl: str, grace: str, consumer_deaths: int = DEFAULT_CONSUMER_DEATHS
) -> ConsumerSettings:
    """`consumer_deaths` comes from the settings (vortos.toml, VORTOS_CONSUMER_DEATHS), which
    checked its range."""
    ttl = parse_duration(claim_ttl, what="claim TTL")
    if ttl < MIN_CLAIM_TTL_MS:
        raise InvalidInput(f"claim TTL {format_duration(ttl)} is too short: use at least 1s")
    return ConsumerSettings(consumers, ttl, parse_duration(grace, what="grace"), consumer_deaths)


def build_consumer(
    engine: Engine,
    node: str,
    settings: ConsumerSettings,
    observer: Observer = NULL_OBSERVER,
    enqueuer: Enqueuer | None = None,
) -> FireQueueConsumer:
    return engine.consumer(
        consumer_id=node,
        concurrency=settings.concurrency,
        claim_ttl_ms=settings.claim_ttl_ms,
        grace_ms=settings.grace_ms,
        observer=observer,
        enqueuer=enqueuer,
        consumer_deaths=settings.consumer_deaths,
    )


def start_plugins(
    engine: Engine, cli: CliState, node: str, telemetry: Telemetry, *, ship_audit: bool
) -> Runtime:
    """Build the enqueuer, metrics backends and (with `ship_audit`) audit sinks the settings
    select; their failures are counted by this process's metrics. Metrics backends join the
    telemetry observer. Close the result before the database."""
    builder = Builder(engine.storage, engine.clock, cli.db, node, cli.settings)
    counted = telemetry.observer
    runtime = build_runtime(
        cli.plugins(),
        builder,
        timeout_ms=cli.settings.plugin_timeout,
        on_failure=counted.plugin_failed,
        ship_audit=ship_audit,
    )
    if telemetry.metrics is not None:
        # Every series from zero, so that an alert on increase() sees the first failure.
        for guard in runtime.guards:
            for reason in FAILURE_REASONS:
                telemetry.metrics.plugin_failures.labels(guard.port, guard.plugin, reason)
    if runtime.metrics:
        telemetry.observer = Observers(counted, *runtime.observers())
    return runtime


@dataclass
class Telemetry:
    """This process's metrics and tracing, as one observer for the daemon and consumers."""

    observer: Observer = NULL_OBSERVER
    metrics: PrometheusMetrics | None = None
    server: MetricsServer | None = None
    gauges: list[StoreGauges] = field(default_factory=list)
    url: str | None = None
    tracing: bool = False
    deadman: DeadmanWatch | None = None

    def describe(self) -> str:
        """For the start-up log line."""
        parts = [f"metrics on {self.url}" if self.url else "no metrics"]
        if self.tracing:
            parts.append("spans through OpenTelemetry")
        return ", ".join(parts)

    def watch(self, engine: Engine, db: Database | PlainDatabase) -> None:
        """Add the gauges read from the store on each scrape, and report the retention
        sweeps this process runs."""
        if self.metrics is not None:
            from engine.observability import watch  # noqa: PLC0415 (see TYPE_CHECKING above)

            self.gauges.append(
                watch(self.metrics.registry, engine.storage, open_read_model(db), engine.clock)
            )
            observer = self.observer

            def verdicts(found: list[Judgement]) -> None:
                observer.deadman_verdicts(
                    ScheduleVerdict(j.schedule.tenant, j.schedule.name, j.verdict.value)
                    for j in found
                )

            self.deadman = DeadmanWatch(
                engine.storage.schedules, engine.storage.runs, engine.clock, verdicts
            ).start()
        if self.observer.active:
            attach_sweeper(
                engine.commands, engine.storage, engine.clock, on_report=_prunes(self.observer)
            )

    def close(self) -> None:
        """Stop serving (idempotent): before the database closes, so no scrape reads it."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
        deadman, self.deadman = self.deadman, None
        if deadman is not None:
            deadman.close()
        gauges, self.gauges = self.gauges, []
        for each in gauges:
            each.close()


def _prunes(observer: Observer) -> Callable[[PruneReport], None]:
    """A retention sweep's report, as the observer's prune metrics."""

    def report(sweep: PruneReport) -> None:
        if sweep.dry_run:
            return
        for tenant, pruned in sweep.tenants.items():
            observer.runs_pruned(tenant, pruned.runs)
        observer.prune_finished(sweep.duration_s, PruneTrigger(sweep.trigger))

    return report


def start_telemetry(metrics_port: int | None, metrics_host: str, tracing_on: bool) -> Telemetry:
    """Serve metrics (binding the port now: one in use fails here, before anything runs) and
    set up tracing, as asked."""
    telemetry = Telemetry()
    observers: list[Observer] = []
    if metrics_port is not None:
        from prometheus_client import disable_created_metrics  # noqa: PLC0415 (only with metrics)

        from engine.observability import PrometheusMetrics  # noqa: PLC0415 (the same)

        # The *_created series double the series count and tell nothing a restart does not.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        telemetry.metrics = PrometheusMetrics()
        telemetry.server = serve_metrics(telemetry.metrics.registry, metrics_port, metrics_host)
        observers.append(telemetry.metrics)
        telemetry.url = f"http://{metrics_host}:{telemetry.server.port}/metrics"
    if tracing_on:
        spans = tracing()
        if spans is not None:
            observers.append(spans)
            telemetry.tracing = True
    if observers:
        telemetry.observer = observers[0] if len(observers) == 1 else Observers(*observers)
    return telemetry


def on_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `stop` (once each; the loops then wind down)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


class ServiceThread:
    """One of the service's loops on a thread of its own. If it ends with an error (the
    database stayed unreadable, say), `on_failure` stops the rest of the service and `join`
    raises that error where the service waits for its loops: the service ends with its one
    line and exit code, rather than run on without that loop."""

    def __init__(
        self, target: Callable[[], None], name: str, on_failure: Callable[[], None]
    ) -> None:
        self._target = target
        self._on_failure = on_failure
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> ServiceThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._target()
        except BaseException as exc:  # noqa: BLE001 (raised again by join, on the main thread)
            log.error("%s stopped: %s", self._thread.name, exc)
            self.failure = exc
            self._on_failure()

    def join(self) -> None:
        self._thread.join()
        if self.failure is not None:
            raise self.failure


def start_consumer(consumer: FireQueueConsumer, on_failure: Callable[[], None]) -> ServiceThread:
    return ServiceThread(consumer.run, "vortos-consumer", on_failure).start()
