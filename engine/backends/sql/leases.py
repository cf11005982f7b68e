"""The lease row on either SQL backend: its columns, the verdicts both backends give, and the
calls that read or overwrite it as it is, one SQL for both. Taking, renewing and giving it up
race with other nodes, so each backend does those its own way (SQLite's single writer,
PostgreSQL's conditional upserts)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from engine.backends.sql import Row, SqlPool, first
from engine.domain.clock import Clock
from engine.domain.errors import LeaseExpired, LeaseNotOwned
from engine.ports.lease import Lease

P = TypeVar("P", bound=SqlPool[Any])

COLUMNS = "key, token, holder, acquired_at, renewed_at, expires_at"


def select_sql(mark: str) -> str:
    """The row of one key, in the order of COLUMNS (a Lease's)."""
    return f"SELECT {COLUMNS} FROM leases WHERE key = {mark}"


def overwrite_sql(mark: str) -> str:
    """Write a Lease into its key's row (its values `lease_values`), whatever it said before."""
    return (
        f"INSERT INTO leases ({COLUMNS}) VALUES ({', '.join([mark] * 6)}) "
        "ON CONFLICT (key) DO UPDATE SET token = excluded.token, holder = excluded.holder, "
        "acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, "
        "expires_at = excluded.expires_at"
    )


def lease_values(lease: Lease) -> tuple[Any, ...]:
    return (
        lease.key,
        lease.token,
        lease.holder,
        lease.acquired_at,
        lease.renewed_at,
        lease.expires_at,
    )


def held_by_another(row: Row | None, token: str, now: int) -> bool:
    """Whether the row (of select_sql) is another token's lease, live at `now`."""
    return row is not None and row[1] != token and row[5] > now


def not_renewed(key: str, token: str, row: Row | None, now: int) -> Exception:
    """Why `token` could not renew the lease of `key`, the row (of select_sql) as it is."""
    if row is None or row[1] != token:
        return LeaseNotOwned(f"lease {key} is not held by this token")
    return LeaseExpired(f"lease {key} expired {now - row[5]} ms ago")


def not_released(key: str, row: Row) -> LeaseNotOwned:
    """The refusal to give up a live lease another token holds (row of select_sql)."""
    return LeaseNotOwned(f"lease {key} is held by {row[2]}, not by this token")


class SqlLease(Generic[P]):
    """Reading the lease, and mirroring one held elsewhere (a Redis key, an advisory lock) into
    the row dispatch fences on; a backend adds acquire, renew and release."""

    def __init__(self, pool: P, clock: Clock) -> None:
        self._pool = pool
        self._clock = clock
        self._select = select_sql(pool.dialect.mark)

    def current(self, key: str) -> Lease | None:
        row = first(self._pool, self._select, (key,))
        if row is None or row[5] <= self._clock.now_ms():
            return None
        return Lease(*row)

    def mirror(self, lease: Lease) -> None:
        """Make the row say `lease`, whoever held it: the lease is held elsewhere and this row
        is only what dispatch fences on."""
        self._pool.write(overwrite_sql(self._pool.dialect.mark), lease_values(lease))

    def unmirror(self, key: str, token: str) -> None:
        """Delete the row of `key` if `token` holds it (expired or not); anyone else's stays."""
        m = self._pool.dialect.mark
        self._pool.write(f"DELETE FROM leases WHERE key = {m} AND token = {m}", (key, token))

    def _held_by_another(self, key: str, token: str) -> bool:
        """A cheap read first: a standby facing a live lease takes no lock."""
        now = self._clock.now_ms()
        return held_by_another(first(self._pool, self._select, (key,)), token, now)
