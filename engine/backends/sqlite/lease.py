"""The lease as a row. Expiry is judged on the injected clock, which every process on the host
shares (the embedded database lives on one host)."""

from __future__ import annotations

from engine.backends.sqlite.connection import (
    ConnectionPool,
    first,
    storage_errors,
    write_tx,
)
from engine.domain.clock import Clock
from engine.domain.errors import LeaseExpired, LeaseNotOwned
from engine.ports.lease import Lease

_SELECT = "SELECT key, token, holder, acquired_at, renewed_at, expires_at FROM leases WHERE key = ?"


class SqliteLease:
    def __init__(self, pool: ConnectionPool, clock: Clock) -> None:
        self._pool = pool
        self._clock = clock

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        conn = self._pool.get()
        with storage_errors(self._pool.path):
            now = self._clock.now_ms()
            # A cheap read first: a standby facing a live lease never takes the write lock.
            row = first(conn, _SELECT, (key,))
            if row is not None and row[1] != token and row[5] > now:
                return None
            with write_tx(conn):
                now = self._clock.now_ms()
                row = first(conn, _SELECT, (key,))
                if row is not None and row[1] != token and row[5] > now:
                    return None
                acquired = row[3] if row is not None and row[1] == token and row[5] > now else now
                conn.execute(
                    "INSERT INTO leases (key, token, holder, acquired_at, renewed_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                    "token = excluded.token, holder = excluded.holder, "
                    "acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, "
                    "expires_at = excluded.expires_at",
                    (key, token, holder, acquired, now, now + ttl_ms),
                )
                return Lease(key, token, holder, acquired, now, now + ttl_ms)

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            now = self._clock.now_ms()
            row = first(conn, _SELECT, (key,))
            if row is None or row[1] != token:
                raise LeaseNotOwned(f"lease {key} is not held by this token")
            if row[5] <= now:
                raise LeaseExpired(f"lease {key} expired {now - row[5]} ms ago")
            conn.execute(
                "UPDATE leases SET renewed_at = ?, expires_at = ? WHERE key = ? AND token = ?",
                (now, now + ttl_ms, key, token),
            )
            return Lease(key, token, row[2], row[3], now, now + ttl_ms)

    def release(self, key: str, token: str) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            now = self._clock.now_ms()
            row = first(conn, _SELECT, (key,))
            if row is None:
                return
            if row[1] != token:
                if row[5] <= now:
                    return  # expired and not ours: nothing to give up
                raise LeaseNotOwned(f"lease {key} is held by {row[2]}, not by this token")
            conn.execute("DELETE FROM leases WHERE key = ? AND token = ?", (key, token))

    def mirror(self, lease: Lease) -> None:
        """Write `lease` into the row as it is, whoever held it: an external lease (a Redis
        key) has decided, and dispatch fences on this row."""
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            conn.execute(
                "INSERT INTO leases (key, token, holder, acquired_at, renewed_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "token = excluded.token, holder = excluded.holder, "
                "acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, "
                "expires_at = excluded.expires_at",
                (
                    lease.key,
                    lease.token,
                    lease.holder,
                    lease.acquired_at,
                    lease.renewed_at,
                    lease.expires_at,
                ),
            )

    def unmirror(self, key: str, token: str) -> None:
        """Delete the row if `token` holds it (expired or not); anyone else's stays."""
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            conn.execute("DELETE FROM leases WHERE key = ? AND token = ?", (key, token))

    def current(self, key: str) -> Lease | None:
        conn = self._pool.get()
        with storage_errors(self._pool.path):
            row = first(conn, _SELECT, (key,))
        if row is None or row[5] <= self._clock.now_ms():
            return None
        return Lease(*row)
