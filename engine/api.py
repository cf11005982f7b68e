"""Opening an engine from Python: one call, the same service the CLI uses.

An engine is built from one immutable EngineConfig (made from the settings with
`EngineConfig.from_settings`, from `open_engine`'s keywords, or directly) by `build_engine`:
the store is opened through the backend registry (engine.backends.registry) unless a ready one
is given, the lease driver and the access rules are built through the plug-in registry
(engine.plugins), and the service is made with them and the approval TTL. Nothing is changed
on an engine once it is built.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import cast

from engine.backends.lease_drivers import DEFAULT_LEASE_DRIVER
from engine.backends.registry import Opening, database_of, open_storage, parse_database
from engine.backends.registry import open_read_model as open_backend_read_model
from engine.backends.sqlite.connection import BUSY_TIMEOUT_MS
from engine.commands import CommandRegistry, builtin_commands
from engine.config import Settings, defaults
from engine.control import ControlClient, ControlServer, RemoteService
from engine.control.client import NoDatabase
from engine.domain.approvals import DEFAULT_APPROVAL_TTL_MS
from engine.domain.audit import KeyRing
from engine.domain.clock import Clock, SystemClock
from engine.domain.database import Database
from engine.domain.errors import InvalidInput
from engine.governance.doctor import Report
from engine.governance.keys import load_keyring
from engine.governance.policy import AccessControl, RoleBasedPolicy
from engine.observability.observer import Observer
from engine.plugins.registry import Selection, select_plugins
from engine.plugins.runtime import Builder, access_for, lease_named, leases_for
from engine.ports.dispatch import DispatchReport
from engine.ports.enqueuer import Enqueuer
from engine.ports.lease import LEADER_LEASE, LeasePort, shard_lease
from engine.ports.policy import Policy
from engine.ports.read_model import ReadModel, Viewer
from engine.ports.storage import Storage
from engine.runtime.breaker import DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_RECOVERY_MS
from engine.runtime.consumer import (
    DEFAULT_CLAIM_TTL_MS,
    DEFAULT_CONCURRENCY,
    DEFAULT_CONSUMER_DEATHS,
    DEFAULT_GRACE_MS,
    ConsumerConfig,
    FireQueueConsumer,
    SettleListener,
)
from engine.runtime.daemon import (
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_LOOKAHEAD_MS,
    DEFAULT_TENANT_CAP,
    DaemonConfig,
    SchedulerDaemon,
)
from engine.service import ScheduleService

DEFAULT_DB = "vortos.db"


def default_node_id() -> str:
    """host:pid, unique among the processes sharing a database."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Engine:
    """A storage backend, a clock, the command allowlist and the service over them."""

    storage: Storage
    leases: LeasePort
    service: ScheduleService

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        commands: CommandRegistry,
        access: AccessControl | None = None,
        leases: LeasePort | None = None,
        *,
        approval_ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
    ) -> None:
        self.storage = storage
        self.clock = clock
        # How daemons hold the leader lease (the lease_driver plug-in): the store's row, or a
        # driver that mirrors into it.
        self.leases: LeasePort = leases or storage.leases
        self.commands = commands
        self.service = ScheduleService(
            storage, clock, commands, access, approval_ttl_ms=approval_ttl_ms
        )

    def serve_control(
        self,
        path: Path,
        *,
        group: str | None = None,
        database: str | Path | Database | None = None,
        doctor: Callable[[], Report] | None = None,
    ) -> ControlServer:
        """A control socket at `path` for operators' tools (see engine.control); the engine
        must check access (`open_engine(..., enforce=True)`). Call `.start()` on it. With
        `database` (this engine's), it serves the console's reads too, each narrowed to the
        operator asking by this engine's policy; `doctor` runs the service's health checks."""
        access = self.service.access

        def read_model(operator: str) -> ReadModel:
            assert database is not None
            assert access is not None
            return open_read_model(database, operator=operator, policy=access.policy)

        return ControlServer(
            self.service,
            path,
            group=group,
            audit=self.storage.audit,
            keys=self.storage.audit.keys,
            read_model=None if database is None else read_model,
            doctor=doctor,
        )

    def daemon(
        self,
        *,
        node_id: str | None = None,
        lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        lookahead_ms: int = DEFAULT_LOOKAHEAD_MS,
        on_dispatch: Callable[[DispatchReport], None] | None = None,
        tenant_cap: int | None = DEFAULT_TENANT_CAP,
        observer: Observer | None = None,
        breaker_failures: int = DEFAULT_BREAKER_FAILURES,
        breaker_recovery_ms: int = DEFAULT_BREAKER_RECOVERY_MS,
        shard: tuple[int, int] | None = None,
        wants_lease: Callable[[], bool] | None = None,
    ) -> SchedulerDaemon:
        """A scheduling daemon on this engine's store. `observer` receives what it does
        (engine.observability: metrics, spans); the dispatch circuit breaker opens after
        `breaker_failures` consecutive failed dispatch transactions and half-opens after
        `breaker_recovery_ms`. With `shard` (index, count) it leads that lease shard only
        and dispatches only its schedules (PostgreSQL). `wants_lease`: asked before each step
        whether to lead (lease shards shared out among nodes: engine.runtime.nodes)."""
        return SchedulerDaemon(
            self.storage,
            self.clock,
            DaemonConfig(
                node_id=node_id or default_node_id(),
                lease_ttl_ms=lease_ttl_ms,
                lookahead_ms=lookahead_ms,
                tenant_cap=tenant_cap,
                breaker_failures=breaker_failures,
                breaker_recovery_ms=breaker_recovery_ms,
                shard=shard,
                lease_key=LEADER_LEASE if shard is None else shard_lease(*shard),
            ),
            on_dispatch=on_dispatch,
            observer=observer,
            leases=self.leases,
            wants_lease=wants_lease,
        )

    def consumer(
        self,
        *,
        consumer_id: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        claim_ttl_ms: int = DEFAULT_CLAIM_TTL_MS,
        grace_ms: int = DEFAULT_GRACE_MS,
        on_settle: SettleListener | None = None,
        observer: Observer | None = None,
        enqueuer: Enqueuer | None = None,
        consumer_deaths: int = DEFAULT_CONSUMER_DEATHS,
    ) -> FireQueueConsumer:
        """Consumers run the fires of the commands registered in this engine (or, with an
        `enqueuer`, hand every fire to its transport instead); `observer` receives what they do
        (engine.observability: metrics, spans). A fire whose consumer vanished more than
        `consumer_deaths` times is dead-lettered (apart from its retry budget, which counts
        only the command's failures)."""
        return FireQueueConsumer(
            self.storage,
            self.clock,
            self.commands,
            ConsumerConfig(
                consumer_id=consumer_id or default_node_id(),
                concurrency=concurrency,
                claim_ttl_ms=claim_ttl_ms,
                grace_ms=grace_ms,
                consumer_deaths=consumer_deaths,
            ),
            on_settle=on_settle,
            observer=observer,
            enqueuer=enqueuer,
        )

    def close(self) -> None:
        if self.leases is not self.storage.leases:
            closing = getattr(self.leases, "close", None)
            if callable(closing):
                closing()  # a driver's own session or client
        self.storage.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SocketEngine(Engine):
    """An engine on a control socket: no storage (this process opens no database), its
    service a RemoteService whose every read and change the socket's server makes. It runs no
    daemon or consumer (those belong to the server)."""

    def __init__(
        self, client: ControlClient, clock: Clock, commands: CommandRegistry | None = None
    ) -> None:
        self.commands = commands or builtin_commands()
        self.clock = clock
        self.service = RemoteService(client, clock, self.commands)
        self.storage = cast("Storage", NoDatabase(client.path))
        self.leases = cast("LeasePort", self.storage)

    def close(self) -> None:
        """Nothing is open: each call is a connection of its own."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything an engine is built from (see `build_engine`).

    `database` is where the store is, opened through its backend unless `storage` is a store
    opened already (a third-party backend's: used as it is, closed with the engine), or
    `control_socket` names a `vortos run --control-socket` that every read and change goes to
    instead (then nothing but `clock` and `commands` counts). `clock` None: the backend's own
    (the system clock; on PostgreSQL the database server's).

    `enforce` (or a `policy`) authorises every change by the operators' roles; without, the
    caller is trusted. `plugins` (engine.plugins.registry.select_plugins of `settings`)
    replaces `lease_driver` and `policy`: the lease driver, policy and identity provider it
    selects are built, each given `settings` and its `[plugin.<name>]` options. `lease_driver`
    names one as the setting does: row, advisory, redis (the redis_url of `settings`), or a
    plug-in. `approval_ttl_ms`: how long a four-eyes request stays open.
    """

    database: Database = field(default_factory=lambda: parse_database(DEFAULT_DB))
    clock: Clock | None = None
    commands: CommandRegistry | None = None
    create: bool = True
    readonly: bool = False
    busy_timeout_ms: int = BUSY_TIMEOUT_MS
    audit_key_file: Path | None = None
    enforce: bool = False
    policy: Policy | None = None
    control_socket: Path | None = None
    lease_driver: str = DEFAULT_LEASE_DRIVER
    plugins: Selection | None = None
    settings: Settings | None = None
    node_id: str | None = None
    approval_ttl_ms: int = DEFAULT_APPROVAL_TTL_MS
    storage: Storage | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        database: Database | None = None,
        plugins: Selection | None = None,
        commands: CommandRegistry | None = None,
        clock: Clock | None = None,
        create: bool = True,
        readonly: bool = False,
        enforce: bool = False,
        control_socket: Path | None = None,
        node_id: str | None = None,
    ) -> EngineConfig:
        """The engine `settings` describe: their db (or `database`), audit key file, approval
        TTL and plug-ins (`plugins`: selected already, else selected here; a missing one is a
        PluginError before anything is opened)."""
        return cls(
            database=database or parse_database(settings.db),
            clock=clock,
            commands=commands,
            create=create,
            readonly=readonly,
            audit_key_file=settings.audit_key_file,
            enforce=enforce,
            control_socket=control_socket,
            lease_driver=settings.lease_driver,
            plugins=plugins or select_plugins(settings),
            settings=settings,
            node_id=node_id,
            approval_ttl_ms=settings.approval_ttl,
        )


