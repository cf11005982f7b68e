"""Options and the signal handling shared by `vortos run` and `vortos consume`."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Annotated

import typer

from engine import Engine, FireQueueConsumer
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import format_duration, parse_duration
from engine.runtime.consumer import DEFAULT_CONCURRENCY, MIN_CLAIM_TTL_MS

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

DEFAULT_CONSUMERS = DEFAULT_CONCURRENCY


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    concurrency: int
    claim_ttl_ms: int
    grace_ms: int


def configure_logging(level: str) -> None:
    if level.lower() not in LOG_LEVELS:
        raise InvalidInput(f"log level {level!r} is unknown: use one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        force=True,
    )


def check_node_id(node_id: str | None) -> None:
    if node_id is not None and (
        len(node_id) > 200 or not node_id.isprintable() or not node_id.strip()
    ):
        raise InvalidInput("--node-id must be printable text of at most 200 characters")


def consumer_settings(consumers: int, claim_ttl: str, grace: str) -> ConsumerSettings:
    ttl = parse_duration(claim_ttl, what="claim TTL")
    if ttl < MIN_CLAIM_TTL_MS:
        raise InvalidInput(f"claim TTL {format_duration(ttl)} is too short: use at least 1s")
    return ConsumerSettings(consumers, ttl, parse_duration(grace, what="grace"))


def build_consumer(engine: Engine, node: str, settings: ConsumerSettings) -> FireQueueConsumer:
    return engine.consumer(
        consumer_id=node,
        concurrency=settings.concurrency,
        claim_ttl_ms=settings.claim_ttl_ms,
        grace_ms=settings.grace_ms,
    )


def on_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `stop` (once each; the loops then wind down)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def start_consumer(consumer: FireQueueConsumer) -> threading.Thread:
    thread = threading.Thread(target=consumer.run, name="vortos-consumer")
    thread.start()
    return thread
