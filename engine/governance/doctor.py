"""Doctor: health checks that gate a deploy. Each check returns one finding (pass, warn, fail
or skip) with a summary, the detail, and what to do about it; a check that crashes is a
failure of that check, never of the doctor.

Checks read; none changes the database (the audit check verifies without recording).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from engine.commands import CommandRegistry
from engine.commands.decorators import StaticSchedule
from engine.domain.audit import KeyRing
from engine.domain.clock import Clock
from engine.domain.database import Database, PlainDatabase
from engine.domain.errors import AuditKeyMissing, InvalidInput, VortosError
from engine.domain.redact import scrub
from engine.governance.audit import ChainReport, verify
from engine.governance.keys import KEY_ENV, KEY_FILE_ENV, key_source, load_keyring
from engine.ports.diagnostics import Diagnostics
from engine.ports.storage import Storage
from engine.settings_values import SettingValues

log = logging.getLogger("vortos.doctor")

JSON_SCHEMA_VERSION = 1


class Status(StrEnum):
    PASS = "pass"  # noqa: S105 - a status, not a password
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Finding:
    check_id: str
    status: Status
    summary: str
    detail: str = ""
    remediation: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "check_id": self.check_id,
            "status": self.status.value,
            "summary": self.summary,
            "detail": self.detail,
            "remediation": self.remediation,
        }


@dataclass(slots=True)
class DoctorContext:
    """What checks look at. `remote_verify`, when set, verifies the audit chains where the key
    is (a control socket's server) and returns the reports. `commands` and `static` are the
    app's (None: not given, so those checks are skipped). `shards`: how many lease shards the
    daemons lead (each its own lease)."""

    storage: Storage
    clock: Clock
    db: Database | PlainDatabase  # a SQLite file or a PostgreSQL URL
    key_file: Path | None = None
    remote_verify: Callable[[], list[ChainReport]] | None = None
    diagnostics: Diagnostics | None = None
    commands: CommandRegistry | None = None
    static: Sequence[StaticSchedule] | None = None
    read_only: bool = True
    shards: int = 1  # the deployment's lease shards (the shards setting)
    plugins: Selection | None = None  # the plug-ins the settings select, loaded
    plugin_problem: str | None = None  # why they could not be loaded
    plugin_timeout_ms: int = 5_000
    settings: SettingValues | None = None  # the effective settings (the lease driver's)


class Check(Protocol):
    """One health check. `check_id` is stable (scripts and alerts match on it)."""

    @property
    def check_id(self) -> str: ...

    def run(self, ctx: DoctorContext) -> Finding: ...


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)

    @property
    def clear(self) -> bool:
        """No failure (warnings do not block a deploy)."""
        return all(f.status is not Status.FAIL for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "clear": self.clear,
            "findings": [f.to_json() for f in self.findings],
        }


def run_checks(ctx: DoctorContext, checks: Sequence[Check]) -> Report:
    report = Report()
    for check in checks:
        try:
            report.findings.append(_scrubbed(check.run(ctx)))
        except Exception as exc:  # one broken check must not hide the others' findings
            log.exception("doctor check %s crashed", check.check_id)
            report.findings.append(
                Finding(
                    check.check_id,
                    Status.FAIL,
                    "the check itself failed",
                    f"{type(exc).__name__}: {exc}",
                    "report this: a check should never crash",
                )
            )
    return report


def _scrubbed(finding: Finding) -> Finding:
    """A finding without any URL's password: a check (or a plug-in's) may quote a URL."""
    return Finding(
        finding.check_id,
        finding.status,
        scrub(finding.summary),
        scrub(finding.detail),
        scrub(finding.remediation),
    )


# -- checks -------------------------------------------------------------------------------------


class AuditKeyCheck:
    """The audit key is where it must be: without it nothing can be changed or dispatched
    (and the chain cannot be verified), so a missing key is a failure, never a silent skip."""

    check_id = "audit.key"

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.remote_verify is not None:
            return Finding(
                self.check_id,
                Status.SKIP,
                "the key is the control socket's server's (see audit.chain)",
            )
        empty = ctx.storage.audit.is_empty()
        try:
            where, _ = key_source(ctx.db, ctx.key_file)
            keys = load_keyring(ctx.db, key_file=ctx.key_file, create=False)
        except AuditKeyMissing as exc:
            if empty:
                return Finding(
                    self.check_id,
                    Status.WARN,
                    "no audit key yet",
                    f"{exc}",
                    "nothing is audited yet: the first change creates the key file; back it up",
                )
            return Finding(
                self.check_id,
                Status.FAIL,
                "the audit key is missing",
                str(exc),
                f"restore the key file from your backup, or set {KEY_FILE_ENV} (or {KEY_ENV}) "
                "to it; never make a new key for a chain that has entries",
            )
        except InvalidInput as exc:
            return Finding(
                self.check_id,
                Status.FAIL,
                "the audit key cannot be read",
                str(exc),
                "fix the key file: one key per line (as `vortos audit rotate-key` writes)",
            )
        return Finding(
            self.check_id,
            Status.PASS,
            f"audit key present ({len(keys.ids)} key(s), signing with {keys.active_id})",
            f"from {where}",
        )


class AuditChainCheck:
    """Every chain verifies from its last verified point up to its head (not recorded)."""

    check_id = "audit.chain"

    def run(self, ctx: DoctorContext) -> Finding:
        try:
            reports = ctx.remote_verify() if ctx.remote_verify is not None else self._local(ctx)
        except AuditKeyMissing:
            return Finding(
                self.check_id, Status.SKIP, "cannot verify without the audit key (see audit.key)"
            )
        except VortosError as exc:
            return Finding(
                self.check_id,
                Status.FAIL,
                "the audit chains could not be verified",
                str(exc),
                "see the detail; `vortos audit verify` says the same",
            )
        if not reports:
            return Finding(self.check_id, Status.PASS, "no audit entries yet")
        broken = [r for r in reports if not r.intact]
        heads = ", ".join(f"{r.chain}={r.head.seq}" for r in reports)
        if broken:
            first = broken[0]
            assert first.problem is not None
            return Finding(
                self.check_id,
                Status.FAIL,
                f"audit chain {first.chain} is broken at entry {first.problem.seq}",
                f"{first.problem.reason}; {len(broken)} of {len(reports)} chain(s) broken",
                "investigate: compare with an export (`vortos audit export`) or backup; a wrong "
                "key fails every signature (check which key file is in use)",
            )
        checked = sum(r.checked for r in reports)
        return Finding(
            self.check_id,
            Status.PASS,
            f"{len(reports)} chain(s) verified up to their heads",
            f"heads {heads}; {checked} new entr{'y' if checked == 1 else 'ies'} checked",
        )

    @staticmethod
    def _local(ctx: DoctorContext) -> list[ChainReport]:
        keys: KeyRing = load_keyring(ctx.db, key_file=ctx.key_file, create=False)
        return verify(ctx.storage.audit, keys, record=False).chains


class OperatorsCheck:
    """A database changed by operators' tools has an admin in every tenant."""

    check_id = "governance.operators"

    def run(self, ctx: DoctorContext) -> Finding:
        operators = ctx.storage.operators
        if operators.count() == 0:
            return Finding(
                self.check_id,
                Status.WARN,
                "no operator has a role yet",
                "until someone does, any account that can open the database may change it",
                "make the first change as the account that should be admin, or "
                "`vortos operators grant NAME admin`",
            )
        admins = [g for g in operators.grants() if g.role.value == "admin" and g.tenant == "*"]
        if not admins:
            return Finding(
                self.check_id,
                Status.WARN,
                "no admin in every tenant",
                "nobody can grant or revoke roles",
                "have trusted code grant one: open_engine(db).service.grant_role(...)",
            )
        names = ", ".join(sorted(g.operator for g in admins))
        return Finding(self.check_id, Status.PASS, f"{operators.count()} grant(s); admins: {names}")


