"""The lease as a Redis key, mirrored into the database's lease row.

The key is taken with `SET NX PX`; its value carries the token, the holder and the instants of
the injected clock, on which expiry is judged (as the row lease judges it). PX, on Redis's own
clock, only reclaims the key of a holder that vanished. Taking over an expired key, renewing
and releasing compare the stored token and expiry in Lua scripts, so each is one atomic step.

Dispatch fences on the row, not on the key: `lease_driver("redis", ...)` wraps this in a
MirroredLease (engine.backends.mirrored_lease), which writes every change of holder there too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from engine.domain.clock import Clock
from engine.domain.errors import DatabaseUnavailable, LeaseExpired, LeaseNotOwned, StorageError
from engine.domain.redact import redact_url as redact
from engine.domain.redact import remember, scrub_echoes
from engine.ports.lease import Lease

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

log = logging.getLogger("vortos.lease")

CONNECT_TIMEOUT_S = 5.0
# A command that gets no answer in this time fails (a daemon retries; it must not hang).
COMMAND_TIMEOUT_S = 5.0

# ARGV: token, now, holder, expires_at, ttl_ms, deployment. The holding token keeps its
# acquired_at.
_ACQUIRE = """
local stored = redis.call('GET', KEYS[1])
local now = tonumber(ARGV[2])
local acquired = ARGV[2]
if stored then
  local lease = cjson.decode(stored)
  local live = tonumber(lease.expires_at) > now
  if live and lease.token ~= ARGV[1] then return false end
  if live then acquired = lease.acquired_at end
