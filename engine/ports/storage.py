"""A backend: every port, over one store."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from engine.ports.approvals import ApprovalStore
from engine.ports.audit import AuditLog
from engine.ports.diagnostics import Diagnostics
from engine.ports.dispatch import ChangeFeed, DispatchPort
from engine.ports.fire_queue import FireQueue
from engine.ports.lease import LeasePort
from engine.ports.nodes import NodeRegistry
from engine.ports.plugin_state import PluginStateStore
from engine.ports.policy import OperatorStore
from engine.ports.retention import RetentionStore
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

    @property
    def audit(self) -> AuditLog: ...

    @property
    def operators(self) -> OperatorStore: ...

    @property
    def approvals(self) -> ApprovalStore: ...

    @property
    def retention(self) -> RetentionStore: ...

    @property
    def plugin_state(self) -> PluginStateStore: ...

    @property
    def nodes(self) -> NodeRegistry: ...

    def atomic(self) -> AbstractContextManager[None]:
        """One write transaction, on the calling thread, around every store call inside it:
        all of them land, or none (a change and its audit entry are one)."""
        ...

    def serving(self) -> AbstractContextManager[None]:
        """The context a daemon dispatches in, from the calling thread: a backend may tune that
        thread's connection and run housekeeping beside it until the context ends."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts about the store for operators (`vortos db info`)."""
        ...

    def diagnostics(self) -> Diagnostics:
        """What the doctor reads about the store itself (reads only)."""
        ...

    def close(self) -> None: ...
