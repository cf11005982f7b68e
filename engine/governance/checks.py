"""The scheduler's doctor checks: storage, time, schedules, leases, the fire queue, dead-man.

Each reads through ports (and the backend's Diagnostics); the lease probe is the one check that
writes (a probe lease taken and given back at once), and it is skipped on a read-only database.
"""

from __future__ import annotations

import secrets
import shutil
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.backends.registry import database_of
from engine.domain.approvals import ApprovalState, GatedOperation
from engine.domain.errors import AuditKeyMissing, StorageError, VortosError
from engine.domain.run import RunState
from engine.domain.schedule import MisfireKind, Schedule, ScheduleOrigin, ScheduleStatus
from engine.domain.triggers import OneShotTrigger
from engine.file_modes import current_file_access, loose, vortos_files
from engine.governance.deadman import Verdict, judged
from engine.governance.doctor import DoctorContext, Finding, Status
from engine.governance.keys import key_source
from engine.ports.lease import LEADER_LEASE, shard_lease
from engine.ports.runs import RunQuery
from engine.ports.schedules import ScheduleQuery
from engine.retention.command import SWEEP_SCHEDULE, SWEEP_TENANT

MIB = 1024 * 1024
DISK_FAIL_BYTES = 100 * MIB
DISK_FAIL_SHARE = 0.02
DISK_WARN_SHARE = 0.10
STALL_MS = 120_000  # a fire waiting this long for a consumer: the queue is stalled
CONSUMER_SILENCE_MS = 300_000
LIST_AT_MOST = 5
ACTIVATING = frozenset({GatedOperation.CREATE, GatedOperation.RESUME, GatedOperation.UPDATE})
EXPLICIT_MISFIRE_KEY = "misfire_policy_explicit"

FreeSpace = Callable[[Path], tuple[int, int]]  # (free bytes, total bytes) of a directory


def disk_space(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.free, usage.total


class _Named:
    """A finding maker for one check id."""

    def __init__(self, check_id: str) -> None:
        self.check_id = check_id

    def ok(self, summary: str, detail: str = "") -> Finding:
        return Finding(self.check_id, Status.PASS, summary, detail)

    def warn(self, summary: str, detail: str, remediation: str) -> Finding:
        return Finding(self.check_id, Status.WARN, summary, detail, remediation)

    def fail(self, summary: str, detail: str, remediation: str) -> Finding:
        return Finding(self.check_id, Status.FAIL, summary, detail, remediation)

    def skip(self, summary: str) -> Finding:
        return Finding(self.check_id, Status.SKIP, summary)


def _upgrade(ctx: DoctorContext) -> str:
    """The command that creates or upgrades the schema of the doctor's database."""
    return "`vortos db init`" if database_of(ctx.db).is_file else "`vortos --db URL db migrate`"


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:LIST_AT_MOST])
    return shown + (f" and {len(names) - LIST_AT_MOST} more" if len(names) > LIST_AT_MOST else "")


def _schedules(ctx: DoctorContext) -> Iterator[Schedule]:
    offset = 0
    while True:
        page = ctx.storage.schedules.query(ScheduleQuery(limit=1000, offset=offset))
        yield from page
        if len(page) < 1000:
            return
        offset += 1000


# -- storage ------------------------------------------------------------------------------------


class StorageReachable(_Named):
    def __init__(self) -> None:
        super().__init__("storage.reachable")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None:
            return self.skip("no diagnostics for this backend")
        problems = ctx.diagnostics.unreadable_tables()
        if problems:
            detail = "; ".join(f"{t}: {why}" for t, why in problems.items())
            return self.fail(
                f"{len(problems)} table(s) cannot be read",
                detail,
                f"restore the database from a backup, or run {_upgrade(ctx)} to upgrade it",
            )
        return self.ok("every table can be read")


