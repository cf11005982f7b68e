"""Which deployment a store is: an id derived from where its data physically lives, the same
on every node of the deployment and different for any other database.

A SQLite file is its real path; a PostgreSQL schema is its server's system identifier (fixed
when the cluster was initialised), the database's name and the schema's. The id is stable for
the store's life: it is not the audit identity, which a store records only later (two nodes,
one started before and one after, would not agree). It keys what deployments must not share
by accident, such as their Redis lease keys (engine.backends.lease_drivers)."""

from __future__ import annotations

import hashlib
import os

from engine.config import REDIS_PREFIX, REDIS_PREFIX_RULE
from engine.domain.errors import InvalidInput
from engine.ports.storage import Storage


def _where(storage: Storage) -> str | None:
    """The physical identity of `storage`, or None for a store of a plug-in's."""
    from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415 - import cost

    if isinstance(storage, SqliteBackend):
        return f"sqlite:{os.path.realpath(storage.path)}"
    try:
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra
        from engine.backends.postgres.connection import storage_errors  # noqa: PLC0415
    except ImportError:
        return None
    if isinstance(storage, PostgresBackend):
        with storage_errors(storage.where):
            row = (
                storage.pool.get()
                .execute(
                    "SELECT (SELECT system_identifier::text FROM pg_control_system()), "
                    "current_database(), current_schema()"
                )
                .fetchone()
            )
        assert row is not None
        return f"postgresql:{row[0]}/{row[1]}/{row[2]}"
    return None


def deployment_id(storage: Storage) -> str | None:
    """A short id of `storage`'s deployment (16 hex digits), or None when the store is a
    plug-in's and says nothing of where it lives."""
    where = _where(storage)
    if where is None:
        return None
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def check_prefix(prefix: str) -> str:
    """`prefix` if it is a usable Redis key prefix; InvalidInput naming the rule otherwise."""
    if not isinstance(prefix, str) or not REDIS_PREFIX.fullmatch(prefix):
        raise InvalidInput(f"redis_prefix {prefix!r} cannot be used: {REDIS_PREFIX_RULE}")
    return prefix


def redis_prefix(given: str | None, deployment: str | None) -> str:
    """The prefix of a deployment's Redis keys: `given`, or `vortos:<deployment id>:`, so
    deployments sharing one Redis never share a key unless told to."""
    if given is not None:
        return check_prefix(given)
    return "vortos:" if deployment is None else f"vortos:{deployment}:"
