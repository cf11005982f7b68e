"""`vortos run`: the headless daemon."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Annotated

import typer

from engine.api import default_node_id
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import format_duration, parse_duration
from engine.runtime.daemon import MAX_LOOKAHEAD_MS, MIN_LEASE_TTL_MS
from vortos_tui.cli.context import open_for_write, operator, state
from vortos_tui.cli.demo import seed_demo
from vortos_tui.cli.output import handles_errors

log = logging.getLogger("vortos.run")

LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str) -> None:
    if level.lower() not in LOG_LEVELS:
        raise InvalidInput(f"log level {level!r} is unknown: use one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        force=True,
    )


@handles_errors
def run(
    ctx: typer.Context,
    lease_ttl: Annotated[
        str,
        typer.Option(
            "--lease-ttl", help="Leader lease time to live; a standby takes over within it."
        ),
    ] = "15s",
    node_id: Annotated[
        str | None,
        typer.Option("--node-id", help="This node's name in leases and runs [default: host:pid]."),
    ] = None,
    lookahead: Annotated[
        str,
        typer.Option(
            "--lookahead",
            help="Dispatch slots up to this long before they are due (0 to 10s); their fires "
            "still become available at the due instant. Helps bursts of thousands of slots due "
            "at once; a pause within it no longer stops a slot already dispatched.",
        ),
    ] = "0",
    demo: Annotated[
        bool,
        typer.Option(
            "--demo", help="First add a few demo schedules (tenant 'demo') if they are missing."
        ),
    ] = False,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level", help="debug, info, warning or error.", envvar="VORTOS_LOG_LEVEL"
        ),
    ] = "info",
) -> None:
    """Run the scheduler: lead (or stand by), and dispatch every due slot exactly once.

    Stops cleanly on SIGTERM or SIGINT, releasing the lease so a standby takes over at once.
    """
    configure_logging(log_level)
    ttl = parse_duration(lease_ttl, what="lease TTL")
    if ttl < MIN_LEASE_TTL_MS:
        raise InvalidInput(f"lease TTL {format_duration(ttl)} is too short: use at least 1s")
    ahead = parse_duration(lookahead, what="lookahead")
    if ahead > MAX_LOOKAHEAD_MS:
        raise InvalidInput(f"lookahead {lookahead!r} is too long: at most 10s")
    node = node_id or default_node_id()
    if node_id is not None and (
        len(node_id) > 200 or not node_id.isprintable() or not node_id.strip()
    ):
        raise InvalidInput("--node-id must be printable text of at most 200 characters")
    with open_for_write(ctx) as engine:
        if demo:
            added = seed_demo(engine, operator())
            log.info("demo schedules: %s", ", ".join(added) if added else "already present")
        daemon = engine.daemon(node_id=node, lease_ttl_ms=ttl, lookahead_ms=ahead)

        def stop(signum: int, _frame: FrameType | None) -> None:
            log.info(
                "received %s: finishing the tick and releasing the lease",
                signal.Signals(signum).name,
            )
            daemon.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("vortos %s on %s (lease ttl %s)", node, state(ctx).db, format_duration(ttl))
        daemon.run()
        log.info("stopped")
