"""The doctor on PostgreSQL, against the real server: its diagnostics, every check on a healthy
scheduler, the storage checks failing for real, and `clock.skew`, which compares this host's
clock with the server's (warn over 1 s, fail over 5 s; skipped on SQLite)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from engine import Engine, IntervalTrigger, ManualClock, ScheduleSpec
from engine.backends.postgres import PostgresBackend
from engine.backends.postgres import diagnostics as pg_diagnostics
from engine.backends.postgres.connection import SCHEMA_VERSION
from engine.backends.postgres.diagnostics import PostgresDiagnostics
from engine.backends.sqlite import SqliteBackend
from engine.commands import builtin_commands
from engine.config import load_settings
from engine.domain.access import Grant, Role
from engine.domain.audit import KeyRing
from engine.domain.timeutil import MINUTE_MS
from engine.governance.checks import SKEW_FAIL_MS, SKEW_WARN_MS, ClockSkew
from engine.governance.doctor import DoctorContext, Finding, Status, default_checks, run_checks
from engine.plugins.registry import select_plugins
from engine.ports.diagnostics import Diagnostics
from engine.retention.command import SWEEP_SCHEDULE, SWEEP_TENANT, retention_schedule
from tests.conftest import T0, run_cli
from tests.helpers import settle
from tests.pg import PG_AUDIT_KEY, fresh_schema

LEASE_TTL_MS = 15_000


@dataclass
class PgSite:
    url: str
    key_file: Path
    clock: ManualClock
    engine: Engine

    @property
    def storage(self) -> PostgresBackend:
        assert isinstance(self.engine.storage, PostgresBackend)
        return self.engine.storage

    def findings(self, diagnostics: Diagnostics | None = None) -> dict[str, Finding]:
        ctx = DoctorContext(
            self.engine.storage,
            self.clock,
            self.url,
            key_file=self.key_file,
            diagnostics=diagnostics or self.engine.storage.diagnostics(),
            commands=self.engine.commands,
            static=[],
            read_only=False,
            plugins=select_plugins(load_settings(env={})),
        )
        return {f.check_id: f for f in run_checks(ctx, default_checks()).findings}

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(statement)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[PgSite]:
    key_file = tmp_path / "audit-key"
    key_file.touch(mode=0o600)  # the service account's alone, as doctor's storage.file_modes asks
    key_file.write_text(PG_AUDIT_KEY + "\n")
    keys = KeyRing([PG_AUDIT_KEY.encode()])
    clock = ManualClock(T0)
    with fresh_schema() as url:
        storage = PostgresBackend(url, clock, audit_keys=lambda: keys)
        with Engine(storage, clock, builtin_commands()) as engine:
            yield PgSite(url, key_file, clock, engine)


def run_a_healthy_scheduler(site: PgSite) -> None:
    """A schedule, the retention sweep, an admin and an approver; lead, dispatch and run."""
    service = site.engine.service
    service.create(ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop"), actor="setup")
    service.sync_static([retention_schedule()], actor="setup")
    service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="setup")
    for who, role in (("admin", Role.ADMIN), ("bea", Role.APPROVER)):
        site.storage.operators.grant(Grant(who, role), by="setup", at=T0)
    daemon = site.engine.daemon(node_id="n1", lease_ttl_ms=LEASE_TTL_MS)
    consumer = site.engine.consumer(consumer_id="c1", concurrency=1)
    try:
        for _ in range(2):
            settle(daemon)
            deadline = time.monotonic() + 10
            while site.storage.fire_queue.depth() and time.monotonic() < deadline:
                consumer.step()
                time.sleep(0.002)
            site.clock.advance(30)
        settle(daemon)
    finally:
        consumer.close()


# -- the whole doctor ---------------------------------------------------------------------------


def test_every_check_passes_on_a_healthy_postgres_scheduler(site: PgSite) -> None:
    run_a_healthy_scheduler(site)
    findings = site.findings()
    not_passing = {k: f.status for k, f in findings.items() if f.status is not Status.PASS}
    # No WAL and no disk of ours to look at on a server.
    # No anchors file is named in the anchor schedule's payload (PostgreSQL has no default
    # beside the database): the check says so, as a warning.
    assert not_passing == {
        "storage.wal": Status.SKIP,
        "storage.disk": Status.SKIP,
        "audit.anchor_age": Status.WARN,
    }, findings
    assert "no anchors file" in findings["audit.anchor_age"].summary
    assert set(findings) == {c.check_id for c in default_checks()}


def test_the_cli_doctor_on_a_postgres_url_reports_the_clock_skew(site: PgSite) -> None:
    result = run_cli("--db", site.url, "doctor", "--json", env={"VORTOS_AUDIT_KEY": PG_AUDIT_KEY})
    report = json.loads(result.stdout)
    found = {f["check_id"]: f for f in report["findings"]}
    assert found["clock.skew"]["status"] == "pass", found["clock.skew"]
    assert found["storage.schema"]["status"] == "pass"
    assert "schema vortos_t_" in found["storage.schema"]["detail"]


# -- diagnostics --------------------------------------------------------------------------------


def test_postgres_storage_facts_name_the_server_database_and_schema(site: PgSite) -> None:
    facts = site.storage.diagnostics().storage_facts()
    schema = site.url.rsplit("%3D", 1)[1]
    assert facts.backend == "postgres"
    assert facts.schema_version == facts.supported_schema_version == SCHEMA_VERSION
    assert (facts.journal_mode, facts.synchronous) == (None, None)
    assert facts.location == f"127.0.0.1:5432/test schema {schema}"


def test_a_dropped_table_fails_storage_reachable(site: PgSite) -> None:
    site.sql("DROP TABLE approvals")
    problems = site.storage.diagnostics().unreadable_tables()
    assert list(problems) == ["approvals"]
    assert "UndefinedTable" in problems["approvals"]
    finding = site.findings()["storage.reachable"]
    assert finding.status is Status.FAIL
    assert "vortos --db URL db migrate" in finding.remediation


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1])
def test_a_schema_of_another_version_fails_storage_schema(site: PgSite, version: int) -> None:
    site.sql(f"UPDATE vortos_meta SET value = '{version}' WHERE key = 'schema_version'")
    finding = site.findings()["storage.schema"]
    assert finding.status is Status.FAIL
    assert str(version) in finding.summary
    assert "db init" not in finding.remediation


def test_postgres_queue_facts_count_waiting_fires_and_dead_letters(site: PgSite) -> None:
    diagnostics = site.storage.diagnostics()
    assert diagnostics.queue_facts(site.clock.now_ms()).waiting == 0
    site.engine.service.create(
        ScheduleSpec("report", IntervalTrigger(MINUTE_MS, T0), "noop", timezone="Europe/Paris"),
        actor="setup",
    )
    site.engine.service.trigger("report", actor="setup")
    facts = diagnostics.queue_facts(site.clock.now_ms())
    assert (facts.waiting, facts.oldest_waiting_at, facts.dead_letters) == (1, T0, 0)
    assert facts.last_claim_at is None
    assert diagnostics.zones_in_use() == ["Europe/Paris"]


# -- clock.skew ---------------------------------------------------------------------------------


class ShiftedTime:
    """This host's clock, `offset_ms` off (the module `time`, as the diagnostics read it)."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ns = offset_ms * 1_000_000

    def time_ns(self) -> int:
        return time.time_ns() + self.offset_ns


