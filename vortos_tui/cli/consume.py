"""`vortos consume`: consumers only, on as many processes or hosts as needed."""

from __future__ import annotations

import logging

import typer

from engine.api import default_node_id
from vortos_tui.cli.context import open_to_serve, state
from vortos_tui.cli.output import handles_errors
from vortos_tui.cli.workers import (
    DEFAULT_CONSUMERS,
    ClaimTtl,
    Consumers,
    Grace,
    LogLevel,
    NodeId,
    build_consumer,
    check_node_id,
    configure_logging,
    consumer_settings,
    on_stop_signals,
)

log = logging.getLogger("vortos.consume")


@handles_errors
def consume(
    ctx: typer.Context,
    consumers: Consumers = DEFAULT_CONSUMERS,
    claim_ttl: ClaimTtl = "60s",
    grace: Grace = "30s",
    node_id: NodeId = None,
    log_level: LogLevel = "info",
) -> None:
    """Run fires' commands (claimed from the queue; nothing is dispatched here).

    Knows the built-in commands and, with --app, the app's. Stops on SIGTERM or SIGINT:
    no new claims, running commands get the grace to finish, then exit 0.
    """
    configure_logging(log_level)
    check_node_id(node_id)
    settings = consumer_settings(consumers, claim_ttl, grace)
    node = node_id or default_node_id()
    cli = state(ctx)
    names = cli.commands().names()
    with open_to_serve(ctx) as engine:
        consumer = build_consumer(engine, node, settings)
        on_stop_signals(consumer.stop)
        log.info(
            "consumer %s on %s: %d thread(s), commands %s",
            node,
            cli.db,
            settings.concurrency,
            ", ".join(names),
        )
        consumer.run()
        log.info("stopped")
