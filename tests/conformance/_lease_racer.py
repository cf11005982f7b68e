"""A process that races others to acquire leases on a shared store (spawned by test_lease).

Each racer opens its own backend on the store the test's `storage` fixture opened, with the
system clock (the one clock every process on the host shares), and for each round waits on a
barrier shared by all racers, acquires the round's key, waits again, and reports whether it won
and which token it then sees holding the key.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from engine.domain.clock import SystemClock
from engine.ports.storage import Storage

RACE_TTL_MS = 10 * 60 * 1000  # far longer than any race takes: nothing expires mid-test
BARRIER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StoreAddress:
    """How another process opens the same store as the test's `storage` fixture."""

    backend: str
    target: str


def address_of(storage: Storage) -> StoreAddress | None:
    """The address of `storage`, or None for a backend this module cannot reopen yet.

    A new backend adds its case here and in `open_store`.
    """
    from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415 (one case per backend)

    if isinstance(storage, SqliteBackend):
        return StoreAddress("sqlite", str(storage.path))
    return None


def open_store(address: StoreAddress) -> Storage:
    if address.backend == "sqlite":
        from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415

        return SqliteBackend(address.target, SystemClock(), create=False)
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
        try:
            for key in keys:
                barrier.wait(BARRIER_TIMEOUT_S)
                lease = store.leases.acquire(key, token, f"racer-{token}", RACE_TTL_MS)
                results.put(("won", token, key, lease is not None))
                barrier.wait(BARRIER_TIMEOUT_S)
                current = store.leases.current(key)
                results.put(("holder", token, key, None if current is None else current.token))
        finally:
            store.close()
    except BaseException:  # reported to the test, which fails with it
        results.put(("error", token, "", traceback.format_exc()))
        barrier.abort()
        raise
