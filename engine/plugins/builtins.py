"""The built-in implementations as plug-in factories: what the built-in names select
(`lease_driver = "row"`, `policy = "rbac"`, ...). Each is built from its PluginContext alone:
the opened store and the effective settings it carries."""

from __future__ import annotations

from engine.backends.lease_drivers import lease_driver
from engine.governance.policy import RoleBasedPolicy, StoredIdentities
from engine.plugins.registry import PluginContext, PluginError
from engine.ports.lease import LeasePort
from engine.ports.policy import IdentityProvider, Policy
from engine.ports.storage import Storage


def _storage(context: PluginContext) -> Storage:
    if context.storage is None:
        raise PluginError(
            f"{context.setting} = {context.name!r} is built over the opened store, and this "
            "context carries none (PluginContext.storage)"
        )
    return context.storage


def row_driver(context: PluginContext) -> LeasePort:
    """The store's own lease row (lease_driver = "row")."""
    return lease_driver("row", _storage(context), context.clock)


def advisory_driver(context: PluginContext) -> LeasePort:
    """A PostgreSQL session-level advisory lock, mirrored into the row (lease_driver =
    "advisory")."""
    return lease_driver("advisory", _storage(context), context.clock)


def redis_driver(context: PluginContext) -> LeasePort:
    """A Redis key on the redis_url setting, mirrored into the row (lease_driver = "redis"),
    under the redis_prefix setting (default: derived from the database)."""
    settings = context.settings
    return lease_driver(
        "redis",
        _storage(context),
        context.clock,
        None if settings is None else settings.redis_url,
        redis_prefix=None if settings is None else settings.redis_prefix,
    )


def role_based_policy(context: PluginContext) -> Policy:
    """The built-in policy (policy = "rbac")."""
    return RoleBasedPolicy()


def stored_identities(context: PluginContext) -> IdentityProvider:
    """The built-in identities (identity_provider = "operators"): the stored operator grants."""
    return StoredIdentities(_storage(context))
