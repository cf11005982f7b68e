"""The Redis lease: leadership as a Redis key, for deployments that already run Redis (the
`redis` extra). Everything else stays in the database; the lease is mirrored into its row,
where dispatch fences."""

from __future__ import annotations

from engine.backends.redis.lease import RedisLease

__all__ = ["RedisLease"]
