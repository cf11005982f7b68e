"""Choosing how the leader's lease is held: the database row itself (the default), a PostgreSQL
advisory lock, or a Redis key. The alternatives mirror their lease into the row, where dispatch
fences, so every driver keeps "a dispatch only lands while its lease token is current".

An engine chooses its driver through the plug-in registry (the lease_driver setting:
engine.plugins.runtime.lease_named), whose built-in names build these (engine.plugins.builtins).
"""

from __future__ import annotations

from typing import cast

from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput
from engine.ports.lease import LeasePort
from engine.ports.storage import Storage

LEASE_DRIVERS = ("row", "advisory", "redis")
DEFAULT_LEASE_DRIVER = "row"


def lease_driver(
    name: str,
    storage: Storage,
    clock: Clock,
    redis_url: str | None = None,
    *,
    redis_prefix: str | None = None,
) -> LeasePort:
    """The lease port `name` names, over `storage` (whose row it mirrors into).

    "row" is `storage.leases` itself. The others open a connection of their own (an advisory
    session, a Redis client) that their `close()` ends; the caller closes them with the store.
    Raises InvalidInput for an unknown name or a driver the store cannot have, StorageError when
    the server cannot be reached. Deployments sharing one Redis use a `redis_prefix` each:
    by default (None) `vortos:<deployment id>:`, derived from where the database lives
    (engine.backends.deployment), so two databases never share a key by accident.
    """
    if name == "row":
        return storage.leases
    if name == "advisory":
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra
        from engine.backends.postgres.advisory_lease import (  # noqa: PLC0415
            PostgresAdvisoryLease,
        )
        from engine.backends.postgres.lease import PostgresLease  # noqa: PLC0415

        if not isinstance(storage.leases, PostgresLease):
            raise InvalidInput(
                "lease_driver advisory holds the lease as a PostgreSQL advisory lock and needs "
                "a PostgreSQL database; on SQLite use lease_driver row (or redis)"
            )
        backend = cast("PostgresBackend", storage)
        return PostgresAdvisoryLease(backend.pool, clock, storage.leases)
    if name == "redis":
        from engine.backends.mirrored_lease import LeaseRow, MirroredLease  # noqa: PLC0415
        from engine.backends.redis import RedisLease  # noqa: PLC0415 - an extra

        if not redis_url:
            raise InvalidInput("lease_driver redis needs redis_url (e.g. redis://127.0.0.1:6379/0)")
        row = storage.leases
        if not isinstance(row, LeaseRow):
            raise InvalidInput(
                f"lease_driver redis cannot mirror into {type(storage).__name__}'s lease row "
                "(it has no mirror/unmirror); use lease_driver row"
            )
        from engine.backends.deployment import deployment_id  # noqa: PLC0415
        from engine.backends.deployment import redis_prefix as prefix_for  # noqa: PLC0415

        deployment = deployment_id(storage)
        prefix = prefix_for(redis_prefix, deployment)
        return MirroredLease(
            RedisLease(redis_url, clock, prefix=prefix, deployment=deployment or ""), row
        )
    raise InvalidInput(f"unknown lease_driver {name!r}; choose one of {', '.join(LEASE_DRIVERS)}")
