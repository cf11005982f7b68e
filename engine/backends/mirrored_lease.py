"""A lease held elsewhere (a plug-in, Redis), mirrored into the store's lease row, where
dispatch fences.

The other lease decides who holds it; dispatch only lands while the row names the dispatching
token. So every change of holder is written to the row too: acquire overwrites the row, renew
extends it only while it still names this token (a deposed holder's late renew can never put
its token back), and release deletes it only if it does. (The advisory driver writes the row on
the session holding its lock instead.)

Writing the row may wait (a dispatch transaction of the previous holder still has it locked,
until the server ends it): a lease whose mirror took a while is renewed at once, so the row and
the driver do not start the new holder's term already half spent.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol, runtime_checkable

from engine.domain.errors import LeaseError
from engine.ports.lease import Lease, LeasePort

# A mirror write longer than this share of the TTL is followed by a renewal.
_SLOW_MIRROR_SHARE = 10


@runtime_checkable
class LeaseRow(LeasePort, Protocol):
    """The store's lease row, which dispatch fences on, as another lease mirrors it."""

    def mirror(self, lease: Lease) -> None:
        """Write `lease` into the row whoever held it."""
        ...

    def unmirror(self, key: str, token: str) -> None:
        """Delete the row if `token` holds it."""
        ...


class MirroredLease:
    """`driver` decides; `row` (the store's lease row) follows, for fencing."""

    def __init__(self, driver: LeasePort, row: LeaseRow) -> None:
        self.driver = driver
        self._row = row

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        lease = self.driver.acquire(key, token, holder, ttl_ms)
        if lease is None:
            return None
        started = time.monotonic()  # a duration only: how long the write took
        try:
            self._row.mirror(lease)
        except BaseException:
            # Holding the driver's lease without the row would only block everyone until it
            # expires.
            self._give_up(key, token)
            raise
        if (time.monotonic() - started) * 1000 > ttl_ms // _SLOW_MIRROR_SHARE:
            return self.renew(key, token, ttl_ms)  # the term starts now, not before the wait
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
