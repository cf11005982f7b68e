"""Backends by URL scheme: a third-party backend plugs in by registration alone, and a scheme
nobody registered is a clean refusal everywhere a database is named.

The toy backend is `toy:PATH`: a SqliteBackend on the file PATH, registered in this process
with `register_backend` (open_engine, the shipped conformance suites) or, for the CLI's
process, as an entry point of the group `vortos.backends` of a distribution put on its
PYTHONPATH.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, closing
from pathlib import Path

import pytest

from engine import (
    IntervalTrigger,
    InvalidInput,
    ManualClock,
    ScheduleSpec,
    open_engine,
    open_read_model,
)
from engine.api import EngineConfig, build_engine
from engine.backends.mirrored_lease import MirroredLease
from engine.backends.registry import (
    BACKEND_GROUP,
    Opening,
    known_schemes,
    open_storage,
    parse_database,
    register_backend,
    unregister_backend,
)
from engine.backends.sqlite import SqliteBackend
from engine.backends.sqlite.read_model import SqliteReadModel
from engine.domain.clock import SystemClock
from engine.domain.database import Database
from engine.governance.keys import create_key_file
from engine.plugins.registry import PluginError
from engine.ports.read_model import ReadModel, Viewer
from engine.ports.storage import Storage
from engine.testing.conformance.approval_store import ApprovalStoreConformance
from engine.testing.conformance.fire_queue import FireQueueConformance
from engine.testing.conformance.plugin_state import PluginStateConformance
from engine.testing.conformance.run_ledger import RunLedgerConformance
from engine.testing.conformance.schedule_store import ScheduleStoreConformance
from engine.testing.conformance.tenant_isolation import TenantIsolationConformance
from tests.conformance._backends import SUITE_KEYS
from tests.conftest import T0, cli_env
from tests.pg import REDIS_URL, need_redis

MINUTE_MS = 60_000
AUDIT_KEY = "toy-backend-audit-key-0123456789abcdef"


def open_toy(opening: Opening) -> Storage:
    """The toy backend: `toy:PATH` is a SQLite file at PATH."""
    return SqliteBackend(
        Path(opening.database.location.removeprefix("toy:")),
        opening.clock or SystemClock(),
        create=opening.create,
        readonly=opening.readonly,
        audit_keys=opening.audit_keys,
    )


def toy_read_model(database: Database, viewer: Viewer | None) -> ReadModel:
    """The console's reads of `toy:PATH`: SQLite's read model on PATH."""
    return SqliteReadModel(Path(database.location.removeprefix("toy:")), viewer)


@pytest.fixture
def toy() -> Iterator[None]:
    register_backend("toy", open_toy, read_model=toy_read_model)
    yield
    unregister_backend("toy")


# --- open_engine ---------------------------------------------------------------------------


@pytest.mark.usefixtures("toy")
def test_open_engine_opens_a_registered_scheme_through_its_factory(tmp_path: Path) -> None:
    key_file = tmp_path / "toy.audit-key"
    ring = create_key_file(key_file)  # not a file database: no key is made up beside it
    store = tmp_path / "toy.db"
    db = parse_database(f"toy:{store}")
    assert (db.backend, db.is_file, db.path) == ("toy", False, None)

    with open_engine(f"toy:{store}", clock=ManualClock(T0), audit_key_file=key_file) as engine:
        assert isinstance(engine.storage, SqliteBackend)
        assert engine.storage.path == store
        engine.service.create(
            ScheduleSpec("tick", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="me"
        )
        assert [s.name for s in engine.service.schedules()] == ["tick"]
        assert engine.storage.audit.keys().active_id == ring.active_id
    assert store.exists()
    assert "toy" in known_schemes()


def test_a_ready_storage_is_used_as_it_is(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    ready = SqliteBackend(tmp_path / "ready.db", clock, audit_keys=lambda: SUITE_KEYS)

    with open_engine(tmp_path / "ready.db", storage=ready, clock=clock) as engine:
        assert engine.storage is ready
        assert engine.clock is clock
        engine.service.create(
            ScheduleSpec("tick", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="me"
        )
        assert ready.schedules.count() == 1  # written to the store given


def test_an_unregistered_scheme_is_refused_by_open_engine_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # today's mistake made the file mysql:/x/y here

    with pytest.raises(InvalidInput, match="mysql: is none") as refused:
        open_engine("mysql://app:secret@x/y")

    assert "postgresql:" in str(refused.value)
    assert "secret" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


# --- the shipped suites, on the storage the toy's registration builds -----------------------


class OnToy:
    """A store the registry opens for `toy:` (registered for the test only)."""

    serialises_writes = True  # a SQLite file beneath

    @pytest.fixture(autouse=True)
    def _toy_registered(self) -> Iterator[None]:
        register_backend("toy", open_toy, read_model=toy_read_model)
        yield
        unregister_backend("toy")

    def open_storage(self, clock: ManualClock, directory: Path) -> AbstractContextManager[Storage]:
        database = parse_database(f"toy:{directory / 'toy.db'}")
        return closing(open_storage(Opening(database, clock, audit_keys=lambda: SUITE_KEYS)))


class TestToySchedules(OnToy, ScheduleStoreConformance): ...


class TestToyRunLedger(OnToy, RunLedgerConformance): ...


class TestToyFireQueue(OnToy, FireQueueConformance): ...


class TestToyTenantIsolation(OnToy, TenantIsolationConformance):
    def open_read_model(self, storage: Storage, operator: str) -> ReadModel:
        assert isinstance(storage, SqliteBackend)
        return open_read_model(f"toy:{storage.path}", operator=operator)  # the registry's


class TestToyApprovals(OnToy, ApprovalStoreConformance): ...


class TestToyPluginState(OnToy, PluginStateConformance): ...


@pytest.mark.usefixtures("toy")
def test_the_suites_store_is_the_one_the_toys_factory_builds(tmp_path: Path) -> None:
    with OnToy().open_storage(ManualClock(T0), tmp_path) as storage:
        assert isinstance(storage, SqliteBackend)
        assert storage.path == tmp_path / "toy.db"


# --- the CLI: an entry point registers the scheme in its process ---------------------------


@pytest.fixture
def toy_distribution(tmp_path: Path) -> Path:
    """A directory holding the toy backend's module and a distribution's metadata naming it
    as the entry point `toy` of vortos.backends: on PYTHONPATH, it is installed."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "toy_backend.py").write_text(
        "from pathlib import Path\n"
        "from engine.backends.sqlite import SqliteBackend\n"
        "from engine.domain.clock import SystemClock\n\n\n"
        "def open_toy(opening):\n"
        "    return SqliteBackend(\n"
        "        Path(opening.database.location.removeprefix('toy:')),\n"
        "        opening.clock or SystemClock(),\n"
        "        create=opening.create,\n"
        "        readonly=opening.readonly,\n"
        "        audit_keys=opening.audit_keys,\n"
        "    )\n",
        encoding="utf-8",
    )
    dist = src / "toy_backend-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        f"[{BACKEND_GROUP}]\ntoy = toy_backend:open_toy\n", encoding="utf-8"
    )
    return src