GOVERNANCE_CHECKS: tuple[Check, ...] = (AuditKeyCheck(), AuditChainCheck(), OperatorsCheck())


def default_checks() -> list[Check]:
    """Every check, in the order the doctor reports them."""
    # Imported here: the checks import this module's types.
    from engine.governance import checks as c  # noqa: PLC0415
    from engine.governance.anchor_checks import AnchorAge  # noqa: PLC0415
    from engine.governance.cluster_checks import NodeShards, RedisDeployment  # noqa: PLC0415
    from engine.governance.execution_checks import (  # noqa: PLC0415
        CommandsIgnoringCancel,
        ConsumerDeaths,
        RunsOverLimit,
    )
    from engine.governance.plugin_checks import PluginsHealth, PluginsServing  # noqa: PLC0415

    return [
        c.StorageReachable(),
        c.StorageSchema(),
        c.StorageDurability(),
        c.StorageDisk(),
        c.FileModes(),
        c.ClockSkew(),
        c.TimeZones(),
        c.ScheduleTriggers(),
        c.ScheduleNames(),
        c.CommandAllowlist(),
        c.MisfireSettings(),
        c.SensitiveApprovers(),
        c.LeaseProbe(),
        c.LeaseHolder(),
        NodeShards(),
        RedisDeployment(),
        c.QueueStall(),
        c.DeadLetters(),
        c.ConsumersAlive(),
        ConsumerDeaths(),
        RunsOverLimit(),
        CommandsIgnoringCancel(),
        c.RetentionHealth(),
        c.Overdue(),
        c.DeadManTolerances(),
        *GOVERNANCE_CHECKS,
        AnchorAge(),
        PluginsServing(),
        PluginsHealth(),
    ]


# Imported last: importing engine.plugins.registry first runs the package engine.plugins,
# whose public surface takes Check, DoctorContext, Finding and Status from this module, so
# importing it before they are defined would be circular. The name is needed at run time only
# to resolve DoctorContext's annotations (typing.get_type_hints).
from engine.plugins.registry import Selection  # noqa: E402
