"""Conformance suites: the guarantees every implementation of a port must keep.

Subclass a suite in a test module of your own, supply its factory, and run pytest:

    class TestEtcdLease(LeaseConformance):
        @contextmanager
        def open_leases(self, clock):
            lease = EtcdLease(..., clock)
            yield lease
            lease.close()

The same classes run Vortos's own SQLite, PostgreSQL and Redis implementations in its CI.
A failing test's message names the guarantee that was broken.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from engine.testing.conformance.approval_store import ApprovalStoreConformance
    from engine.testing.conformance.audit_sink import AuditSinkConformance
    from engine.testing.conformance.fair_dispatch import FairDispatchConformance
    from engine.testing.conformance.fire_queue import FireQueueConformance
    from engine.testing.conformance.lease import LeaseConformance
    from engine.testing.conformance.node_registry import NodeRegistryConformance
    from engine.testing.conformance.plugin_state import PluginStateConformance
    from engine.testing.conformance.retention_store import RetentionStoreConformance
    from engine.testing.conformance.run_ledger import RunLedgerConformance
    from engine.testing.conformance.schedule_store import ScheduleStoreConformance
    from engine.testing.conformance.storage import StorageConformance
    from engine.testing.conformance.tenant_isolation import TenantIsolationConformance

_SUITES = {
    "StorageConformance": "storage",
    "ScheduleStoreConformance": "schedule_store",
    "RunLedgerConformance": "run_ledger",
    "TenantIsolationConformance": "tenant_isolation",
    "ApprovalStoreConformance": "approval_store",
    "FireQueueConformance": "fire_queue",
    "FairDispatchConformance": "fair_dispatch",
    "RetentionStoreConformance": "retention_store",
    "LeaseConformance": "lease",
    "AuditSinkConformance": "audit_sink",
    "PluginStateConformance": "plugin_state",
    "NodeRegistryConformance": "node_registry",
}

__all__ = [  # noqa: RUF022 - in the order of _SUITES
    "StorageConformance",
    "ScheduleStoreConformance",
    "RunLedgerConformance",
    "TenantIsolationConformance",
    "ApprovalStoreConformance",
    "FireQueueConformance",
    "FairDispatchConformance",
    "RetentionStoreConformance",
    "LeaseConformance",
    "AuditSinkConformance",
    "PluginStateConformance",
    "NodeRegistryConformance",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: a suite's module needs only what its port needs.
    module = _SUITES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
