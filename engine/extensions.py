"""Building the plug-ins the settings select (engine.plugins) into a running process.

`select_plugins` has imported them all before anything was opened; here they are built, each
with a PluginContext, once the store is open: the access rules and the lease with the engine
(`access_for`, `leases_for`), the rest by `vortos run` and `vortos consume` (`Runtime`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.backends.mirrored_lease import LeaseRow, MirroredLease
from engine.domain.clock import Clock
from engine.domain.database import Database
from engine.governance.doctor import Check
from engine.governance.policy import AccessControl, RoleBasedPolicy, StoredIdentities
from engine.observability.observer import Observer
from engine.plugins import Plugin, PluginContext, PluginError, Selection
from engine.ports.enqueuer import Enqueuer
from engine.ports.lease import LeasePort
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
    db: Database
    node_id: str
    settings: Any = None  # engine.config.Settings, when the process has them

    def build(self, plugin: Plugin, default: Any = None) -> Any:
        options = {} if self.settings is None else self.settings.plugin_options(plugin.name)
        return plugin.build(
            PluginContext(
                setting=plugin.port.setting,
                name=plugin.name,
                clock=self.clock,
                db=self.db,
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
    policy = builder.build(selection.policy, default=RoleBasedPolicy())
    identities = builder.build(selection.identity_provider, default=StoredIdentities(storage))
    return AccessControl(storage, builder.clock, policy, identities)


def leases_for(selection: Selection, builder: Builder) -> LeasePort:
    """The lease the daemons lead with. A plug-in's is mirrored into the store's lease row,
    where dispatch fences (the built-in drivers mirror their own way)."""
    plugin = selection.lease_driver
    built: LeasePort = builder.build(plugin)
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
            runtime.enqueuer = builder.build(selection.enqueuer)
        for plugin in selection.metrics:
            guard = Guard("metrics", plugin.name, builder.clock, timeout_ms, on_failure)
            runtime.guards.append(guard)
            observer = IsolatedObserver(builder.build(plugin), guard)
            runtime.metrics.append(observer)
            watched.append((guard, _backlog_of(observer)))
        if ship_audit and selection.audit_sinks:
            sinks = []
            for plugin in selection.audit_sinks:
                guard = Guard("audit_sinks", plugin.name, builder.clock, timeout_ms, on_failure)
                runtime.guards.append(guard)
                shipped = ShippedSink(plugin.name, builder.build(plugin), guard)
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
    return [builder.build(plugin) for plugin in selection.doctor_checks]
