"""Feeding audit sinks (engine.ports.audit_sink) from the audit chains.

The chains in the database are the record; each sink gets a copy, in order and without gaps,
from the position stored for it per chain (engine.ports.plugin_state), so a sink that was down,
or a node that crashed, resumes where the copy ends. Only the node that leads ships, so two
nodes never feed one sink at once (a change of leader may deliver a batch twice: sinks store
each (chain, seq) once).

Each sink has a thread of its own and a Guard: a sink that raises is retried after a backoff;
one that hangs holds only its own thread. Neither ever delays a dispatch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.domain.clock import Clock
from engine.domain.errors import StorageError
from engine.ports.audit_sink import AuditSink
from engine.ports.storage import Storage
from engine.runtime.isolation import Guard

log = logging.getLogger("vortos.audit_shipper")

BATCH = 500
IDLE_S = 1.0  # how often a caught-up sink looks for new entries
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # after consecutive failures


@dataclass(slots=True)
class ShippedSink:
    name: str  # as the audit_sinks setting names it; its positions are stored under it
    sink: AuditSink
    guard: Guard
    backlog: int = 0  # entries known to wait, at the last look


class AuditShipper:
    """One thread per sink, shipping while `leading()` says this node leads."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        sinks: list[ShippedSink],
        leading: Callable[[], bool],
        *,
        batch: int = BATCH,
        idle_s: float = IDLE_S,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self.sinks = sinks
        self.leading = leading
        self._batch = batch
        self._idle_s = idle_s
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._ship, args=(s,), name=f"vortos-audit-sink-{s.name}", daemon=True
            )
            for s in sinks
        ]

    def start(self) -> AuditShipper:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Stop shipping; wait up to `timeout_s` for each sink's current call (a hung one is
        left to its thread), then close the sinks that are idle."""
        self._stopping.set()
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(timeout_s)
        for shipped, thread in zip(self.sinks, self._threads, strict=True):
            if not thread.is_alive():
                shipped.guard.call(shipped.sink.close)

    def ship_once(self, shipped: ShippedSink) -> int:
        """Deliver what waits for `shipped`, a batch per chain; the number of entries it took,
        or -1 when a delivery failed (the rest waits for the next round)."""
        positions = self._storage.plugin_state.sink_positions(shipped.name)
        waiting = {
            chain: head - positions.get(chain, 0)
            for chain, head in self._storage.audit.heads().items()
            if head > positions.get(chain, 0)
        }
        shipped.backlog = sum(waiting.values())
        delivered = 0
        for chain in sorted(waiting):
            entries = self._storage.audit.entries(
                chain, after_seq=positions.get(chain, 0), limit=self._batch
            )
            if not entries:
                continue
            if not shipped.guard.call(shipped.sink.deliver, entries):
                return -1
            self._storage.plugin_state.advance_sink(
                shipped.name, chain, entries[-1].seq, self._clock.now_ms()
            )
            delivered += len(entries)
            shipped.backlog -= len(entries)
        return delivered

    def _ship(self, shipped: ShippedSink) -> None:
        failures = 0
        while not self._stopping.is_set():
            if not self.leading():
                self._stopping.wait(self._idle_s)
                continue
            try:
                took = self.ship_once(shipped)
            except StorageError as exc:
                log.warning("audit sink %s: reading the chains failed: %s", shipped.name, exc)
                took = -1
            if took < 0:
                wait = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                self._stopping.wait(wait)
            else:
                failures = 0
                if took == 0:  # caught up: look again in a while
                    self._stopping.wait(self._idle_s)