def build_engine(config: EngineConfig) -> Engine:
    """The engine `config` describes: its store opened (or the one given), then its access
    rules and its daemons' lease built over it; a failure closes what was opened here."""
    if config.control_socket is not None:
        client = ControlClient(config.control_socket)
        return SocketEngine(client, config.clock or SystemClock(), config.commands)
    if config.storage is not None:
        _refuse_unless_storage(config.storage)
    storage = config.storage or _open_store(config)
    try:
        clock = _clock_of(storage, config.clock)
        node_id = config.node_id or default_node_id()
        builder = Builder(storage, clock, config.database, node_id, config.settings)
        access = _access(config, builder)
        leases = None if config.readonly else _leases(config, builder)
    except BaseException:
        if config.storage is None:
            storage.close()
        raise
    commands = config.commands or builtin_commands()
    return Engine(storage, clock, commands, access, leases, approval_ttl_ms=config.approval_ttl_ms)


def _refuse_unless_storage(given: object) -> None:
    """`storage=` must be a ready store (engine.ports.storage.Storage), not its location."""
    missing = [part for part in STORAGE_PARTS if not hasattr(given, part)]
    if missing:
        raise InvalidInput(
            f"storage= must be an opened Storage (engine.extend.Storage), not a "
            f"{type(given).__name__} (it has no {', '.join(missing)}); give a database's "
            "path or URL as db= instead"
        )


