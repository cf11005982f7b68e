"""`vortos consume`: consumers only, on as many processes or hosts as needed."""

from __future__ import annotations

import contextlib
import logging

import typer

from engine.api import default_node_id
from engine.observability import DEFAULT_METRICS_HOST
from vortos_tui.cli.context import configured, open_to_serve, state
from vortos_tui.cli.output import handles_errors
from vortos_tui.cli.workers import (
    DEFAULT_CONSUMERS,
    ClaimTtl,
    Consumers,
    Grace,
    LogLevel,
    MetricsHost,
    MetricsPort,
    NodeId,
    Tracing,
    build_consumer,
    check_node_id,
    configure_logging,
    consumer_settings,
    on_stop_signals,
    start_plugins,
    start_telemetry,
)

log = logging.getLogger("vortos.consume")


@handles_errors
def consume(
    ctx: typer.Context,
    consumers: Consumers = DEFAULT_CONSUMERS,
    claim_ttl: ClaimTtl = "60s",
    grace: Grace = "30s",
    node_id: NodeId = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = DEFAULT_METRICS_HOST,
    trace: Tracing = True,
    log_level: LogLevel = "info",
) -> None:
    """Run fires' commands (claimed from the queue; nothing is dispatched here).

    Knows the built-in commands and, with --app, the app's. Stops on SIGTERM or SIGINT:
    no new claims, running commands get the grace to finish, then exit 0.
    """
    # Each option not given here comes from the settings (vortos.toml, VORTOS_*, defaults).
    consumers = configured(ctx, "consumers")
    claim_ttl = configured(ctx, "claim_ttl")
    grace = configured(ctx, "grace")
    metrics_port = configured(ctx, "metrics_port")
    metrics_host = configured(ctx, "metrics_host")
    log_level = configured(ctx, "log_level")
    configure_logging(log_level)
    check_node_id(node_id)
    cli = state(ctx)
    settings = consumer_settings(consumers, claim_ttl, grace, cli.settings.consumer_deaths)
    node = node_id or default_node_id()
    cli.serving = True  # it runs fires: its own allowlists, whatever socket the env names
    names = cli.commands().names()
    cli.plugins()  # a missing or broken plug-in stops us before anything is opened
    with contextlib.ExitStack() as serving:
        # A metrics port in use fails here, before the database is opened.
        telemetry = start_telemetry(metrics_port, metrics_host, trace)
        serving.callback(telemetry.close)
        engine = serving.enter_context(open_to_serve(ctx, node_id=node))
        serving.callback(telemetry.close)  # again, first: no scrape once the database closes
        telemetry.watch(engine, cli.db)
        # Metrics backends and the enqueuer; audit sinks are fed by `vortos run`'s leader.
        plugins = start_plugins(engine, cli, node, telemetry, ship_audit=False)
        serving.callback(plugins.close)
        consumer = build_consumer(engine, node, settings, telemetry.observer, plugins.enqueuer)
        plugins.start(leading=None)
        on_stop_signals(consumer.stop)
        log.info(
            "consumer %s on %s: %d thread(s), commands %s; %s",
            node,
            cli.db,
            settings.concurrency,
            ", ".join(names),
            telemetry.describe(),
        )
        consumer.run()
        log.info("stopped")