class StorageSchema(_Named):
    def __init__(self) -> None:
        super().__init__("storage.schema")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None:
            return self.skip("no diagnostics for this backend")
        facts = ctx.diagnostics.storage_facts()
        # `vortos run` upgrades a SQLite file; a PostgreSQL schema only `vortos db migrate` does.
        upgrades_on_start = (
            " (or start `vortos run`, which upgrades)" if facts.backend == "sqlite" else ""
        )
        if facts.schema_version < facts.supported_schema_version:
            return self.fail(
                f"schema version {facts.schema_version}, this Vortos needs "
                f"{facts.supported_schema_version}",
                facts.location,
                f"upgrade it: {_upgrade(ctx)}{upgrades_on_start}",
            )
        if facts.schema_version > facts.supported_schema_version:
            return self.fail(
                f"schema version {facts.schema_version} is newer than this Vortos "
                f"({facts.supported_schema_version})",
                facts.location,
                "run the Vortos release that made it (or a newer one)",
            )
        return self.ok(f"schema version {facts.schema_version}", facts.location)


class StorageDurability(_Named):
    def __init__(self) -> None:
        super().__init__("storage.wal")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None:
            return self.skip("no diagnostics for this backend")
        facts = ctx.diagnostics.storage_facts()
        if facts.journal_mode is None:
            return self.skip(f"not a journal-mode backend ({facts.backend})")
        if facts.journal_mode != "wal":
            return self.fail(
                f"journal mode {facts.journal_mode}, not wal",
                "without WAL, readers (the console, the CLI) block the scheduler's writes",
                "open it with `vortos db init`, which sets WAL; check no tool changed it",
            )
        if facts.synchronous not in ("normal", "full", "extra"):
            return self.fail(
                f"synchronous={facts.synchronous}",
                "a crash or power cut may lose committed dispatches",
                "let Vortos set it (normal, with WAL): do not override PRAGMA synchronous",
            )
        return self.ok(f"WAL, synchronous={facts.synchronous}")


class StorageDisk(_Named):
    def __init__(self, free_space: FreeSpace = disk_space) -> None:
        super().__init__("storage.disk")
        self.free_space = free_space

    def run(self, ctx: DoctorContext) -> Finding:
        path = database_of(ctx.db).path
        if path is None:
            return self.skip("the database server's disk is the server's to watch")
        where = path.resolve().parent
        free, total = self.free_space(where)
        share = free / total if total else 0.0
        said = f"{free // MIB} MiB free of {total // MIB} MiB ({share:.0%}) at {where}"
        if free < DISK_FAIL_BYTES or share < DISK_FAIL_SHARE:
            return self.fail(
                "the database's disk is nearly full",
                said,
                "free space or move the database: SQLite fails every write when the disk fills",
            )
        if share < DISK_WARN_SHARE:
            return self.warn(
                "the database's disk is getting full",
                said,
                "free space, or prune older runs (`vortos prune`)",
            )
        return self.ok("enough free disk space", said)


class FileModes(_Named):
    """No file of Vortos (the database, its -wal/-shm, the audit key) is more open than its
    layout: readable by others is a failure (payloads hold tokens; the key forges the chain),
    readable by a group other than the control group a warning."""

    def __init__(self) -> None:
        super().__init__("storage.file_modes")

    def run(self, ctx: DoctorContext) -> Finding:
        access = current_file_access()
        db = database_of(ctx.db).path
        try:
            _, key = key_source(ctx.db, ctx.key_file)
        except AuditKeyMissing:
            key = None
        files = vortos_files(None if db is None else db.resolve(), key, access)
        found = [problem for path, want in files if (problem := loose(path, want)) is not None]
        if not found:
            checked = sum(1 for path, _ in files if path.exists())
            return self.ok(f"{checked} file(s), none more open than {access.describe()}")
        detail = "; ".join(p.describe() for p in found)
        fixes = "; ".join(p.fix() for p in found)
        others = [p for p in found if p.world]
        keys = [p for p in found if p.path == key]
        if others or keys:
            return self.fail(
                f"{len(found)} file(s) of Vortos are readable beyond their layout",
                detail,
                f"run, as the files' owner: {fixes} (or restart `vortos run`, which tightens "
                "them); with the shared-read layout set control_group so the doctor knows it",
            )
        return self.warn(
            f"{len(found)} file(s) of Vortos are readable by a group beyond the layout",
            detail,
            f"run, as the files' owner: {fixes}; with the shared-read layout set control_group "
            "(vortos.toml or VORTOS_CONTROL_GROUP) so the doctor knows it",
        )


