"""A backend: every port, over one store."""

from __future__ import annotations

from typing import Any, Protocol

from engine.ports.dispatch import ChangeFeed, DispatchPort
from engine.ports.fire_queue import FireQueue
from engine.ports.lease import LeasePort
from engine.ports.runs import RunLedger
from engine.ports.schedules import ScheduleStore


class Storage(Protocol):
    """What the runtime and the service need from a backend."""

    readonly: bool

    @property
    def leases(self) -> LeasePort: ...

    @property
    def schedules(self) -> ScheduleStore: ...

    @property
    def runs(self) -> RunLedger: ...

    @property
    def fire_queue(self) -> FireQueue: ...

    @property
    def dispatcher(self) -> DispatchPort: ...

    @property
    def changes(self) -> ChangeFeed: ...

    def describe(self) -> dict[str, Any]:
        """Facts about the store for operators (`vortos db info`)."""
        ...

    def close(self) -> None: ...
