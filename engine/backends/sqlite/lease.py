"""The lease as a row (reading and mirroring it are engine.backends.sql.leases'). Expiry is judged
on the injected clock, which every process on the host shares (the embedded database lives on
one host)."""

from __future__ import annotations

from engine.backends.sql.leases import (
    SqlLease,
    held_by_another,
    not_released,
    not_renewed,
    overwrite_sql,
)
from engine.backends.sqlite.connection import ConnectionPool, first
from engine.ports.lease import Lease

_UPSERT = overwrite_sql("?")


class SqliteLease(SqlLease[ConnectionPool]):
    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        if self._held_by_another(key, token):
            return None  # a standby facing a live lease never takes the write lock
        with self._pool.transaction() as conn:
            now = self._clock.now_ms()
            row = first(conn, self._select, (key,))
            if held_by_another(row, token, now):
                return None
            acquired = row[3] if row is not None and row[1] == token and row[5] > now else now
            conn.execute(_UPSERT, (key, token, holder, acquired, now, now + ttl_ms))
            return Lease(key, token, holder, acquired, now, now + ttl_ms)

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        with self._pool.transaction() as conn:
            now = self._clock.now_ms()
            row = first(conn, self._select, (key,))
            if row is None or row[1] != token or row[5] <= now:
                raise not_renewed(key, token, row, now)
            conn.execute(
                "UPDATE leases SET renewed_at = ?, expires_at = ? WHERE key = ? AND token = ?",
                (now, now + ttl_ms, key, token),
            )
            return Lease(key, token, row[2], row[3], now, now + ttl_ms)

    def release(self, key: str, token: str) -> None:
        with self._pool.transaction() as conn:
            now = self._clock.now_ms()
            row = first(conn, self._select, (key,))
            if row is None:
                return
            if row[1] != token:
                if row[5] <= now:
                    return  # expired and not ours: nothing to give up
                raise not_released(key, row)
            conn.execute("DELETE FROM leases WHERE key = ? AND token = ?", (key, token))
