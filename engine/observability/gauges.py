"""Gauges read from the store when Prometheus scrapes: nothing is polled in between.

A scrape runs on one of the HTTP server's short-lived threads; the reads run on one long-lived
thread of this collector instead, so they reuse one connection (the SQLite backend keeps one
per thread) and a slow store delays a scrape by at most `timeout_s`, then the scrape goes on
without these gauges.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from engine.domain.clock import Clock
from engine.domain.errors import VortosError
from engine.ports.fire_queue import FireState
from engine.ports.read_model import ReadModel
from engine.ports.storage import Storage

log = logging.getLogger("vortos.metrics")

# The oldest waiting fire is looked for among this many of the oldest open fires (those before
# it may be running).
OLDEST_WINDOW = 64
SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class StoreReading:
    active_schedules: int
    open_fires: int
    dead_letters: int
    oldest_pending_age_s: float


class StoreGauges(Collector):
    """vortos_active_schedules, vortos_fire_queue_depth, vortos_fire_queue_dead_letters and
    vortos_fire_queue_oldest_pending_age_seconds, read on each scrape."""

    def __init__(
        self,
        storage: Storage,
        read_model: ReadModel,
        clock: Clock,
        *,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self._storage = storage
        self._read_model = read_model
        self._clock = clock
        self._timeout_s = timeout_s
        self._reader = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="vortos-metrics"
        )

    def read(self) -> StoreReading:
        """One reading, on the calling thread."""
        now = self._clock.now_ms()
        overview = asyncio.run(self._read_model.overview(now))
        oldest = 0.0
        for fire in self._storage.fire_queue.pending(limit=OLDEST_WINDOW):
            if fire.state_at(now) is FireState.CLAIMABLE:
                oldest = max(0.0, (now - fire.available_at) / 1000)
                break
        return StoreReading(overview.active, overview.open_fires, overview.dead_letters, oldest)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registering asks for this; without it the registry would collect (read the store).
        yield from _families(None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reading: StoreReading | None = None
        try:
            reading = self._reader.submit(self.read).result(self._timeout_s)
        except (VortosError, concurrent.futures.TimeoutError, RuntimeError) as exc:
            # RuntimeError: the reader was shut down (the process is stopping).
            log.warning("metrics: the store could not be read for this scrape: %s", exc)
        yield from _families(reading)

    def close(self) -> None:
        self._reader.shutdown(wait=False, cancel_futures=True)


def _families(reading: StoreReading | None) -> Iterator[GaugeMetricFamily]:
    values: list[tuple[str, str, float | None]] = [
        (
            "vortos_active_schedules",
            "Schedules whose status is active.",
            None if reading is None else reading.active_schedules,
        ),
        (
            "vortos_fire_queue_depth",
            "Open fires: waiting, running, or waiting for a retry.",
            None if reading is None else reading.open_fires,
        ),
        (
            "vortos_fire_queue_dead_letters",
            "Dead letters in the fire queue now (until requeued or purged).",
            None if reading is None else reading.dead_letters,
        ),
        (
            "vortos_fire_queue_oldest_pending_age_seconds",
            "How long the oldest fire available to run and not claimed has waited (0: none).",
            None if reading is None else reading.oldest_pending_age_s,
        ),
    ]
    for name, text, value in values:
        family = GaugeMetricFamily(name, text)
        if value is not None:
            family.add_metric([], value)
        yield family


def watch(
    registry: CollectorRegistry, storage: Storage, read_model: ReadModel, clock: Clock
) -> StoreGauges:
    """Add the store's gauges to `registry`; `close()` the result when done."""
    gauges = StoreGauges(storage, read_model, clock)
    registry.register(gauges)
    return gauges
