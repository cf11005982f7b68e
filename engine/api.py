"""Opening an engine from Python: one call, the same service the CLI uses."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from engine.backends.sqlite import SqliteBackend
from engine.backends.sqlite.connection import BUSY_TIMEOUT_MS, inspect_path
from engine.backends.sqlite.read_model import SqliteReadModel
from engine.commands import CommandRegistry, builtin_commands
from engine.control import ControlClient, ControlServer, RemoteService
from engine.domain.audit import KeyRing
from engine.domain.clock import Clock, SystemClock
from engine.governance.keys import load_keyring
from engine.governance.policy import AccessControl, RoleBasedPolicy
from engine.observability.observer import Observer
from engine.ports.dispatch import DispatchReport
from engine.ports.policy import Policy
from engine.ports.read_model import ReadModel, Viewer
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

    def __init__(
        self,
        storage: SqliteBackend,
        clock: Clock,
        commands: CommandRegistry,
        access: AccessControl | None = None,
    ) -> None:
        self.storage = storage
        self.clock = clock
        self.commands = commands
        self.service = ScheduleService(storage, clock, commands, access)

    def serve_control(self, path: Path, *, group: str | None = None) -> ControlServer:
        """A control socket at `path` for operators' tools (see engine.control); the engine
        must check access (`open_engine(..., enforce=True)`). Call `.start()` on it."""
        return ControlServer(
            self.service, path, group=group, audit=self.storage.audit, keys=self.storage.audit.keys
        )

    def daemon(
        self,
        *,
        node_id: str | None = None,
        lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        lookahead_ms: int = 0,
        on_dispatch: Callable[[DispatchReport], None] | None = None,
        tenant_cap: int | None = DEFAULT_TENANT_CAP,
        observer: Observer | None = None,
        breaker_failures: int = DEFAULT_BREAKER_FAILURES,
        breaker_recovery_ms: int = DEFAULT_BREAKER_RECOVERY_MS,
    ) -> SchedulerDaemon:
        """A scheduling daemon on this engine's store. `observer` receives what it does
        (engine.observability: metrics, spans); the dispatch circuit breaker opens after
        `breaker_failures` consecutive failed dispatch transactions and half-opens after
        `breaker_recovery_ms`."""
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
            ),
            on_dispatch=on_dispatch,
            observer=observer,
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
    ) -> FireQueueConsumer:
        """Consumers run the fires of the commands registered in this engine; `observer`
        receives what they do (engine.observability: metrics, spans)."""
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
        )

    def close(self) -> None:
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
) -> Engine:
    """Open (creating or upgrading if needed) the database at `db`.

    With `enforce` (or a `policy`), every service change is authorised for its actor by the
    operators' roles (the CLI and the console always enforce); without, the caller is trusted.

    With `control_socket`, the database is opened read-only and every service change is sent
    to the `vortos run --control-socket` serving that path, which makes it as this process's
    account (reads stay local, narrowed to what that account may view).

    `busy_timeout_ms` is how long a write waits for another process's transaction before it
    fails with StorageError.
    """
    clock = clock or SystemClock()
    path = Path(db)
    if control_socket is not None:
        return _open_remote(path, clock, commands, busy_timeout_ms, policy, control_socket)
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
    return Engine(storage, clock, commands or builtin_commands(), access)


def _open_remote(
    path: Path,
    clock: Clock,
    commands: CommandRegistry | None,
    busy_timeout_ms: int,
    policy: Policy | None,
    control_socket: Path,
) -> Engine:
    storage = SqliteBackend(
        path, clock, create=False, readonly=True, busy_timeout_ms=busy_timeout_ms
    )
    access = AccessControl(storage, clock, policy)
    registry = commands or builtin_commands()
    engine = Engine(storage, clock, registry, access)
    engine.service = RemoteService(storage, clock, registry, access, ControlClient(control_socket))
    return engine


def open_read_model(
    db: str | Path = DEFAULT_DB, *, operator: str | None = None, policy: Policy | None = None
) -> ReadModel:
    """The console's asynchronous, read-only view of the database at `db`; with `operator`,
    narrowed to the tenants they may view (by `policy`, default: their roles).

    The file must exist and be a SQLite file (StorageError otherwise); later calls that fail
    raise StorageError and succeed again once the cause is gone.
    """
    path = Path(db)
    inspect_path(path, create=False)
    viewer = None if operator is None else Viewer(operator, policy or RoleBasedPolicy())
    return SqliteReadModel(path, viewer)