# What every Storage holds: a value without them is no store (a path, a URL, a connection).
STORAGE_PARTS = ("schedules", "runs", "fire_queue", "leases", "audit", "atomic", "close")


def _open_store(config: EngineConfig) -> Storage:
    """The store at `config.database`, through its backend (engine.backends.registry)."""
    opened: list[Storage] = []

    def audit_keys() -> KeyRing:
        # Asked for at the first signature, once the store is open. A key file is made only
        # beside a file whose chain has no entry yet: a database whose key went missing must
        # not carry on under a new one, and a server's nodes must all hold the same key.
        create = config.database.is_file and opened[0].audit.is_empty()
        return load_keyring(config.database, key_file=config.audit_key_file, create=create)

    storage = open_storage(
        Opening(
            config.database,
            config.clock,
            create=config.create,
            readonly=config.readonly,
            busy_timeout_ms=config.busy_timeout_ms,
            audit_keys=None if config.readonly else audit_keys,
        )
    )
    opened.append(storage)
    return storage


def _clock_of(storage: Storage, given: Clock | None) -> Clock:
    """The clock given, else the store's own (PostgreSQL's: the server's), else the system's."""
    own: Clock | None = getattr(storage, "clock", None)
    return given or own or SystemClock()


def _access(config: EngineConfig, builder: Builder) -> AccessControl | None:
    """Access control: the selected policy and identities (always when either is a
    plug-in's), else the roles with `policy`; None when the caller is trusted. Python code
    that opens the file is trusted; operators' tools enforce roles."""
    plugins = config.plugins
    if plugins is not None:
        custom = any(p.source != "built-in" for p in (plugins.policy, plugins.identity_provider))
        return access_for(plugins, builder) if config.enforce or custom else None
    if config.enforce or config.policy is not None:
        return AccessControl(builder.storage, builder.clock, config.policy)
    return None


