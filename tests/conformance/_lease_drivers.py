"""Every lease driver over a test store: the row itself, the PostgreSQL advisory lock, Redis.

A Redis driver gets a key prefix of its own (random unless given, so tests never see each
other's keys), and its keys are deleted when it is closed.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from engine.backends.lease_drivers import lease_driver
from engine.domain.clock import Clock
from engine.ports.lease import LeasePort
from engine.ports.storage import Storage
from tests.pg import REDIS_URL, need_redis


def redis_prefix() -> str:
    return f"vortos-test-{secrets.token_hex(6)}:"


@contextmanager
def open_driver(
    name: str, storage: Storage, clock: Clock, *, prefix: str | None = None
) -> Iterator[LeasePort]:
    """The `name` driver over `storage`, closed afterwards (its Redis keys deleted when the
    prefix was made here)."""
    own_prefix = prefix is None
    prefix = redis_prefix() if prefix is None else prefix
    if name == "redis":
        need_redis()
    leases = lease_driver(name, storage, clock, REDIS_URL, redis_prefix=prefix)
    try:
        yield leases
    finally:
        if leases is not storage.leases:
            close = getattr(leases, "close", None)
            if close is not None:
                close()
        if name == "redis" and own_prefix:
            delete_redis_keys(prefix)


def delete_redis_keys(prefix: str) -> None:
    import redis  # noqa: PLC0415 - only where Redis is used

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
