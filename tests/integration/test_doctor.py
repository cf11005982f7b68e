"""Acceptance 3 (observability issue): each doctor check made to fail for real, one state in
which every check passes, and `--json` against its documented schema. Acceptance 5's doctor
part: a schedule whose daemon stopped for three periods is overdue."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import apsw
import pytest

from engine import (
    Engine,
    IntervalTrigger,
    ManualClock,
    RunState,
    ScheduleSpec,
    open_engine,
)
from engine.backends.sqlite.connection import SCHEMA_VERSION
from engine.commands import builtin_commands
from engine.commands.decorators import StaticSchedule
from engine.config import load_settings
from engine.domain.access import Grant, Role
from engine.domain.schedule import MisfireKind, MisfirePolicy
from engine.domain.timeutil import MINUTE_MS
from engine.governance.checks import MIB, StorageDisk
from engine.governance.doctor import (
    Check,
    DoctorContext,
    Finding,
    Status,
    default_checks,
    run_checks,
)
from engine.plugins.registry import select_plugins
from engine.ports.fire_queue import Outcome, Settlement
from engine.ports.lease import shard_lease
from engine.ports.plugin_state import PluginHealth
from engine.retention.audit_upkeep import ANCHOR_SCHEDULE, ANCHOR_TENANT, anchor_schedule
from engine.retention.command import SWEEP_SCHEDULE, SWEEP_TENANT, retention_schedule
from engine.runtime.consumer import FireQueueConsumer
from engine.runtime.daemon import SchedulerDaemon
from tests.conftest import T0, run_cli
from tests.helpers import settle

LEASE_TTL_MS = 15_000


@dataclass
class Site:
    db: Path
    clock: ManualClock
    engine: Engine
    daemon: SchedulerDaemon
    consumer: FireQueueConsumer

    def run(self) -> None:
        """Lead, dispatch what is due and run it."""
        settle(self.daemon)
        deadline = time.monotonic() + 10
        while self.engine.storage.fire_queue.depth() and time.monotonic() < deadline:
            self.consumer.step()
            time.sleep(0.002)

    def findings(self, *, checks: list[Check] | None = None, **given: object) -> dict[str, Finding]:
        ctx = DoctorContext(
            self.engine.storage,
            self.clock,
            self.db,
            diagnostics=self.engine.storage.diagnostics(),
            commands=self.engine.commands,
            static=[],
            read_only=False,
            plugins=DEFAULT_PLUGINS,
        )
        for key, value in given.items():
            setattr(ctx, key, value)
        report = run_checks(ctx, checks or default_checks())
        return {f.check_id: f for f in report.findings}

    def sql(self, *statements: str) -> None:
        conn = apsw.Connection(str(self.db))
        try:
            for statement in statements:
                conn.execute(statement)
        finally:
            conn.close()


# The plug-ins of a deployment without settings: the built-ins.
DEFAULT_PLUGINS = select_plugins(load_settings(env={}))


def every_minute(name: str, **extra: object) -> ScheduleSpec:
    return ScheduleSpec(name, IntervalTrigger(MINUTE_MS, T0), "noop", **extra)  # type: ignore[arg-type]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as engine:
        engine.service.create(every_minute("report"), actor="setup")
        engine.service.sync_static([retention_schedule(), anchor_schedule()], actor="setup")
        engine.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="setup")
        engine.service.trigger(ANCHOR_SCHEDULE, tenant=ANCHOR_TENANT, actor="setup")
        for who, role in (("admin", Role.ADMIN), ("bea", Role.APPROVER)):
            engine.storage.operators.grant(Grant(who, role), by="setup", at=T0)
        daemon = engine.daemon(node_id="n1", lease_ttl_ms=LEASE_TTL_MS)
        consumer = engine.consumer(consumer_id="c1", concurrency=1)
        try:
            found = Site(db, clock, engine, daemon, consumer)
            found.run()
            yield found
        finally:
            consumer.close()


def test_every_check_passes_on_a_healthy_scheduler(site: Site) -> None:
    site.clock.advance(30)
    site.run()
    findings = site.findings()
    not_passing = {
        k: (f.status, f.summary) for k, f in findings.items() if f.status is not Status.PASS
    }
    # clock.skew compares with a database server's clock: nothing to compare on SQLite.
    assert not_passing == {"clock.skew": (Status.SKIP, not_passing["clock.skew"][1])}
    assert set(findings) == {c.check_id for c in default_checks()}


# -- each check, failing for real ---------------------------------------------------------------

Breaker = Callable[[Site], dict[str, Finding]]


def _dropped_table(site: Site) -> dict[str, Finding]:
    site.sql("DROP TABLE approvals")
    return site.findings()


def _newer_schema(site: Site) -> dict[str, Finding]:
    site.sql(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    return site.findings()


def _older_schema(site: Site) -> dict[str, Finding]:
    site.sql(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    return site.findings()


def _rollback_journal(site: Site) -> dict[str, Finding]:
    site.engine.close()
    site.sql("PRAGMA journal_mode = DELETE")
    reopened = open_engine(site.db, clock=site.clock, create=False, readonly=True)
    site.engine = reopened
    try:
        return site.findings(read_only=True)
    finally:
        reopened.close()


def _disk_nearly_full(site: Site) -> dict[str, Finding]:
    return site.findings(checks=[StorageDisk(lambda _: (50 * MIB, 500_000 * MIB))])


def _world_readable_database(site: Site) -> dict[str, Finding]:
    site.db.chmod(0o644)  # as umask 022 left it before files were made private
    return site.findings()


def _unknown_zone(site: Site) -> dict[str, Finding]:
    site.sql("UPDATE schedules SET timezone = 'Mars/Olympus_Mons'")
    return site.findings()


def _trigger_that_never_fires(site: Site) -> dict[str, Finding]:
    site.sql(
        "UPDATE schedules SET trigger_kind = 'cron', "
        """trigger_spec = '{"cron":"0 0 31 2 *","dst_missing":"shift","dst_repeated":"first"}'"""
    )
    return site.findings()


def _static_name_taken(site: Site) -> dict[str, Finding]:
    return site.findings(static=[StaticSchedule(every_minute("report"), "tests.doctor")])


def _unknown_command(site: Site) -> dict[str, Finding]:
    site.sql("UPDATE schedules SET command = 'billing.gone'")
    return site.findings(commands=builtin_commands())


def _silent_skip(site: Site) -> dict[str, Finding]:
    site.engine.service.create(
        every_minute("payroll", sensitive=True, misfire=MisfirePolicy(MisfireKind.SKIP)),
        actor="setup",
    )
    return site.findings()


def _nobody_approves(site: Site) -> dict[str, Finding]:
    site.engine.service.create(every_minute("payroll", sensitive=True), actor="setup")
    site.engine.storage.operators.revoke(Grant("bea", Role.APPROVER))
    site.engine.storage.operators.revoke(Grant("admin", Role.ADMIN))
    site.engine.storage.operators.grant(Grant("olga", Role.OPERATOR), by="setup", at=T0)
    return site.findings()


def _sensitive_without_approval(site: Site) -> dict[str, Finding]:
    # Trusted code (which opens the file itself) is not gated by four-eyes: the doctor says so.
    site.engine.service.create(every_minute("payroll", sensitive=True), actor="setup")
    return site.findings()


def _no_lease_store(site: Site) -> dict[str, Finding]:
    site.sql("DROP TABLE leases")
    return site.findings()


def _expired_leader(site: Site) -> dict[str, Finding]:
    site.clock.advance(LEASE_TTL_MS / 1000 + 60)  # the leader stopped renewing; slots are due
    return site.findings()


def _shard_without_leader(site: Site) -> dict[str, Finding]:
    """With 3 lease shards, shards 0 and 2 are led and shard 1 is not, while slots are due."""
    site.clock.advance(60)
    for index in (0, 2):
        lease = site.engine.storage.leases.acquire(shard_lease(index, 3), "t", "node-x", 60_000)
        assert lease is not None
    found = site.findings(shards=3)
    assert "shard(s) 1 of 3" in found["lease.holder"].summary
    return found


def _stalled_queue(site: Site) -> dict[str, Finding]:
    site.clock.advance(60)
    settle(site.daemon)  # a fire is dispatched, and no consumer comes
    site.clock.advance(150)
    site.daemon.step()
    return site.findings()


def _silent_consumers(site: Site) -> dict[str, Finding]:
    site.clock.advance(60)
    settle(site.daemon)
    site.clock.advance(360)  # five minutes and more since a consumer took a fire
    site.daemon.step()
    return site.findings()


def _dead_letter(site: Site) -> dict[str, Finding]:
    run = site.engine.service.trigger("report", actor="setup")
    claim = site.engine.storage.fire_queue.claim(consumer="c9", ttl_ms=60_000, limit=5)
    site.engine.storage.fire_queue.settle(
        claim.token,
        "c9",
        [Settlement(run.id, Outcome.DISCARD, RunState.DEAD_LETTERED, error="x")],
    )
    return site.findings()


def _sweeper_never_completed(site: Site) -> dict[str, Finding]:
    site.sql("DELETE FROM fire_queue", "DELETE FROM runs WHERE tenant = 'system'")
    site.clock.advance(49 * 3600)  # two days, and the daily sweep never ran
    return site.findings()


def _daemon_stopped_three_periods(site: Site) -> dict[str, Finding]:
    site.clock.advance(3 * 60 + 5)  # three missed slots: no daemon stepped meanwhile
    return site.findings()


def _plugin_that_cannot_load(site: Site) -> dict[str, Finding]:
    return site.findings(
        plugins=None,
        plugin_problem="audit_sinks = 'siem': no audit sink of that name (known: jsonl)",
    )


def _failing_audit_sink(site: Site) -> dict[str, Finding]:
    site.engine.storage.plugin_state.report_health(
        [
            PluginHealth(
                node_id="n1",
                port="audit_sinks",
                plugin="siem",
                calls=4,
                failures=9,
                timeouts=0,
                dropped=0,
                busy_since=None,
                backlog=12,
                last_error="ConnectionError: refused",
                last_error_at=site.clock.now_ms() - 1_000,
                reported_at=site.clock.now_ms(),
            )
        ]
    )
    return site.findings()


def _bad_tolerance(site: Site) -> dict[str, Finding]:
    site.sql("""UPDATE schedules SET metadata = '{"deadman_tolerance":"soon"}'""")
    return site.findings()


FAILURES: list[tuple[str, Breaker, Status]] = [
    ("storage.reachable", _dropped_table, Status.FAIL),
    ("storage.schema", _newer_schema, Status.FAIL),
    ("storage.schema", _older_schema, Status.FAIL),
    ("storage.wal", _rollback_journal, Status.FAIL),
    ("storage.disk", _disk_nearly_full, Status.FAIL),
    ("storage.file_modes", _world_readable_database, Status.FAIL),
    ("time.zones", _unknown_zone, Status.FAIL),
    ("schedule.triggers", _trigger_that_never_fires, Status.FAIL),
    ("schedule.names", _static_name_taken, Status.FAIL),
    ("commands.allowlist", _unknown_command, Status.FAIL),
    ("schedule.misfire", _silent_skip, Status.WARN),
    ("governance.sensitive", _nobody_approves, Status.FAIL),
    ("governance.sensitive", _sensitive_without_approval, Status.FAIL),
    ("lease.probe", _no_lease_store, Status.FAIL),
    ("lease.holder", _expired_leader, Status.FAIL),
    ("lease.holder", _shard_without_leader, Status.FAIL),
    ("queue.stall", _stalled_queue, Status.FAIL),
    ("queue.dead_letters", _dead_letter, Status.FAIL),
    ("consumers.alive", _silent_consumers, Status.FAIL),
    ("retention.health", _sweeper_never_completed, Status.FAIL),
    ("schedules.overdue", _daemon_stopped_three_periods, Status.FAIL),
    ("deadman.wiring", _bad_tolerance, Status.FAIL),
    ("plugins.ports", _plugin_that_cannot_load, Status.FAIL),
    ("plugins.health", _failing_audit_sink, Status.WARN),
]


@pytest.mark.parametrize(
    ("check_id", "breaker", "status"), FAILURES, ids=[f"{c}-{b.__name__}" for c, b, _ in FAILURES]
)
def test_each_check_fails_when_its_subject_is_broken(
    site: Site, check_id: str, breaker: Breaker, status: Status
) -> None:
    finding = breaker(site)[check_id]
    assert finding.status is status, finding
    assert finding.summary
    assert finding.remediation, "a failing check says what to do"


def test_every_check_is_made_to_fail_by_some_test() -> None:
    covered = {c for c, _, _ in FAILURES} | {
        "audit.key",  # tests/integration/test_doctor_governance.py
        "audit.chain",
        "governance.operators",
        "audit.anchor_age",  # tests/integration/test_audit_anchors.py
        "clock.skew",  # tests/integration/test_doctor_postgres.py (PostgreSQL only)
        "cluster.nodes",  # tests/integration/test_balanced_shards.py
        "lease.redis_deployment",  # tests/integration/test_redis_prefix.py (Redis)
        "consumers.deaths",  # tests/integration/test_consumer_deaths.py
        "runs.over_limit",  # tests/integration/test_time_limits.py
        "runs.ignored_cancel",
    }
    assert {c.check_id for c in default_checks()} - covered == set()


def test_a_disk_getting_full_is_a_warning(site: Site) -> None:
    finding = site.findings(checks=[StorageDisk(lambda _: (9_000 * MIB, 100_000 * MIB))])
    assert finding["storage.disk"].status is Status.WARN


# -- the CLI and its JSON -----------------------------------------------------------------------

SCHEMA_FIELDS = {"check_id", "status", "summary", "detail", "remediation"}


def test_the_json_output_follows_its_documented_schema(site: Site) -> None:
    site.engine.close()
    result = run_cli("doctor", "--json", db=site.db)
    report = json.loads(result.stdout)
    assert set(report) == {"schema_version", "clear", "findings"}
    assert report["schema_version"] == 1
    assert isinstance(report["clear"], bool)
    assert report["clear"] is (result.code == 0)
    for finding in report["findings"]:
        assert set(finding) == SCHEMA_FIELDS
        assert finding["status"] in {"pass", "warn", "fail", "skip"}
        assert all(isinstance(v, str) for v in finding.values())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for check in default_checks():
        assert f"`{check.check_id}`" in readme, f"{check.check_id} is not documented"