def skew_finding(site: PgSite) -> Finding:
    return site.findings()["clock.skew"]


def test_clock_skew_passes_when_this_host_and_the_server_agree(site: PgSite) -> None:
    measured = site.storage.diagnostics().clock_skew_ms()
    assert measured is not None
    assert abs(measured) < 100  # the same host: one clock
    finding = skew_finding(site)
    assert finding.status is Status.PASS, finding
    assert finding.summary.startswith("clocks agree")


def test_clock_skew_warns_when_this_host_is_two_seconds_ahead(
    site: PgSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_diagnostics, "time", ShiftedTime(2_000))
    measured = site.storage.diagnostics().clock_skew_ms()
    assert measured is not None
    assert -2_100 < measured < -1_900  # the server is two seconds behind this host
    finding = skew_finding(site)
    assert finding.status is Status.WARN, finding
    assert "2.0 s" in finding.summary
    assert "behind" in finding.detail
    assert "NTP" in finding.remediation


def test_clock_skew_fails_when_this_host_is_a_minute_behind(
    site: PgSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_diagnostics, "time", ShiftedTime(-60_000))
    finding = skew_finding(site)
    assert finding.status is Status.FAIL, finding
    assert "60.0 s" in finding.summary
    assert "ahead of" in finding.detail
    assert finding.remediation


@pytest.mark.parametrize(
    ("skew", "status"),
    [
        (0, Status.PASS),
        (SKEW_WARN_MS, Status.PASS),
        (SKEW_WARN_MS + 1, Status.WARN),
        (-SKEW_FAIL_MS, Status.WARN),
        (-SKEW_FAIL_MS - 1, Status.FAIL),
    ],
)
def test_clock_skew_limits(site: PgSite, skew: int, status: Status) -> None:
    known = PostgresDiagnostics(site.storage.pool, clock_skew_ms=lambda: skew)
    assert known.clock_skew_ms() == skew  # a skew measured elsewhere (a DatabaseClock) is used
    assert site.findings(known)["clock.skew"].status is status


def test_a_skew_source_without_an_answer_falls_back_to_measuring(site: PgSite) -> None:
    unknown = PostgresDiagnostics(site.storage.pool, clock_skew_ms=lambda: None)
    measured = unknown.clock_skew_ms()
    assert measured is not None
    assert abs(measured) < 100


def test_clock_skew_is_skipped_on_sqlite(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "vortos.db", ManualClock(T0))
    try:
        diagnostics = backend.diagnostics()
        assert diagnostics.clock_skew_ms() is None
        ctx = DoctorContext(
            backend, ManualClock(T0), tmp_path / "vortos.db", diagnostics=diagnostics
        )
        finding = ClockSkew().run(ctx)
    finally:
        backend.close()
    assert finding.status is Status.SKIP
    assert "shares this host's clock" in finding.summary
