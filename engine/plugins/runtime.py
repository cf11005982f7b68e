"""Building the plug-ins the settings select (engine.plugins.registry) into a running process.

`select_plugins` has imported them all before anything was opened; here they are built, each
with a PluginContext, once the store is open: the access rules and the lease with the engine
(`access_for`, `leases_for`, or `lease_named` for a lease driver given by name), the rest by
`vortos run` and `vortos consume` (`Runtime`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from engine.backends.mirrored_lease import LeaseRow, MirroredLease
from engine.config import Settings
from engine.domain.clock import Clock
from engine.domain.database import Database, PlainDatabase, plain_database
from engine.governance.doctor import Check
from engine.governance.policy import AccessControl, RoleBasedPolicy, StoredIdentities
from engine.observability.observer import Observer
from engine.plugins.registry import (
    PORT_BY_SETTING,
    BuiltIn,
    Plugin,
    PluginContext,
    PluginError,
    Selection,
    find,
)
from engine.ports.audit_sink import AuditSink
from engine.ports.enqueuer import Enqueuer
from engine.ports.lease import LeasePort
from engine.ports.policy import IdentityProvider, Policy
from engine.ports.storage import Storage
from engine.runtime.audit_shipper import AuditShipper, ShippedSink
from engine.runtime.isolation import FailureHook, Guard, IsolatedObserver
from engine.runtime.plugin_health import HealthReporter, Watched

log = logging.getLogger("vortos.plugins")

DEFAULT_PLUGIN_TIMEOUT_MS = 5_000


@dataclass(frozen=True, slots=True)
class Builder:
    """What every plug-in's context carries in this process."""

    storage: Storage
    clock: Clock
    db: Database | PlainDatabase
    node_id: str
    settings: Settings | None = None  # the effective settings, when the process has them

    def build(self, plugin: Plugin, default: BuiltIn = None) -> object:
        """What the plug-in's factory returns, checked to have its port's methods (by name, so
        the callers, which know the port they asked for, cast it to that port)."""
        options = {} if self.settings is None else self.settings.plugin_options(plugin.name)
        return plugin.build(
            PluginContext(
                setting=plugin.port.setting,
                name=plugin.name,
                clock=self.clock,
                db=plain_database(self.db),
                node_id=self.node_id,
                options=options,
                default=default,
                settings=self.settings,
                storage=self.storage,
            )
        )


def access_for(selection: Selection, builder: Builder) -> AccessControl:
    """Access control with the selected policy and identity provider."""
    storage = builder.storage
    policy = cast("Policy", builder.build(selection.policy, default=RoleBasedPolicy()))
    stored = StoredIdentities(storage)
    identities = cast("IdentityProvider", builder.build(selection.identity_provider, stored))
    return AccessControl(storage, builder.clock, policy, identities)


def leases_for(selection: Selection, builder: Builder) -> LeasePort:
    """The lease the daemons lead with, of the lease_driver setting. A plug-in's is mirrored
    into the store's lease row, where dispatch fences (the built-in drivers mirror their own
    way)."""
    return _lease(selection.lease_driver, builder)


def lease_named(name: str, builder: Builder) -> LeasePort:
    """The lease driver `name` names, as the lease_driver setting would (row, advisory, redis,
    an entry point's name or a dotted path), built over `builder.storage`; redis connects to
    the redis_url of `builder.settings`. PluginError (an InvalidInput) when it cannot be found
    or started, or the store cannot have it."""
    return _lease(find(PORT_BY_SETTING["lease_driver"], name), builder)


def _lease(plugin: Plugin, builder: Builder) -> LeasePort:
    built = cast("LeasePort", builder.build(plugin))
    if plugin.source == "built-in":
        return built
    row = builder.storage.leases
    if not isinstance(row, LeaseRow):
        raise PluginError(
            f"lease_driver = {plugin.name!r}: this store's lease row cannot mirror another "
            "driver's lease (it has no mirror/unmirror); use lease_driver row"
        )
    return MirroredLease(built, row)


@dataclass(slots=True)
class Runtime:
    """The plug-ins of a serving process, built and running: the enqueuer its consumers hand
    fires to, the metrics backends (isolated) beside its own observer, the audit shipper (while
    it leads) and the health reporter that tells doctor how they fare."""

    enqueuer: Enqueuer | None = None
    metrics: list[IsolatedObserver] = field(default_factory=list)
    shipper: AuditShipper | None = None
    reporter: HealthReporter | None = None
    timeout_ms: int = DEFAULT_PLUGIN_TIMEOUT_MS
    guards: list[Guard] = field(default_factory=list)  # one per secondary plug-in

    def observers(self) -> list[Observer]:
        return list(self.metrics)

    def start(self, leading: Callable[[], bool] | None) -> None:
        """Start shipping (while `leading()`; None: this process never ships) and reporting."""
        if self.shipper is not None and leading is not None:
            self.shipper.leading = leading
            self.shipper.start()
        if self.reporter is not None:
            self.reporter.start()

    def close(self) -> None:
        timeout_s = self.timeout_ms / 1000
        if self.shipper is not None:
            self.shipper.stop(timeout_s)
        for observer in self.metrics:
            observer.close(timeout_s)
        if self.reporter is not None:
            self.reporter.stop()
        if self.enqueuer is not None:
            try:
                self.enqueuer.close()
            except Exception:  # a plug-in's failure to close must not hide the shutdown
                log.exception("closing the enqueuer failed")


def build_runtime(
    selection: Selection,
    builder: Builder,
    *,
    timeout_ms: int = DEFAULT_PLUGIN_TIMEOUT_MS,
    on_failure: FailureHook | None = None,
    ship_audit: bool = True,
) -> Runtime:
    """Build the enqueuer, the metrics backends and (with `ship_audit`) the audit sinks.
    `on_failure` hears of every plug-in failure (the process's Prometheus counter)."""
    runtime = Runtime(timeout_ms=timeout_ms)
    watched: list[Watched] = []
    try:
        if selection.enqueuer is not None:
            runtime.enqueuer = cast("Enqueuer", builder.build(selection.enqueuer))
        for plugin in selection.metrics:
            guard = Guard("metrics", plugin.name, builder.clock, timeout_ms, on_failure)
            runtime.guards.append(guard)
            observer = IsolatedObserver(cast("Observer", builder.build(plugin)), guard)
            runtime.metrics.append(observer)
            watched.append((guard, _backlog_of(observer)))
        if ship_audit and selection.audit_sinks:
            sinks = []
            for plugin in selection.audit_sinks:
                guard = Guard("audit_sinks", plugin.name, builder.clock, timeout_ms, on_failure)
                runtime.guards.append(guard)
                sink = cast("AuditSink", builder.build(plugin))
                shipped = ShippedSink(plugin.name, sink, guard)
                sinks.append(shipped)
                watched.append((guard, _backlog_of(shipped)))
            runtime.shipper = AuditShipper(builder.storage, builder.clock, sinks, lambda: False)
    except BaseException:
        runtime.close()
        raise
    runtime.reporter = HealthReporter(builder.storage, builder.node_id, watched)
    return runtime


def _backlog_of(holder: IsolatedObserver | ShippedSink) -> Callable[[], int]:
    return lambda: holder.backlog


def doctor_checks(selection: Selection, builder: Builder) -> list[Check]:
    """The doctor checks of the doctor_checks setting, built."""
    return [cast("Check", builder.build(plugin)) for plugin in selection.doctor_checks]