# A database server's clock against this host's. Leases and claims are judged on the server's
# clock (every node reads it), so skew cannot break exactly-once; but a node opened with a clock
# of its own, the commands' own notion of "now", logs, metrics and traces use this host's. The
# doctor does not know the lease TTL each daemon runs with, so the limits are fixed: a second is
# more than NTP ever leaves, 5 s is a third of the default lease TTL (15 s).
SKEW_WARN_MS = 1_000
SKEW_FAIL_MS = 5_000


class ClockSkew(_Named):
    """This host's clock agrees with the database server's (PostgreSQL; SQLite has no clock
    of its own)."""

    def __init__(self) -> None:
        super().__init__("clock.skew")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None or ctx.diagnostics.storage_facts().backend == "sqlite":
            return self.skip("the embedded database shares this host's clock")
        skew = ctx.diagnostics.clock_skew_ms()
        if skew is None:
            return self.skip("no clock to compare with")
        ahead = "ahead of" if skew > 0 else "behind"
        said = (
            f"the database server's clock is {abs(skew)} ms {ahead} this host's"
            if skew
            else "the database server's clock and this host's read the same millisecond"
        )
        remedy = "synchronise both clocks with NTP (chrony or systemd-timesyncd) and check again"
        if abs(skew) > SKEW_FAIL_MS:
            return self.fail(
                f"this host's clock is {abs(skew) / 1000:.1f} s off the database server's",
                f"{said} (fails over {SKEW_FAIL_MS} ms)",
                remedy,
            )
        if abs(skew) > SKEW_WARN_MS:
            return self.warn(
                f"this host's clock is {abs(skew) / 1000:.1f} s off the database server's",
                f"{said} (warns over {SKEW_WARN_MS} ms)",
                remedy,
            )
        return self.ok(f"clocks agree to within {abs(skew)} ms", said)


# -- time and schedules ---------------------------------------------------------------------------


class TimeZones(_Named):
    def __init__(self) -> None:
        super().__init__("time.zones")

    def run(self, ctx: DoctorContext) -> Finding:
        if not zoneinfo.available_timezones():
            return self.fail(
                "no time-zone database on this host",
                "zoneinfo finds neither the system's zone files nor the tzdata package",
                "install tzdata (the OS package, or `pip install tzdata`)",
            )
        zones = ctx.diagnostics.zones_in_use() if ctx.diagnostics else []
        unknown = []
        for name in zones:
            try:
                zoneinfo.ZoneInfo(name)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                unknown.append(name)
        if unknown:
            return self.fail(
                f"{len(unknown)} zone(s) in use are unknown here",
                _some(unknown),
                "update the time-zone database (tzdata) on this host",
            )
        return self.ok(f"{len(zones)} zone(s) in use, all known")


class ScheduleTriggers(_Named):
    """C1: every active schedule can be read and has a next slot."""

    def __init__(self) -> None:
        super().__init__("schedule.triggers")

    def run(self, ctx: DoctorContext) -> Finding:
        try:
            schedules = list(_schedules(ctx))
        except StorageError as exc:
            return self.fail(
                "a schedule cannot be read",
                str(exc),
                "delete it and add it again, or restore the database",
            )
        now = ctx.clock.now_ms()
        stuck = []
        for s in schedules:
            if s.status is not ScheduleStatus.ACTIVE or isinstance(s.trigger, OneShotTrigger):
                continue
            try:
                if s.trigger.slot_after(now, s.timezone) is None:
                    stuck.append(f"{s.tenant}/{s.name}")
            except VortosError:
                stuck.append(f"{s.tenant}/{s.name}")
        if stuck:
            return self.fail(
                f"{len(stuck)} active schedule(s) will never fire again",
                _some(stuck),
                "fix their triggers (`vortos schedule edit`) or delete them",
            )
        return self.ok(f"{len(schedules)} schedule(s) readable, every active one has a next slot")


class ScheduleNames(_Named):
    """C2: no dynamic schedule holds the name of a static one the app declares."""

    def __init__(self) -> None:
        super().__init__("schedule.names")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.static is None:
            return self.skip("no app given (--app): nothing declared to compare")
        clashes = []
        for item in ctx.static:
            found = ctx.storage.schedules.find_by_name(item.spec.tenant, item.spec.name)
            if found is not None and found.origin is ScheduleOrigin.DYNAMIC:
                clashes.append(f"{item.spec.tenant}/{item.spec.name}")
        if clashes:
            return self.fail(
                f"{len(clashes)} declared schedule(s) clash with dynamic ones",
                _some(clashes),
                "delete the dynamic schedule, or rename the static one: `vortos run --app` "
                "refuses to start otherwise",
            )
        return self.ok(f"{len(ctx.static)} declared schedule(s), no clash")


