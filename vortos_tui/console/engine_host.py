"""The scheduler beside the console: the daemon and the consumers on threads of this process.

One command then gives a working scheduler and its console. When another process already
leads, the daemon here stands by (the header says who leads) and takes over if that one goes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from engine import Engine, FireQueueConsumer, SchedulerDaemon
from engine.observability.observer import Observers
from engine.plugins.runtime import Runtime
from engine.ports.dispatch import DispatchReport
from vortos_tui.console.context import NodeRole, NodeStatus

log = logging.getLogger("vortos.console")


class EngineHost:
    def __init__(
        self,
        engine: Engine,
        *,
        node_id: str,
        lease_ttl_ms: int,
        concurrency: int,
        claim_ttl_ms: int,
        grace_ms: int,
        plugins: Runtime | None = None,
    ) -> None:
        """`plugins`: the enqueuer, metrics backends and audit sinks the settings select
        (engine.plugins.runtime.build_runtime), run here as `vortos run` runs them; closed by
        stop."""
        self.node_id = node_id
        self.plugins = plugins or Runtime()
        observer = Observers(*self.plugins.observers())
        self.consumer: FireQueueConsumer = engine.consumer(
            consumer_id=node_id,
            concurrency=concurrency,
            claim_ttl_ms=claim_ttl_ms,
            grace_ms=grace_ms,
            observer=observer,
            enqueuer=self.plugins.enqueuer,
        )
        self.daemon: SchedulerDaemon = engine.daemon(
            node_id=node_id,
            lease_ttl_ms=lease_ttl_ms,
            on_dispatch=self._dispatched,
            observer=observer,
        )
        self._threads: list[threading.Thread] = []
        self.failed: str | None = None  # the loop that died, if one did

    def _dispatched(self, report: DispatchReport) -> None:
        if report.dispatched:
            self.consumer.poke()  # run the fires now, not at the consumer's next look

    def start(self) -> None:
        for name, target in (
            ("vortos-daemon", self.daemon.run),
            ("vortos-consumer", self.consumer.run),
        ):
            thread = threading.Thread(target=self._guarded, args=(name, target), name=name)
            thread.start()
            self._threads.append(thread)
        self.plugins.start(leading=lambda: self.daemon.leading)

    def _guarded(self, name: str, loop: Callable[[], None]) -> None:
        # The loops retry storage errors themselves; anything else is a bug. Say so on the
        # console (the log shows as a notice) and in the header, rather than die silently.
        try:
            loop()
        except Exception:
            self.failed = name
            log.exception("%s stopped on an unexpected error; restart the console", name)
            self.daemon.stop()
            self.consumer.stop()

    def status(self) -> NodeStatus:
        if self.failed is not None:
            return NodeStatus(NodeRole.DOWN, self.node_id)
        role = NodeRole.LEADER if self.daemon.leading else NodeRole.STANDBY
        breaker = self.daemon.breaker_state.value
        return NodeStatus(role, self.node_id, None if breaker == "closed" else breaker)

    @property
    def running_commands(self) -> int:
        return self.consumer.busy

    def stop(self) -> None:
        """Release the lease at once (a standby elsewhere takes over) and let running commands
        finish within the grace."""
        self.daemon.stop()
        self.consumer.stop()
        for thread in self._threads:
            thread.join()
        self.plugins.close()
        log.info("in-process engine stopped")
