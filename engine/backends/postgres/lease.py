"""The lease as a row, taken and renewed by single conditional statements.

No table lock and no transaction spanning a read and a write: acquire is one upsert whose
update applies only when the row has expired or is the caller's own, so two contenders racing
for a free or expired key serialise on the row and the second one sees the first one's lease.
Expiry is judged on the injected clock (the database server's in a deployment).

`mirror` and `unmirror` copy a lease held elsewhere (a Redis key, an advisory lock) into the
row that dispatch fences on.
"""

from __future__ import annotations

from engine.backends.postgres.connection import PgPool, first, storage_errors
from engine.domain.clock import Clock
from engine.domain.errors import LeaseExpired, LeaseNotOwned
from engine.ports.lease import Lease

_COLUMNS = "key, token, holder, acquired_at, renewed_at, expires_at"
_SELECT = f"SELECT {_COLUMNS} FROM leases WHERE key = %s"
# The update applies only to an expired row or the caller's own; otherwise nothing is
# returned. A live lease re-acquired by its own token keeps its acquisition instant.
_ACQUIRE = (
    f"INSERT INTO leases ({_COLUMNS}) "
    "VALUES (%(key)s, %(token)s, %(holder)s, %(now)s, %(now)s, %(expires)s) "
    "ON CONFLICT (key) DO UPDATE SET token = excluded.token, holder = excluded.holder, "
    "acquired_at = CASE WHEN leases.token = excluded.token AND leases.expires_at > %(now)s "
    "THEN leases.acquired_at ELSE excluded.acquired_at END, "
    "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at "
    "WHERE leases.expires_at <= %(now)s OR leases.token = %(token)s "
    f"RETURNING {_COLUMNS}"
)
_RENEW = (
    "UPDATE leases SET renewed_at = %(now)s, expires_at = %(expires)s "
    "WHERE key = %(key)s AND token = %(token)s AND expires_at > %(now)s "
    f"RETURNING {_COLUMNS}"
)
_MIRROR = (
    f"INSERT INTO leases ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET token = excluded.token, holder = excluded.holder, "
    "acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, "
    "expires_at = excluded.expires_at"
)


class PostgresLease:
    def __init__(self, pool: PgPool, clock: Clock) -> None:
        self._pool = pool
        self._clock = clock

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            now = self._clock.now_ms()
            # A cheap read first: a standby facing a live lease takes no row lock.
            row = first(conn, _SELECT, (key,))
            if row is not None and row[1] != token and row[5] > now:
                return None
            now = self._clock.now_ms()
            won = conn.execute(
                _ACQUIRE,
                {"key": key, "token": token, "holder": holder, "now": now, "expires": now + ttl_ms},
            ).fetchone()
        return None if won is None else Lease(*won)

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            now = self._clock.now_ms()
            renewed = conn.execute(
                _RENEW, {"key": key, "token": token, "now": now, "expires": now + ttl_ms}
            ).fetchone()
            if renewed is not None:
                return Lease(*renewed)
            # Nothing renewed: say why (the row cannot come back to this token on its own).
            row = first(conn, _SELECT, (key,))
        if row is None or row[1] != token:
            raise LeaseNotOwned(f"lease {key} is not held by this token")
        raise LeaseExpired(f"lease {key} expired {now - row[5]} ms ago")

    def release(self, key: str, token: str) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            if first(
                conn, "DELETE FROM leases WHERE key = %s AND token = %s RETURNING 1", (key, token)
            ):
                return
            row = first(conn, _SELECT, (key,))
        if row is not None and row[5] > self._clock.now_ms():
            raise LeaseNotOwned(f"lease {key} is held by {row[2]}, not by this token")
        # Missing, or expired and not ours: nothing to give up.

    def current(self, key: str) -> Lease | None:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            row = first(conn, _SELECT, (key,))
        if row is None or row[5] <= self._clock.now_ms():
            return None
        return Lease(*row)

    def mirror(self, lease: Lease) -> None:
        """Make the row say `lease`, whatever it said before: the lease is held elsewhere
        (Redis, an advisory lock) and this row is only what dispatch fences on."""
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            conn.execute(
                _MIRROR,
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
        """Remove the row of `key` if it still holds `token` (another holder's stays)."""
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            conn.execute("DELETE FROM leases WHERE key = %s AND token = %s", (key, token))