class CommandAllowlist(_Named):
    """C3: every stored schedule's command is registered (or its fires dead-letter)."""

    def __init__(self) -> None:
        super().__init__("commands.allowlist")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.commands is None:
            return self.skip("no command registry given")
        unknown = sorted(
            {
                f"{s.command} ({s.tenant}/{s.name})"
                for s in _schedules(ctx)
                if s.status is ScheduleStatus.ACTIVE and s.command not in ctx.commands
            }
        )
        if unknown:
            return self.fail(
                f"{len(unknown)} active schedule(s) run a command this process does not know",
                _some(unknown),
                "run the doctor with the same --app as `vortos run` (or register the command); "
                "unknown commands dead-letter every fire",
            )
        return self.ok("every active schedule's command is registered")


class MisfireSettings(_Named):
    """C7: a sensitive schedule that skips missed slots says it means to."""

    def __init__(self) -> None:
        super().__init__("schedule.misfire")

    def run(self, ctx: DoctorContext) -> Finding:
        silent = [
            f"{s.tenant}/{s.name}"
            for s in _schedules(ctx)
            if s.sensitive
            and s.misfire.kind is MisfireKind.SKIP
            and s.metadata.get(EXPLICIT_MISFIRE_KEY) != "true"
        ]
        if silent:
            return self.warn(
                f"{len(silent)} sensitive schedule(s) drop missed slots silently",
                _some(silent),
                f"confirm with metadata {EXPLICIT_MISFIRE_KEY}=true, or use --misfire latest",
            )
        return self.ok("misfire settings are deliberate")


class SensitiveApprovers(_Named):
    """C6: every active sensitive schedule made at runtime was approved by a second operator
    (static ones are reviewed with their code), and someone may approve their changes."""

    def __init__(self) -> None:
        super().__init__("governance.sensitive")

    def run(self, ctx: DoctorContext) -> Finding:
        sensitive = [s for s in _schedules(ctx) if s.sensitive]
        if not sensitive:
            return self.ok("no sensitive schedule")
        if ctx.storage.operators.count() == 0:
            return self.skip("nobody governs the database yet (see governance.operators)")
        approvers = {
            g.operator
            for g in ctx.storage.operators.grants()
            if g.role.value in ("approver", "admin")
        }
        if not approvers:
            return self.fail(
                f"{len(sensitive)} sensitive schedule(s), nobody may approve their changes",
                _some([f"{s.tenant}/{s.name}" for s in sensitive]),
                "grant the approver role: `vortos operators grant NAME approver`",
            )
        approved = {
            (a.tenant, a.schedule)
            for a in ctx.storage.approvals.list(state=ApprovalState.CONSUMED, limit=100_000)
            if a.operation in ACTIVATING
        }
        unapproved = [
            f"{s.tenant}/{s.name}"
            for s in sensitive
            if s.status is ScheduleStatus.ACTIVE
            and s.origin is ScheduleOrigin.DYNAMIC
            and (s.tenant, s.name) not in approved
        ]
        if unapproved:
            return self.fail(
                f"{len(unapproved)} active sensitive schedule(s) never approved by a second "
                "operator",
                f"{_some(unapproved)} (made or activated by code that opens the database "
                "itself, which four-eyes does not gate)",
                "have them reviewed: pause each, then resume it through the CLI or the console, "
                "which asks an approver",
            )
        return self.ok(
            f"{len(sensitive)} sensitive schedule(s); approvers: {_some(sorted(approvers))}"
        )


# -- leases, queue, consumers ---------------------------------------------------------------------


