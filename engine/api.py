"""Opening an engine from Python: one call, the same service the CLI uses."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import cast

from engine.backends.lease_drivers import DEFAULT_LEASE_DRIVER, lease_driver
from engine.backends.sqlite import SqliteBackend
from engine.backends.sqlite.connection import BUSY_TIMEOUT_MS, inspect_path
from engine.backends.sqlite.read_model import SqliteReadModel
from engine.commands import CommandRegistry, builtin_commands
from engine.config import Settings
from engine.control import ControlClient, ControlServer, RemoteService
from engine.control.client import NoDatabase
from engine.domain.audit import KeyRing
from engine.domain.clock import Clock, SystemClock
from engine.domain.database import is_postgres_url, parse_database
from engine.extensions import Builder, access_for, leases_for
from engine.governance.doctor import Report
from engine.governance.keys import load_keyring, load_postgres_keyring
from engine.governance.policy import AccessControl, RoleBasedPolicy
from engine.observability.observer import Observer
from engine.plugins import Selection
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
    ) -> None:
        self.storage = storage
        self.clock = clock
        # How daemons hold the leader lease (engine.backends.lease_drivers): the store's row,
        # or a driver that mirrors into it.
        self.leases: LeasePort = leases or storage.leases
        self.commands = commands
        self.service = ScheduleService(storage, clock, commands, access)

    def serve_control(
        self,
        path: Path,
        *,
        group: str | None = None,
        database: str | Path | None = None,
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
    ) -> SchedulerDaemon:
        """A scheduling daemon on this engine's store. `observer` receives what it does
        (engine.observability: metrics, spans); the dispatch circuit breaker opens after
        `breaker_failures` consecutive failed dispatch transactions and half-opens after
        `breaker_recovery_ms`. With `shard` (index, count) it leads that lease shard only
        and dispatches only its schedules (PostgreSQL)."""
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
    ) -> FireQueueConsumer:
        """Consumers run the fires of the commands registered in this engine (or, with an
        `enqueuer`, hand every fire to its transport instead); `observer` receives what they do
        (engine.observability: metrics, spans)."""
        return FireQueueConsumer(
            self.storage,
            self.clock,
            self.commands,
            ConsumerConfig(
                consumer_id=consumer_id or default_node_id(),
                concurrency=concurrency,
                claim_ttl_ms=claim_ttl_ms,
                grace_ms=grace_ms,
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


def open_engine(
    db: str | Path = DEFAULT_DB,
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
) -> Engine:
    """Open the database at `db`: a SQLite file (created or upgraded if needed), or a
    PostgreSQL URL (postgresql://...; its schema must have been created with `vortos db
    migrate`, and every node must sign audit entries with the same key: `audit_key_file` or
    VORTOS_AUDIT_KEY). On PostgreSQL the default clock is the database server's.

    With `enforce` (or a `policy`), every service change is authorised for its actor by the
    operators' roles (the CLI and the console always enforce); without, the caller is trusted.

    With `control_socket`, the database is not opened at all: every service read and change
    is sent to the `vortos run --control-socket` serving that path, which makes it as this
    process's account and narrows every read to what that account may view (`db` and the
    other options but `clock` and `commands` are the server's business then).

    `lease_driver` is how daemons hold the leader lease: "row" (the store's row), "advisory"
    (a PostgreSQL advisory lock) or "redis" (a key on `redis_url`); see
    engine.backends.lease_drivers.

    `busy_timeout_ms` is how long a write waits for another process's transaction before it
    fails with StorageError.

    `plugins` (engine.plugins.select_plugins of `settings`) replaces `lease_driver` and
    `policy`: the lease driver, the policy and the identity provider they select are built,
    each given the settings and its `[plugin.<name>]` options (engine.extensions).
    """
    if control_socket is not None:
        return SocketEngine(ControlClient(control_socket), clock or SystemClock(), commands)
    if plugins is not None:
        return _with_plugins(
            db,
            plugins,
            settings,
            clock,
            commands,
            create,
            readonly,
            busy_timeout_ms,
            audit_key_file,
            enforce,
            node_id or default_node_id(),
        )
    if is_postgres_url(db):
        engine = _open_postgres(str(db), clock, commands, readonly, audit_key_file, enforce, policy)
        return engine if readonly else _leading_with(engine, lease_driver, redis_url)
    clock = clock or SystemClock()
    path = Path(db)
    storage: SqliteBackend | None = None

    def audit_keys() -> KeyRing:
        # A key file is made only for a chain that has no entry yet: a database whose key
        # went missing must not carry on under a new one.
        assert storage is not None
        return load_keyring(path, key_file=audit_key_file, create=storage.audit.is_empty())

    storage = SqliteBackend(
        path,
        clock,
        create=create,
        readonly=readonly,
        busy_timeout_ms=busy_timeout_ms,
        audit_keys=None if readonly else audit_keys,
    )
    # Python code that opens the file is trusted; operators' tools enforce roles (`enforce`),
    # with the default role-based policy or the one given.
    access = AccessControl(storage, clock, policy) if enforce or policy is not None else None
    engine = Engine(storage, clock, commands or builtin_commands(), access)
    return engine if readonly else _leading_with(engine, lease_driver, redis_url)


def _with_plugins(
    db: str | Path,
    plugins: Selection,
    settings: Settings | None,
    clock: Clock | None,
    commands: CommandRegistry | None,
    create: bool,
    readonly: bool,
    busy_timeout_ms: int,
    audit_key_file: Path | None,
    enforce: bool,
    node_id: str,
) -> Engine:
    """open_engine with the plug-ins `plugins` selects (see engine.extensions)."""
    custom_access = (
        plugins.policy.source != "built-in" or plugins.identity_provider.source != "built-in"
    )
    engine = open_engine(
        db,
        clock=clock,
        commands=commands,
        create=create,
        readonly=readonly,
        busy_timeout_ms=busy_timeout_ms,
        audit_key_file=audit_key_file,
        enforce=enforce,
    )
    try:
        builder = Builder(engine.storage, engine.clock, parse_database(str(db)), node_id, settings)
        if enforce or custom_access:
            access = access_for(plugins, builder)
            engine.service.access = access
        if not readonly:
            engine.leases = leases_for(plugins, builder)
    except BaseException:
        engine.close()
        raise
    return engine


def _leading_with(engine: Engine, driver: str, redis_url: str | None) -> Engine:
    """The engine, its daemons leading with `driver` (closed with it)."""
    if driver == DEFAULT_LEASE_DRIVER:
        return engine
    try:
        engine.leases = lease_driver(driver, engine.storage, engine.clock, redis_url)
    except BaseException:
        engine.close()
        raise
    return engine


def _open_postgres(
    url: str,
    clock: Clock | None,
    commands: CommandRegistry | None,
    readonly: bool,
    audit_key_file: Path | None,
    enforce: bool,
    policy: Policy | None,
) -> Engine:
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - the postgres extra

    def audit_keys() -> KeyRing:
        # Never created here: every node of a deployment must hold the same key.
        return load_postgres_keyring(audit_key_file)

    storage = PostgresBackend(
        url,
        clock,  # None: the database server's clock
        readonly=readonly,
        audit_keys=None if readonly else audit_keys,
    )
    registry = commands or builtin_commands()
    enforced = enforce or policy is not None
    access = AccessControl(storage, storage.clock, policy) if enforced else None
    return Engine(storage, storage.clock, registry, access)


def open_read_model(
    db: str | Path = DEFAULT_DB, *, operator: str | None = None, policy: Policy | None = None
) -> ReadModel:
    """The console's asynchronous, read-only view of the database at `db`; with `operator`,
    narrowed to the tenants they may view (by `policy`, default: their roles).

    The file must exist and be a SQLite file, or `db` a well-formed PostgreSQL URL
    (StorageError otherwise; a server is first reached at the first read); later calls that
    fail raise StorageError and succeed again once the cause is gone.
    """
    viewer = None if operator is None else Viewer(operator, policy or RoleBasedPolicy())
    if is_postgres_url(db):
        from engine.backends.postgres.read_model import (  # noqa: PLC0415 - the postgres extra
            PostgresReadModel,
        )

        return PostgresReadModel(str(db), viewer)
    path = Path(db)
    inspect_path(path, create=False)
    return SqliteReadModel(path, viewer)
