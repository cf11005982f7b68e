"""A plug-in lease driver, mirrored into the store's lease row, where dispatch fences.

A plug-in (etcd, a file lock, ...) decides who holds the lease; dispatch only lands while the
row names the dispatching token. So every change of holder is written to the row too, the way
the built-in Redis and advisory drivers do it: acquire overwrites the row, renew extends it only
while it still names this token (a deposed holder's late renew can never put its token back),
and release deletes it only if it does.
"""

from __future__ import annotations

import contextlib

from engine.backends.redis.lease import LeaseRow
from engine.domain.errors import LeaseError
from engine.ports.lease import Lease, LeasePort


class MirroredLease:
    """`driver` decides; `row` (the store's lease row) follows, for fencing."""

    def __init__(self, driver: LeasePort, row: LeaseRow) -> None:
        self.driver = driver
        self._row = row

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        lease = self.driver.acquire(key, token, holder, ttl_ms)
        if lease is None:
            return None
        try:
            self._row.mirror(lease)
        except BaseException:
            # Holding the driver's lease without the row would only block everyone until it
            # expires.
            self._give_up(key, token)
            raise
        return lease

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        lease = self.driver.renew(key, token, ttl_ms)
        try:
            self._row.renew(key, token, ttl_ms)
        except LeaseError:
            self._give_up(key, token)
            raise
        return lease

    def release(self, key: str, token: str) -> None:
        self.driver.release(key, token)
        self._row.unmirror(key, token)

    def current(self, key: str) -> Lease | None:
        return self.driver.current(key)

    def close(self) -> None:
        closing = getattr(self.driver, "close", None)
        if callable(closing):
            closing()

    def _give_up(self, key: str, token: str) -> None:
        # Best effort: the failure at hand is what gets reported.
        with contextlib.suppress(Exception):
            self.driver.release(key, token)
