"""The built-in implementations, built the way every plug-in is: from a PluginContext alone
(engine.plugins.builtins), and a lease driver given by name (engine.plugins.runtime.lease_named)
over each backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.mirrored_lease import MirroredLease
from engine.backends.sqlite import SqliteBackend
from engine.config import defaults
from engine.domain.clock import ManualClock
from engine.domain.errors import InvalidInput
from engine.governance.policy import RoleBasedPolicy, StoredIdentities
from engine.plugins.registry import PORT_BY_SETTING, PluginContext, PluginError, find
from engine.plugins.runtime import Builder, lease_named
from engine.ports.storage import Storage
from tests.pg import REDIS_URL, need_redis

NODE = "node-a"


def context(setting: str, name: str, storage: Storage | None, clock: ManualClock) -> PluginContext:
    return PluginContext(
        setting=setting,
        name=name,
        clock=clock,
        db=Path("vortos.db"),
        node_id=NODE,
        settings=defaults(redis_url=REDIS_URL),
        storage=storage,
    )


def built(setting: str, name: str, storage: Storage | None, clock: ManualClock) -> object:
    return find(PORT_BY_SETTING[setting], name).build(context(setting, name, storage, clock))


def test_row_is_the_stores_own_lease(storage: Storage, clock: ManualClock) -> None:
    assert built("lease_driver", "row", storage, clock) is storage.leases


def test_the_access_builtins_are_built_over_the_store(storage: Storage, clock: ManualClock) -> None:
    assert isinstance(built("policy", "rbac", storage, clock), RoleBasedPolicy)
    assert isinstance(built("identity_provider", "operators", storage, clock), StoredIdentities)


def test_redis_connects_to_the_redis_url_of_the_contexts_settings(
    storage: Storage, clock: ManualClock
) -> None:
    need_redis()
    leases = built("lease_driver", "redis", storage, clock)

    assert isinstance(leases, MirroredLease)
    leases.close()


def test_advisory_holds_a_lock_on_postgresql_and_is_refused_on_sqlite(
    storage: Storage, clock: ManualClock
) -> None:
    if isinstance(storage, SqliteBackend):
        with pytest.raises(PluginError, match="needs a PostgreSQL database"):
            built("lease_driver", "advisory", storage, clock)
        return
    leases = built("lease_driver", "advisory", storage, clock)

    assert type(leases).__name__ == "PostgresAdvisoryLease"
    assert leases is not storage.leases


@pytest.mark.parametrize(
    ("setting", "name"),
    [
        ("lease_driver", "row"),
        ("lease_driver", "advisory"),
        ("lease_driver", "redis"),
        ("identity_provider", "operators"),
    ],
)
def test_a_builtin_over_the_store_refuses_a_context_without_one(
    setting: str, name: str, clock: ManualClock
) -> None:
    with pytest.raises(PluginError, match=r"carries none \(PluginContext\.storage\)"):
        built(setting, name, None, clock)


def test_lease_named_builds_a_builtin_as_the_setting_would(
    storage: Storage, clock: ManualClock
) -> None:
    builder = Builder(storage, clock, Path("vortos.db"), NODE)

    assert lease_named("row", builder) is storage.leases
    with pytest.raises(PluginError, match="lease_driver = 'redis': lease_driver redis needs"):
        lease_named("redis", builder)  # no settings: no redis_url


def test_lease_named_mirrors_a_plugins_lease_into_the_row(
    tmp_path: Path, clock: ManualClock
) -> None:
    storage = SqliteBackend(tmp_path / "vortos.db", clock)
    try:
        leases = lease_named("filelock", Builder(storage, clock, tmp_path / "vortos.db", NODE))

        assert isinstance(leases, MirroredLease)
        assert type(leases.driver).__name__ == "FileLockLease"
    finally:
        storage.close()


def test_lease_named_refuses_an_unknown_name(storage: Storage, clock: ManualClock) -> None:
    with pytest.raises(PluginError, match="no lease driver of that name"):
        lease_named("zookeeper", Builder(storage, clock, Path("vortos.db"), NODE))


def test_defaults_are_the_tables_with_the_values_given() -> None:
    settings = defaults(redis_url=REDIS_URL, lease_ttl=5_000)

    assert settings.redis_url == REDIS_URL
    assert settings.source("redis_url") == "argument"
    assert settings.lease_ttl == 5_000
    assert settings.consumers == 4
    assert settings.source("consumers") == "default"


def test_defaults_refuse_an_unknown_setting() -> None:
    with pytest.raises(InvalidInput, match=r"unknown setting.*lease_tll"):
        defaults(lease_tll=5_000)
