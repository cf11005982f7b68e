"""The lease as a row, taken and renewed by single conditional statements (reading and
mirroring it are engine.backends.sql.leases').

No table lock and no transaction spanning a read and a write: acquire is one upsert whose
update applies only when the row has expired or is the caller's own, so two contenders racing
for a free or expired key serialise on the row and the second one sees the first one's lease.
Expiry is judged on the injected clock (the database server's in a deployment), read again
after any wait: an upsert that waited for the row (another transaction held it) writes a lease
that starts when the row was granted, not one already expired.

Giving the lease up notifies the change channel in the same statement, so standbys asleep in
the change feed wake and take it at once instead of at their next look.

`mirror` and `unmirror` copy a lease held elsewhere (a Redis key, an advisory lock) into the
row that dispatch fences on.
"""

from __future__ import annotations

from engine.backends.postgres.connection import PgPool, first, storage_errors
from engine.backends.sql.leases import COLUMNS, SqlLease, not_released, not_renewed
from engine.ports.lease import Lease

# The update applies only to an expired row or the caller's own; otherwise nothing is
# returned. A live lease re-acquired by its own token keeps its acquisition instant.
_ACQUIRE = (
    f"INSERT INTO leases ({COLUMNS}) "
    "VALUES (%(key)s, %(token)s, %(holder)s, %(now)s, %(now)s, %(expires)s) "
    "ON CONFLICT (key) DO UPDATE SET token = excluded.token, holder = excluded.holder, "
    "acquired_at = CASE WHEN leases.token = excluded.token AND leases.expires_at > %(now)s "
    "THEN leases.acquired_at ELSE excluded.acquired_at END, "
    "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at "
    "WHERE leases.expires_at <= %(now)s OR leases.token = %(token)s "
    f"RETURNING {COLUMNS}"
)
# A wake-up for every listener of this schema (engine.backends.postgres.changes), sent on commit.
_NOTIFY = "pg_notify('vortos', current_schema())"
_RELEASE = (
    "WITH gone AS (DELETE FROM leases WHERE key = %s AND token = %s RETURNING 1) "
    f"SELECT {_NOTIFY} FROM gone"
)
# Longer than this between reading the clock and the row's answer means the statement waited
# (for the row's lock, the server): the lease it wrote is re-dated from a new reading.
_WAITED_MS = 100
_RENEW = (
    "UPDATE leases SET renewed_at = %(now)s, expires_at = %(expires)s "
    "WHERE key = %(key)s AND token = %(token)s AND expires_at > %(now)s "
    f"RETURNING {COLUMNS}"
)


class PostgresLease(SqlLease[PgPool]):
    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        if self._held_by_another(key, token):
            return None  # a standby facing a live lease takes no row lock
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            now = self._clock.now_ms()
            args = {"key": key, "token": token, "holder": holder, "now": now}
            won = conn.execute(_ACQUIRE, {**args, "expires": now + ttl_ms}).fetchone()
            after = self._clock.now_ms()
            if won is not None and after - now > min(_WAITED_MS, ttl_ms // 10):
                # It waited for the row: date the lease from now, or lose it if it lapsed
                # meanwhile and someone else took it (the same statement, our own token).
                args["now"] = after
                won = conn.execute(_ACQUIRE, {**args, "expires": after + ttl_ms}).fetchone()
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
            row = first(conn, self._select, (key,))
        raise not_renewed(key, token, row, now)

    def release(self, key: str, token: str) -> None:
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            if first(conn, _RELEASE, (key, token)):
                return
            row = first(conn, self._select, (key,))
        if row is not None and row[5] > self._clock.now_ms():
            raise not_released(key, row)
        # Missing, or expired and not ours: nothing to give up.

    def unmirror(self, key: str, token: str) -> None:
        """Delete the row of `key` if `token` holds it, waking standbys (see release)."""
        with storage_errors(self._pool.where):
            first(self._pool.get(), _RELEASE, (key, token))
