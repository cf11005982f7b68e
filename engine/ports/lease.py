"""The lease: which node may dispatch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The key of the lease whose holder dispatches (the leader).
LEADER_LEASE = "scheduler:leader"


def shard_lease(index: int, count: int) -> str:
    """The key of lease shard `index` of `count`: its leader dispatches that shard's schedules."""
    return f"{LEADER_LEASE}:shard-{index}-of-{count}"


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease. Instants are those of the backend's clock."""

    key: str
    token: str
    holder: str
    acquired_at: int
    renewed_at: int
    expires_at: int


class LeasePort(Protocol):
    """A named mutual-exclusion lease with a time to live.

    Contract:
    - At most one token holds a key at any instant: `acquire` succeeds only when the key is free,
      its lease has expired, or the caller's own token already holds it.
    - Expiry is judged on one clock for all contenders (the database's, or the shared host clock
      for an embedded file); an expired lease is free without anyone cleaning it up.
    - `renew` extends only a live lease held by the token; it never resurrects an expired one.
    - Every method is atomic; none leaves a half-written lease behind.
    """

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        """Take the lease for `ttl_ms`, or return None while another token holds it."""
        ...

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        """Extend the live lease held by `token` to now + `ttl_ms`.

        Raises LeaseNotOwned when another token holds it or nobody does, LeaseExpired when the
        token's lease has expired (even if nobody took it since).
        """
        ...

    def release(self, key: str, token: str) -> None:
        """Give the lease up. A missing or expired lease is a no-op; another holder's raises
        LeaseNotOwned and leaves it untouched."""
        ...

    def current(self, key: str) -> Lease | None:
        """The live lease on `key`, or None when it is free or expired."""
        ...