def vortos(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`vortos ARGS` in a real process, in `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "vortos_tui.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(env),
        timeout=120,
        check=False,
    )


def test_the_cli_opens_an_installed_backend_by_its_scheme(
    tmp_path: Path, toy_distribution: Path
) -> None:
    store = tmp_path / "cli-toy.db"
    env = {"PYTHONPATH": str(toy_distribution), "VORTOS_AUDIT_KEY": AUDIT_KEY}
    db = f"toy:{store}"

    add = ("schedule", "add", "tick", "--every", "1m", "--command", "noop")
    added = vortos("--db", db, *add, cwd=tmp_path, env=env)
    assert added.returncode == 0, added.stderr
    listed = vortos("--db", db, "schedule", "list", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "tick" in listed.stdout
    with open_engine(store, create=False, readonly=True) as opened:  # the toy's SQLite file
        assert [s.name for s in opened.service.schedules()] == ["tick"]

    refused = vortos("--db", "mysql://x/y", "schedule", "list", cwd=tmp_path, env=env)
    assert refused.returncode == 2
    assert "toy:" in refused.stderr  # the installed scheme is a known one


def test_the_cli_refuses_an_unknown_scheme_from_the_flag_the_environment_and_the_file(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = tmp_path / "vortos.toml"
    config.write_text('db = "mysql://app:secret@x/y"\n', encoding="utf-8")
    given: list[tuple[list[str], dict[str, str]]] = [
        (["--db", "mysql://app:secret@x/y"], {}),
        ([], {"VORTOS_DB": "mysql://app:secret@x/y"}),
        ([], {"VORTOS_CONFIG": str(config)}),
    ]
    for flags, env in given:
        done = vortos(*flags, "schedule", "list", cwd=workdir, env=env)

        assert done.returncode == 2, (flags, env, done.stderr)
        assert "mysql: is none" in done.stderr
        assert "sqlite:" in done.stderr
        assert "postgresql:" in done.stderr
        assert "secret" not in done.stderr
        assert list(workdir.iterdir()) == [], "nothing may be created for a refused database"


# --- the lease driver: one path, the plug-in registry -------------------------------------


def test_open_engine_leads_with_the_store_row_by_default(tmp_path: Path) -> None:
    with open_engine(tmp_path / "row.db", clock=ManualClock(T0)) as engine:
        assert engine.leases is engine.storage.leases


def test_open_engine_names_its_lease_driver_as_the_setting_does(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match=r"lease_driver = 'advisory'.*PostgreSQL"):
        open_engine(tmp_path / "a.db", lease_driver="advisory")
    with pytest.raises(PluginError, match="no lease driver of that name"):
        open_engine(tmp_path / "b.db", lease_driver="etcd")


def test_open_engine_leads_with_redis_on_the_url_it_is_given(tmp_path: Path) -> None:
    need_redis()
    with open_engine(
        tmp_path / "redis.db", clock=ManualClock(T0), lease_driver="redis", redis_url=REDIS_URL
    ) as engine:
        assert isinstance(engine.leases, MirroredLease)


def test_the_approval_ttl_is_the_engines_own(tmp_path: Path) -> None:
    config = EngineConfig(
        database=parse_database(tmp_path / "ttl.db"), clock=ManualClock(T0), approval_ttl_ms=5_000
    )
    with build_engine(config) as engine:
        assert engine.service.four_eyes.ttl_ms == 5_000
