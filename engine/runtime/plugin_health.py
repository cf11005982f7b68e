"""Reporting plug-ins' health to the database, where `vortos doctor` reads it from any host."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from engine.domain.errors import StorageError
from engine.ports.plugin_state import PluginHealth
from engine.ports.storage import Storage
from engine.runtime.isolation import Guard

log = logging.getLogger("vortos.plugins")

REPORT_EVERY_S = 5.0

# A guard and what waits for it (its backlog), read at each report.
Watched = tuple[Guard, Callable[[], int]]


class HealthReporter:
    """Every REPORT_EVERY_S: count hung calls, and write one row per plug-in of this node."""

    def __init__(
        self,
        storage: Storage,
        node_id: str,
        watched: list[Watched],
        every_s: float = REPORT_EVERY_S,
    ) -> None:
        self._storage = storage
        self._node_id = node_id
        self._watched = watched
        self._every_s = every_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vortos-plugin-health", daemon=True)

    def start(self) -> HealthReporter:
        if self._watched:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
            self.report()  # the last word: what the counts came to

    def reports(self) -> list[PluginHealth]:
        for guard, _ in self._watched:
            guard.check_timeout()
        return [guard.report(self._node_id, backlog()) for guard, backlog in self._watched]

    def report(self) -> None:
        try:
            self._storage.plugin_state.report_health(self.reports())
        except StorageError as exc:  # reporting is best effort; the next one may land
            log.warning("could not record plug-in health: %s", exc)

    def _loop(self) -> None:
        while not self._stopping.wait(self._every_s):
            self.report()