class LeaseProbe(_Named):
    """C4: a lease can be taken and given back."""

    def __init__(self) -> None:
        super().__init__("lease.probe")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.read_only:
            return self.skip("read-only here: the probe would write")
        key, token = f"doctor:probe:{secrets.token_hex(4)}", secrets.token_hex(8)
        try:
            taken = ctx.storage.leases.acquire(key, token, "doctor", 5_000)
            if taken is None:
                return self.fail(
                    "a probe lease could not be taken",
                    key,
                    "look for another process holding doctor probes; retry",
                )
            ctx.storage.leases.release(key, token)
        except VortosError as exc:
            return self.fail(
                "the lease store does not work", str(exc), "see the detail; check storage"
            )
        return self.ok("a probe lease was taken and given back")


class LeaseHolder(_Named):
    """Someone leads, and is alive: otherwise nothing is dispatched."""

    def __init__(self) -> None:
        super().__init__("lease.holder")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.shards > 1:
            return self._shards(ctx)
        leader = ctx.storage.leases.current(LEADER_LEASE)
        if leader is not None:
            return self.ok(f"{leader.holder} leads")
        return self._nobody(ctx, "no live leader")

    def _shards(self, ctx: DoctorContext) -> Finding:
        holders = {
            i: ctx.storage.leases.current(shard_lease(i, ctx.shards)) for i in range(ctx.shards)
        }
        orphans = [i for i, lease in holders.items() if lease is None]
        if not orphans:
            said = ", ".join(f"{i}: {lease.holder}" for i, lease in holders.items() if lease)
            return self.ok(f"every one of {ctx.shards} shards has a leader", said)
        return self._nobody(
            ctx, f"shard(s) {', '.join(map(str, orphans))} of {ctx.shards} have no live leader"
        )

    def _nobody(self, ctx: DoctorContext, summary: str) -> Finding:
        due = ctx.storage.dispatcher.next_due_at()
        now = ctx.clock.now_ms()
        if due is not None and due <= now:
            return self.fail(
                f"{summary} while schedules are due",
                f"the oldest due slot is {(now - due) // 1000}s late",
                "start `vortos run` (or check why it stopped: its log, systemd); with lease "
                "shards, every node must run with the same --shards",
            )
        return self.warn(summary, "nothing is due yet", "start `vortos run` before anything is due")


class QueueStall(_Named):
    """C11: no fire waits for a consumer longer than two minutes."""

    def __init__(self) -> None:
        super().__init__("queue.stall")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None:
            return self.skip("no diagnostics for this backend")
        now = ctx.clock.now_ms()
        facts = ctx.diagnostics.queue_facts(now)
        if facts.oldest_waiting_at is not None and now - facts.oldest_waiting_at > STALL_MS:
            return self.fail(
                f"{facts.waiting} fire(s) waiting, the oldest for "
                f"{(now - facts.oldest_waiting_at) // 1000}s",
                "no consumer is taking them",
                "run consumers: `vortos run` (without --no-consume) or `vortos consume`",
            )
        return self.ok(f"{facts.waiting} fire(s) waiting, none stalled")


class DeadLetters(_Named):
    """C12: no dead letter waits for an operator."""

    def __init__(self) -> None:
        super().__init__("queue.dead_letters")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None:
            return self.skip("no diagnostics for this backend")
        dead = ctx.diagnostics.queue_facts(ctx.clock.now_ms()).dead_letters
        if dead:
            return self.fail(
                f"{dead} dead letter(s)",
                "fires that failed every attempt, failed for good or were abandoned too often",
                "look at them (`vortos queue list`), fix the cause, then `vortos queue requeue` "
                "or `vortos queue purge`",
            )
        return self.ok("no dead letters")


class ConsumersAlive(_Named):
    """A consumer took a fire recently, whenever fires are waiting."""

    def __init__(self) -> None:
        super().__init__("consumers.alive")

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.diagnostics is None:
            return self.skip("no diagnostics for this backend")
        now = ctx.clock.now_ms()
        facts = ctx.diagnostics.queue_facts(now)
        if facts.waiting == 0:
            return self.ok("no fire is waiting")
        last = facts.last_claim_at
        if last is None or now - last > CONSUMER_SILENCE_MS:
            since = "never" if last is None else f"{(now - last) // 1000}s ago"
            return self.fail(
                f"{facts.waiting} fire(s) waiting; a consumer last took one {since}",
                "consumers run the fires' commands",
                "run consumers: `vortos run` (without --no-consume) or `vortos consume`",
            )
        return self.ok(f"a consumer took a fire {(now - last) // 1000}s ago")


# -- retention ----------------------------------------------------------------------------------

