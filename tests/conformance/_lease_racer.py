"""A process that races others to acquire leases on a shared store (spawned by test_lease),
and how a test opens another client of its store.

Each racer opens its own backend on the store the test's `storage` fixture opened, with the
system clock (the one clock every process on the host shares), and over it its own lease driver
(the row, an advisory-lock session, a Redis client); for each round it waits on a barrier
shared by all racers, acquires the round's key, waits again, and reports whether it won and
which token it then sees holding the key.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from engine.backends.lease_drivers import lease_driver
from engine.domain.clock import Clock, SystemClock
from engine.ports.storage import Storage
from tests.pg import REDIS_URL

RACE_TTL_MS = 10 * 60 * 1000  # far longer than any race takes: nothing expires mid-test
BARRIER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StoreAddress:
    """How another process opens the same store as the test's `storage` fixture."""

    backend: str
    target: str
    driver: str = "row"  # the lease driver each racer opens over its store
    redis_prefix: str = "vortos:"


def address_of(
    storage: Storage, driver: str = "row", redis_prefix: str = "vortos:"
) -> StoreAddress | None:
    """The address of `storage`, or None for a backend this module cannot reopen yet.

    A new backend adds its case here and in `open_store`.
    """
    from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415 (one case per backend)

    if isinstance(storage, SqliteBackend):
        return StoreAddress("sqlite", str(storage.path), driver, redis_prefix)
    url = getattr(storage, "url", None)
    if type(storage).__name__ == "PostgresBackend" and isinstance(url, str):
        return StoreAddress("postgres", url, driver, redis_prefix)
    return None


def open_store(address: StoreAddress, clock: Clock | None = None) -> Storage:
    """Another client of the store at `address`, on `clock` (by default the system's)."""
    clock = SystemClock() if clock is None else clock
    if address.backend == "sqlite":
        from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415

        return SqliteBackend(address.target, clock, create=False)
    if address.backend == "postgres":
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415

        return PostgresBackend(address.target, clock)
    raise ValueError(f"no way to open backend {address.backend!r} in a racer process")


def race(
    address: StoreAddress,
    keys: list[str],
    token: str,
    barrier: Any,  # a multiprocessing Barrier shared by every racer
    results: Any,  # a multiprocessing Queue
) -> None:
    """Report ("won", token, key, bool) and ("holder", token, key, token|None) per key."""
    try:
        store = open_store(address)
        leases = None
        try:
            leases = lease_driver(
                address.driver,
                store,
                SystemClock(),
                REDIS_URL,
                redis_prefix=address.redis_prefix,
            )
            for key in keys:
                barrier.wait(BARRIER_TIMEOUT_S)
                lease = leases.acquire(key, token, f"racer-{token}", RACE_TTL_MS)
                results.put(("won", token, key, lease is not None))
                barrier.wait(BARRIER_TIMEOUT_S)
                current = leases.current(key)
                results.put(("holder", token, key, None if current is None else current.token))
        finally:
            close = getattr(leases, "close", None) if leases is not store.leases else None
            if close is not None:
                close()
            store.close()
    except BaseException:  # reported to the test, which fails with it
        results.put(("error", token, "", traceback.format_exc()))
        barrier.abort()
        raise
