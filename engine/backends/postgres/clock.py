"""The database server's clock, read without a round trip per instant.

Every node of a PostgreSQL deployment judges lease expiry and claim TTLs on this one clock, so a
host whose own clock drifts neither steals a live lease nor keeps a dead one. The offset between
the server's clock and this host's is sampled at start and every RESYNC_S, from the round trip
with the least delay of a few tries (its midpoint is the best estimate of the server's instant).
"""

from __future__ import annotations

import threading
import time

from engine.backends.postgres.connection import PgPool, scalar, storage_errors

RESYNC_S = 30.0
SAMPLES = 3


class DatabaseClock:
    """A Clock whose instants are the PostgreSQL server's (to within half a round trip)."""

    def __init__(self, pool: PgPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._offset_ms = 0
        self._synced_at = float("-inf")
        self._sync()

    @property
    def skew_ms(self) -> int:
        """The server's clock minus this host's, as last measured."""
        return self._offset_ms

    def _sync(self) -> None:
        best: tuple[float, int] | None = None
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            for _ in range(SAMPLES):
                sent = time.time_ns()
                server = scalar(
                    conn, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                )
                received = time.time_ns()
                trip = (received - sent) / 1e6
                offset = int(server) - (sent + received) // 2_000_000
                if best is None or trip < best[0]:
                    best = (trip, offset)
        assert best is not None
        self._offset_ms = best[1]
        self._synced_at = time.monotonic()

    def now_ms(self) -> int:
        if time.monotonic() - self._synced_at > RESYNC_S and self._lock.acquire(blocking=False):
            try:
                self._sync()
            except Exception:  # noqa: BLE001 - keep the last offset; the next call retries
                self._synced_at = time.monotonic() - RESYNC_S + 1.0
            finally:
                self._lock.release()
        return time.time_ns() // 1_000_000 + self._offset_ms

    def wait(self, wake: threading.Event, seconds: float) -> bool:
        return wake.wait(max(0.0, seconds))
