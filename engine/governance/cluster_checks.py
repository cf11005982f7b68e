"""The doctor's checks of the deployment's nodes: they agree on the shard count, and the
Redis lease keys they lead by are this deployment's own."""

from __future__ import annotations

from collections import Counter

from engine.backends.deployment import deployment_id, redis_prefix
from engine.domain.errors import VortosError
from engine.governance.checks import _Named, _some
from engine.governance.doctor import DoctorContext, Finding
from engine.ports.lease import LEADER_LEASE, shard_lease
from engine.runtime.nodes import mismatched


class NodeShards(_Named):
    """Every live node runs with one shard count and one lease driver: nodes of two counts
    lead two sets of leases at once, and their shares never add up; nodes of two drivers each
    believe they lead (fencing keeps dispatch exactly once, but leadership flips between them).
    Warns when they agree on a count the doctor's shards setting does not say (its
    lease.holder then checks the wrong leases)."""

    def __init__(self) -> None:
        super().__init__("cluster.nodes")

    def run(self, ctx: DoctorContext) -> Finding:
        try:
            live = ctx.storage.nodes.live(ctx.clock.now_ms())
        except VortosError as exc:
            return self.fail("the node registry cannot be read", str(exc), "check storage")
        if not live:
            # Nothing to disagree: daemons embedded in a program register no node.
            return self.ok("no node beats in the node registry (none of `vortos run`)")
        drivers = Counter(b.lease_driver for b in live)
        if len(drivers) > 1:
            usual = drivers.most_common(1)[0][0]
            odd = [b for b in live if b.lease_driver != usual]
            return self.fail(
                f"the {len(live)} live node(s) hold their leases with "
                f"{len(drivers)} different lease drivers",
                _some([f"{b.node_id}: lease_driver {b.lease_driver}" for b in odd])
                + f" (the others: {usual})",
                "restart every node with one lease_driver (--lease-driver, VORTOS_LEASE_DRIVER); "
                "a node started with another one beside live nodes is refused",
            )
        counts = Counter(b.shards for b in live)
        # The deployment's count: the setting's if some node runs it, else the most nodes'.
        agreed = ctx.shards if ctx.shards in counts else counts.most_common(1)[0][0]
        wrong = mismatched(live, agreed)
        if wrong:
            return self.fail(
                f"{len(wrong)} of {len(live)} live node(s) run with another shard count than "
                f"the others' {agreed}",
                _some([f"{b.node_id}: --shards {b.shards}" for b in wrong]),
                f"restart those nodes with --shards {agreed} (every node must run the same "
                "count; a node started with another one beside live nodes is refused)",
            )
        if agreed != ctx.shards:
            return self.warn(
                f"the {len(live)} live node(s) run with {agreed} shard(s), the doctor's shards "
                f"setting says {ctx.shards}",
                ", ".join(b.node_id for b in live),
                f"set shards = {agreed} (VORTOS_SHARDS) where the doctor runs, so lease.holder "
                "checks each shard's leader",
            )
        return self.ok(
            f"{len(live)} live node(s), each with {agreed} shard(s)",
            ", ".join(b.node_id for b in live),
        )


class RedisDeployment(_Named):
    """With lease_driver redis, no lease key under this deployment's prefix is held by another
    deployment (the same redis_prefix set on two databases: one of them never leads)."""

    def __init__(self) -> None:
        super().__init__("lease.redis_deployment")

    def run(self, ctx: DoctorContext) -> Finding:
        settings = ctx.settings
        if settings is None or settings.lease_driver != "redis" or not settings.redis_url:
            return self.ok("the lease is not held in Redis (lease_driver): no key to share")
        from engine.backends.redis import RedisLease  # noqa: PLC0415 - an extra

        ours = deployment_id(ctx.storage) or ""
        prefix = redis_prefix(settings.redis_prefix, ours or None)
        try:
            driver = RedisLease(settings.redis_url, ctx.clock, prefix=prefix, deployment=ours)
        except VortosError as exc:
            return self.fail("Redis cannot be reached", str(exc), "start Redis or fix redis_url")
        try:
            keys = (
                [LEADER_LEASE]
                if ctx.shards == 1
                else [shard_lease(i, ctx.shards) for i in range(ctx.shards)]
            )
            foreign = []
            for key in keys:
                held = driver.deployment_of(key)
                if held is not None and held[0] not in ("", ours):
                    foreign.append(f"{driver.redis_key(key)}: {held[1]} of deployment {held[0]}")
        except VortosError as exc:
            return self.fail("the Redis lease keys cannot be read", str(exc), "check Redis")
        finally:
            driver.close()
        if not foreign:
            return self.ok(f"the Redis lease keys under {prefix!r} are this deployment's ({ours})")
        return self.fail(
            f"a Redis lease key of this deployment ({ours}) is held by another deployment",
            _some(foreign),
            f"two deployments share the redis_prefix {prefix!r}: give each its own "
            "redis_prefix, or unset it to derive one from each database",
        )