RETENTION_STALE_MS = 48 * 3600 * 1000


class RetentionHealth(_Named):
    """C10: the daily retention sweep runs and completes."""

    def __init__(self) -> None:
        super().__init__("retention.health")

    def run(self, ctx: DoctorContext) -> Finding:
        sweeper = ctx.storage.schedules.find_by_name(SWEEP_TENANT, SWEEP_SCHEDULE)
        if sweeper is None:
            return self.warn(
                "the retention sweeper is not installed",
                "run history grows without bound until it is",
                "start `vortos run` once: it installs the daily sweep (or run `vortos prune`)",
            )
        if sweeper.status is not ScheduleStatus.ACTIVE:
            return self.warn(
                f"the retention sweeper is {sweeper.status.value}",
                sweeper.pause_note or "",
                f"resume it: `vortos schedule resume {SWEEP_SCHEDULE} --tenant {SWEEP_TENANT}`",
            )
        now = ctx.clock.now_ms()
        recent = ctx.storage.runs.query(
            RunQuery(tenant=SWEEP_TENANT, schedule_id=sweeper.id, limit=20)
        )
        finished = [r for r in recent if r.state is RunState.COMPLETED and r.finished_at]
        if not recent:
            if now - sweeper.created_at <= RETENTION_STALE_MS:
                return self.skip("the retention sweeper has not had its first slot yet")
            return self.fail(
                "the retention sweeper never ran",
                f"installed {(now - sweeper.created_at) // 3_600_000} h ago",
                "check that `vortos run` leads and its consumers run (lease.holder, "
                "consumers.alive)",
            )
        if not finished:
            return self.fail(
                "the retention sweeper has not completed a sweep",
                f"its newest run is {recent[0].state.value}: {recent[0].error or 'no error'}",
                "look at it: `vortos runs show ID`; `vortos prune --dry-run` shows what is due",
            )
        last = max(r.finished_at or 0 for r in finished)
        if now - last > RETENTION_STALE_MS:
            return self.fail(
                "the retention sweeper has not completed a sweep for over 48 h",
                f"last completed {(now - last) // 3_600_000} h ago",
                "check that `vortos run` leads and its consumers run; `vortos prune` sweeps now",
            )
        return self.ok(f"the last sweep completed {(now - last) // 60_000} min ago")


# -- dead-man -----------------------------------------------------------------------------------


class Overdue(_Named):
    """C14: every active schedule fired within its tolerance (see engine.governance.deadman)."""

    def __init__(self) -> None:
        super().__init__("schedules.overdue")

    def run(self, ctx: DoctorContext) -> Finding:
        verdicts = judged(ctx.storage.schedules, ctx.storage.runs, ctx.clock.now_ms())
        late = [j for j in verdicts if j.verdict in (Verdict.OVERDUE, Verdict.NEVER_FIRED)]
        if late:
            return self.fail(
                f"{len(late)} schedule(s) overdue",
                _some([f"{j.schedule.tenant}/{j.schedule.name}: {j.reason}" for j in late]),
                "check that `vortos run` is running and leading (lease.holder), and the "
                "breaker is closed; a schedule may set metadata deadman_tolerance",
            )
        return self.ok(f"{len(verdicts)} active schedule(s), none overdue")


class DeadManTolerances(_Named):
    """C13: every active schedule can be judged (its tolerance can be read)."""

    def __init__(self) -> None:
        super().__init__("deadman.wiring")

    def run(self, ctx: DoctorContext) -> Finding:
        verdicts = judged(ctx.storage.schedules, ctx.storage.runs, ctx.clock.now_ms())
        broken = [
            f"{j.schedule.tenant}/{j.schedule.name}: {j.reason}"
            for j in verdicts
            if j.verdict is Verdict.INDETERMINATE and j.schedule.metadata.get("deadman_tolerance")
        ]
        if broken:
            return self.fail(
                f"{len(broken)} schedule(s) set a dead-man tolerance that cannot be read",
                _some(broken),
                "set metadata deadman_tolerance to a duration such as 90s, 2h or 1d",
            )
        judged_count = sum(1 for j in verdicts if j.verdict is not Verdict.INDETERMINATE)
        return self.ok(f"{judged_count} schedule(s) watched by the dead-man detector")
