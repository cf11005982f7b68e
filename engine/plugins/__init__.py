"""The public surface for extending Vortos: every replaceable port, and what they exchange.

Each port is a `typing.Protocol` (or, for metrics, a base class) whose docstring states its
contract: what is atomic, what raises, what may be called again. Implement one, register its
factory by name (an entry point in the port's group, or a dotted path in vortos.toml), select it
with its setting, and prove it with the suite in `engine.testing.conformance`.

Port (setting; entry-point group; conformance suite in engine.testing.conformance):
- LeasePort: lease_driver; vortos.lease_drivers; LeaseConformance
- Enqueuer: enqueuer; vortos.enqueuers
- Policy: policy; vortos.policies
- IdentityProvider: identity_provider; vortos.identity_providers
- AuditSink: audit_sinks (a list); vortos.audit_sinks; AuditSinkConformance
- MetricsObserver: metrics (a list); vortos.metrics
- DoctorCheck: doctor_checks (a list); vortos.doctor_checks
- Storage, with ScheduleStore, RunLedger, FireQueue and the rest: a whole backend, chosen by
  db; ScheduleStoreConformance, RunLedgerConformance, FireQueueConformance and the others
- Clock: injected, `open_engine(db, clock=...)`
- Trigger: a trigger type, registered by kind with engine.domain.triggers.register_trigger

The plug-in system itself is in two modules under this package, both internal: the registry
(engine.plugins.registry: the ports, finding what a setting names by built-in name, entry point
or dotted path, the Selection) and the runtime (engine.plugins.runtime: building the selected
plug-ins, each with a PluginContext, into a running process). `engine.extend` is this same
surface under the name the README and 0.x code import.

Versioning: the names exported here and their documented behaviour follow semantic
versioning from 1.0 (see the README): a minor release may add a port, a method with a default,
or an optional context field; removing or changing one waits for the next major release.
Anything imported from elsewhere in `engine` is internal and may change in any release.
"""

from __future__ import annotations

from engine.domain.access import Grant, Identity, Operation, Role
from engine.domain.audit import AuditEntry
from engine.domain.clock import Clock, ManualClock, SystemClock
from engine.domain.errors import LeaseError, LeaseExpired, LeaseNotOwned
from engine.domain.triggers import Slot, Trigger, register_trigger
from engine.governance.doctor import Check as DoctorCheck
from engine.governance.doctor import DoctorContext, Finding, Status
from engine.observability.observer import Observer as MetricsObserver
from engine.plugins.registry import PluginContext, PluginError
from engine.ports.audit_sink import AuditSink
from engine.ports.enqueuer import Enqueuer
from engine.ports.fire_queue import Fire, FireQueue
from engine.ports.lease import Lease, LeasePort
from engine.ports.policy import Decision, IdentityProvider, Policy
from engine.ports.runs import RunLedger
from engine.ports.schedules import ScheduleStore
from engine.ports.storage import Storage

__all__ = [
    "AuditEntry",
    "AuditSink",
    "Clock",
    "Decision",
    "DoctorCheck",
    "DoctorContext",
    "Enqueuer",
    "Finding",
    "Fire",
    "FireQueue",
    "Grant",
    "Identity",
    "IdentityProvider",
    "Lease",
    "LeaseError",
    "LeaseExpired",
    "LeaseNotOwned",
    "LeasePort",
    "ManualClock",
    "MetricsObserver",
    "Operation",
    "PluginContext",
    "PluginError",
    "Policy",
    "Role",
    "RunLedger",
    "ScheduleStore",
    "Slot",
    "Status",
    "Storage",
    "SystemClock",
    "Trigger",
    "register_trigger",
]