def _leases(config: EngineConfig, builder: Builder) -> LeasePort:
    """How the daemons hold the leader lease: the lease_driver plug-in, as selected or named
    (engine.plugins.runtime), over the store (closed with the engine)."""
    if config.plugins is not None:
        return leases_for(config.plugins, builder)
    return lease_named(config.lease_driver, builder)


def open_engine(
    db: str | Path | Database = DEFAULT_DB,
    *,
    clock: Clock | None = None,
    commands: CommandRegistry | None = None,
    create: bool = True,
    readonly: bool = False,
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    audit_key_file: Path | None = None,
    enforce: bool = False,
    policy: Policy | None = None,
    control_socket: Path | None = None,
    lease_driver: str = DEFAULT_LEASE_DRIVER,
    redis_url: str | None = None,
    plugins: Selection | None = None,
    settings: Settings | None = None,
    node_id: str | None = None,
    storage: Storage | None = None,
) -> Engine:
    """Open the database at `db`: a SQLite file (a path or a sqlite: URL; created or upgraded
    if needed), a PostgreSQL URL (postgresql://...; its schema made by `vortos db migrate`,
    and every node signing audit entries with the same key: `audit_key_file` or
    VORTOS_AUDIT_KEY), or a URL of a registered backend (engine.backends.registry); an
    unknown scheme is an InvalidInput naming the known ones. Or use `storage`, a store opened
    already, as it is (`db` then only names it to plug-ins).

    `busy_timeout_ms` is how long a write waits for another process's transaction before it
    fails with StorageError; `redis_url` is the Redis server of `lease_driver="redis"` (when
    no `settings` are given). The other keywords are EngineConfig's (see there).
    """
    if settings is None and redis_url is not None:
        settings = defaults(redis_url=redis_url)
    config = EngineConfig(
        database=database_of(db),
        clock=clock,
        commands=commands,
        create=create,
        readonly=readonly,
        busy_timeout_ms=busy_timeout_ms,
        audit_key_file=audit_key_file,
        enforce=enforce,
        policy=policy,
        control_socket=control_socket,
        lease_driver=lease_driver,
        plugins=plugins,
        settings=settings,
        node_id=node_id,
        storage=storage,
    )
    return build_engine(config)


def open_read_model(
    db: str | Path | Database = DEFAULT_DB,
    *,
    operator: str | None = None,
    policy: Policy | None = None,
) -> ReadModel:
    """The console's asynchronous, read-only view of the database at `db`; with `operator`,
    narrowed to the tenants they may view (by `policy`, default: their roles).

    The file must exist and be a SQLite file, or `db` a well-formed PostgreSQL URL
    (StorageError otherwise; a server is first reached at the first read); later calls that
    fail raise StorageError and succeed again once the cause is gone.
    """
    viewer = None if operator is None else Viewer(operator, policy or RoleBasedPolicy())
    return open_backend_read_model(database_of(db), viewer)