end
local value = cjson.encode({token = ARGV[1], holder = ARGV[3], acquired_at = acquired,
                            renewed_at = ARGV[2], expires_at = ARGV[4],
                            deployment = ARGV[6]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[5])
return value
"""

# ARGV: token, now, expires_at, ttl_ms.
_RENEW = """
local stored = redis.call('GET', KEYS[1])
if not stored then return {'free'} end
local lease = cjson.decode(stored)
if lease.token ~= ARGV[1] then return {'other', stored} end
if tonumber(lease.expires_at) <= tonumber(ARGV[2]) then return {'expired', stored} end
lease.renewed_at = ARGV[2]
lease.expires_at = ARGV[3]
local value = cjson.encode(lease)
redis.call('SET', KEYS[1], value, 'PX', ARGV[4])
return {'renewed', value}
"""

# ARGV: token, now. A key the token holds is deleted even if expired, as the row lease does.
_RELEASE = """
local stored = redis.call('GET', KEYS[1])
if not stored then return 'free' end
local lease = cjson.decode(stored)
if lease.token == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 'released'
end
if tonumber(lease.expires_at) <= tonumber(ARGV[2]) then return 'expired' end
return 'other'
"""


def _redis_module() -> Any:
    try:
        import redis  # noqa: PLC0415 - the optional `redis` extra
    except ImportError:
        raise StorageError(
            "the Redis lease needs the `redis` extra: pip install 'vortos[redis]' "
            "(or choose another lease_driver)"
        ) from None
    return redis


class RedisLease:
    """The lease on `key` held as the Redis key `<prefix>lease:<key>`. Its value names the
    `deployment` (engine.backends.deployment) that took it, so a key another deployment holds
    (the same prefix set on two databases) is told apart: logged when it keeps this one from
    leading, and reported by the doctor (lease.redis_deployment)."""

    def __init__(
        self, url: str, clock: Clock, prefix: str = "vortos:", deployment: str = ""
    ) -> None:
        module = _redis_module()
        remember(url)
        self._url = url  # for scrubbing the driver's messages, never shown
        self.where = redact(url)
        self._errors: type[Exception] = module.RedisError
        self._unreachable: tuple[type[Exception], ...] = (
            module.ConnectionError,
            module.TimeoutError,
        )
        self._clock = clock
        self._prefix = prefix
        self.deployment = deployment
        self._foreign_seen: set[str] = set()  # deployments already warned about
        with self._redis_errors():
            try:
                self._client: redis.Redis = module.Redis.from_url(
                    url,
                    socket_connect_timeout=CONNECT_TIMEOUT_S,
                    socket_timeout=COMMAND_TIMEOUT_S,
                    decode_responses=True,
                )
            except ValueError as exc:
                raise StorageError(
                    f"invalid redis_url {self.where}: {scrub_echoes(str(exc), url)}; the form is "
                    # Whole through the redactor, which masks what follows `user:` in a URL.
                    "redis://host:6379/0 (user:password@ before the host where it needs one)"
                ) from None
            try:
                # Fail at start, with the remedy, rather than at the first election.
                self._client.ping()
            except BaseException:
                self._client.close()
                raise
        self._acquire: Script = self._client.register_script(_ACQUIRE)
        self._renew: Script = self._client.register_script(_RENEW)
        self._release: Script = self._client.register_script(_RELEASE)

    def redis_key(self, key: str) -> str:
        """The Redis key that holds the lease on `key`."""
        return f"{self._prefix}lease:{key}"

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        now = self._clock.now_ms()
        fresh = Lease(key, token, holder, now, now, now + ttl_ms)
        with self._redis_errors():
            encoded = _encode(fresh, self.deployment)
            if self._client.set(self.redis_key(key), encoded, nx=True, px=ttl_ms):
                lease = fresh
            else:
                value: str | None = self._acquire(
                    keys=[self.redis_key(key)],
                    args=[token, now, holder, now + ttl_ms, ttl_ms, self.deployment],
                )
                if value is None:
                    self._warn_if_foreign(key)
                    return None
                lease = _decode(key, value)
        return lease

    def deployment_of(self, key: str) -> tuple[str, str] | None:
        """(deployment, holder) of the Redis key of lease `key` while it is live; None when
        free. A key written before deployments were recorded names the deployment ''."""
        with self._redis_errors():
            value = cast("str | None", self._client.get(self.redis_key(key)))
        if value is None:
            return None
        lease = _decode(key, value)
        if lease.expires_at <= self._clock.now_ms():
            return None
        return _deployment(value), lease.holder

    def _warn_if_foreign(self, key: str) -> None:
        """Say so, once per deployment, when another deployment's key keeps this one from
        leading: otherwise it stands by silently forever."""
        held = self.deployment_of(key)
        if held is None or not self.deployment or held[0] in ("", self.deployment):
            return
        if held[0] not in self._foreign_seen:
            self._foreign_seen.add(held[0])
            log.warning(
                "the Redis key %s is held by %s of another deployment (%s; this database is "
                "%s): two deployments share the redis_prefix %r, so this one cannot lead. Give "
                "each its own redis_prefix, or unset it to derive one from the database",
                self.redis_key(key),
                held[1],
                held[0],
                self.deployment,
                self._prefix,
            )

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        now = self._clock.now_ms()
        with self._redis_errors():
            status, *value = self._renew(
                keys=[self.redis_key(key)], args=[token, now, now + ttl_ms, ttl_ms]
            )
        if status == "free":
            raise LeaseNotOwned(f"lease {key} is not held by anyone")
        lease = _decode(key, value[0])
        if status == "other":
            raise LeaseNotOwned(f"lease {key} is held by {lease.holder}, not by this token")
        if status == "expired":
            raise LeaseExpired(f"lease {key} expired {now - lease.expires_at} ms ago")
        return lease

    def release(self, key: str, token: str) -> None:
        with self._redis_errors():
            status = self._release(keys=[self.redis_key(key)], args=[token, self._clock.now_ms()])
        if status == "other":
            raise LeaseNotOwned(f"lease {key} is held by another token, not by this one")

    def current(self, key: str) -> Lease | None:
        with self._redis_errors():
            value = cast("str | None", self._client.get(self.redis_key(key)))
        if value is None:
            return None
        lease = _decode(key, value)
        return lease if lease.expires_at > self._clock.now_ms() else None

    def close(self) -> None:
        self._client.close()

    @contextmanager
    def _redis_errors(self) -> Iterator[None]:
        try:
            yield
        except self._unreachable as exc:
            # Down or restarting, as a database can be: a starting node waits for it.
            raise DatabaseUnavailable(
                f"Redis at {self.where} is not reachable ({self._said(exc)}); start Redis or "
                "fix redis_url"
            ) from None
        except self._errors as exc:
            raise StorageError(f"Redis at {self.where}: {self._said(exc)}") from None

    def _said(self, exc: Exception) -> str:
        """The driver's complaint, without any piece of the URL's password it may quote."""
        return scrub_echoes(str(exc), self._url)


def _encode(lease: Lease, deployment: str) -> str:
    # Instants as strings: Lua numbers are doubles, and cjson would re-encode large ones in
    # exponent form.
    return json.dumps(
        {
            "token": lease.token,
            "holder": lease.holder,
            "acquired_at": str(lease.acquired_at),
            "renewed_at": str(lease.renewed_at),
            "expires_at": str(lease.expires_at),
            "deployment": deployment,
        }
    )


def _deployment(value: str) -> str:
    try:
        return str(json.loads(value).get("deployment", ""))
    except (ValueError, AttributeError):
        return ""


def _decode(key: str, value: str) -> Lease:
    try:
        fields = json.loads(value)
        return Lease(
            key,
            str(fields["token"]),
            str(fields["holder"]),
            int(fields["acquired_at"]),
            int(fields["renewed_at"]),
            int(fields["expires_at"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(
            f"the Redis key of lease {key} holds something else ({exc}); another program "
            "writes under this prefix: choose another redis key prefix or delete the key"
        ) from None
