"""The audit chain's upkeep on a schedule: archiving after each sweep, and external anchors.

- Archiving: when the sweeper's settings name `audit_archive_dir`, each sweep then archives
  the audit entries older than `audit_archive_days` (default: the retention's `days`) into it
  and prunes them from the database (engine.governance.archive). Chains of tenants under a
  legal hold are kept whole.
- Anchors: the built-in static schedule `vortos.audit-anchor` (tenant `system`, every hour
  by default) runs the command `vortos.audit_anchor`, which appends every chain's signed head
  to the anchors file (engine.governance.anchors): its payload's `file`, else
  `<db>.anchors.jsonl` beside a SQLite database.
- Epochs: the same command first seals the audit key's epoch once it is `seal_every` old
  (audit_epoch, default a day): the key evolves one way and the sealed epoch's key is erased,
  so a key stolen later cannot sign anything of it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from engine.backends.sql.audit import SqlAuditLog
from engine.commands.context import FireContext, PermanentFailure
from engine.commands.decorators import SOURCE_KEY, StaticSchedule
from engine.commands.registry import Command, CommandRegistry, command_from
from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput
from engine.domain.schedule import MisfireKind, MisfirePolicy, OverlapPolicy, ScheduleSpec
from engine.domain.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, format_duration
from engine.domain.triggers import IntervalTrigger
from engine.ports.storage import Storage
from engine.retention.settings import RetentionSettings

log = logging.getLogger("vortos.retention")

ANCHOR_COMMAND = "vortos.audit_anchor"
ANCHOR_SCHEDULE = "vortos.audit-anchor"
ANCHOR_TENANT = "system"
ANCHOR_EVERY_MS = HOUR_MS  # audit_anchor_every: how often the heads are anchored
MIN_ANCHOR_EVERY_MS = MINUTE_MS
ANCHOR_SOURCE = "engine.retention.audit_upkeep.anchor_schedule"


def _sql_log(storage: Storage) -> SqlAuditLog[Any]:
    audit = storage.audit
    if not isinstance(audit, SqlAuditLog):
        raise PermanentFailure("this storage's audit log cannot be archived or anchored")
    return audit


def held_tenants(storage: Storage) -> list[str]:
    """Tenants under a legal hold: their chains stay whole in the database."""
    return [o.tenant for o in storage.retention.overrides() if o.legal_hold]


def archive_after_sweep(
    storage: Storage, clock: Clock, settings: RetentionSettings
) -> dict[str, Any] | None:
    """Archive what the settings say is old enough (None: archiving is off)."""
    if settings.audit_archive_dir is None or settings.archive_days == 0:
        return None
    from engine.governance.archive import archive  # noqa: PLC0415 - governance imports retention

    now = clock.now_ms()
    report = archive(
        _sql_log(storage),
        Path(settings.audit_archive_dir),
        before_ms=now - settings.archive_days * DAY_MS,
        now_ms=now,
        held_tenants=held_tenants(storage),
    )
    log.info(
        "audit archive: %d entr(ies) in %d file(s) to %s; chains under a legal hold kept: %s",
        report.archived,
        len(report.files),
        settings.audit_archive_dir,
        ", ".join(report.held) or "none",
    )
    return report.to_json()


def anchor_heads(storage: Storage, clock: Clock, file: Path) -> int:
    """Append every chain's signed head to `file`; how many lines were written."""
    from engine.governance.anchors import append_anchors, signed_heads  # noqa: PLC0415
    from engine.governance.archive import signing_ring  # noqa: PLC0415

    audit = _sql_log(storage)
    now = clock.now_ms()
    ring = signing_ring(audit, now)
    return append_anchors(file, signed_heads(audit, ring, now))


class AnchorCommand:
    """`vortos.audit_anchor`'s callable, attached to one database by the engine opened with
    it (as the sweep command is)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[Storage, Clock, Path | None] | None = None

    def attach(self, storage: Storage, clock: Clock, db_file: Path | None) -> None:
        with self._lock:
            self._target = (storage, clock, db_file)

    def run(self, file: str = "", seal_every: int = 0, *, fire: FireContext) -> dict[str, Any]:
        """Seal the key's epoch when it is `seal_every` ms old (0: never), then append every
        chain's signed head to the anchors file (`file`, else beside the database)."""
        with self._lock:
            target = self._target
        if target is None:
            raise PermanentFailure(
                f"the {ANCHOR_COMMAND} command is not attached to a database: run it in a "
                "consumer of an engine opened with this command registry (open_engine)"
            )
        storage, clock, db_file = target
        mine = storage.runs.get(fire.run_id, fire.tenant)
        if mine is None or mine.slot_key != fire.slot_key:
            raise PermanentFailure(
                f"the {ANCHOR_COMMAND} command is attached to another database than this fire's"
            )
        if file:
            chosen = Path(file)
        elif db_file is not None:
            chosen = db_file.with_name(db_file.name + ".anchors.jsonl")
        else:
            chosen = None  # a PostgreSQL database has no default anchors file
        sealed = seal_if_due(storage, clock, seal_every) if seal_every > 0 else None
        if chosen is None:
            # The epoch is still sealed on time; the heads go nowhere until the payload names
            # a file (doctor's audit.anchor_age says so), rather than a dead letter an hour.
            return {"file": None, "chains": 0, "sealed_epoch": sealed}
        try:
            written = anchor_heads(storage, clock, chosen)
        except InvalidInput as exc:
            raise PermanentFailure(str(exc)) from None
        done: dict[str, Any] = {"file": str(chosen), "chains": written}
        if sealed is not None:
            done["sealed_epoch"] = sealed
        return done


def seal_if_due(storage: Storage, clock: Clock, every_ms: int) -> int | None:
    """Seal the audit key's current epoch once it is `every_ms` old; the epoch sealed."""
    from engine.domain.audit_keys import KeyKind  # noqa: PLC0415

    audit = _sql_log(storage)
    found = audit.identity()
    if found is None or not found[1]:
        return None
    current = max(found[1], key=lambda p: p.epoch)
    if clock.now_ms() - current.started_at < every_ms:
        return None
    ring = audit.keys()
    if ring.epoch != current.epoch:  # caught up at the transition's own check
        ring = audit.establish()
    period = audit.transition(KeyKind.EVOLVED, ring.current.evolved(), "vortos")
    log.info(
        "audit epoch %d sealed: the key evolved to %s (epoch %d); the sealed key is erased",
        current.epoch,
        period.key_id,
        period.epoch,
    )
    return current.epoch


def _check(payload: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(payload) - {"file", "seal_every"})
    if unknown:
        raise InvalidInput(f"unknown audit anchor setting(s): {', '.join(unknown)}")
    if not isinstance(payload.get("file", ""), str):
        raise InvalidInput("the anchors `file` must be a path")
    every = payload.get("seal_every", 0)
    if type(every) is not int or every < 0:
        raise InvalidInput("the anchors `seal_every` must be milliseconds (0: never seal)")
    return payload


def anchor_command() -> Command:
    """A new, unattached `vortos.audit_anchor` command."""
    return command_from(
        ANCHOR_COMMAND,
        AnchorCommand().run,
        "appends every audit chain's signed head to the anchors file",
        check=_check,
    )


def attach_anchor(commands: CommandRegistry, storage: Storage, clock: Clock) -> None:
    """Point the registry's anchor command at `storage` (a writable one)."""
    if storage.readonly or ANCHOR_COMMAND not in commands:
        return
    owner = getattr(commands.get(ANCHOR_COMMAND).run, "__self__", None)
    if isinstance(owner, AnchorCommand):
        path = getattr(storage, "path", None)
        owner.attach(storage, clock, path if isinstance(path, Path) else None)


def anchor_schedule(
    every_ms: int = ANCHOR_EVERY_MS, file: str | None = None, seal_every_ms: int = 0
) -> StaticSchedule:
    """The built-in static schedule of the anchors: `vortos.audit_anchor` in tenant `system`
    every `every_ms` (audit_anchor_every, default 1 h), appending to `file` (default beside
    the database), sealing the key's epoch every `seal_every_ms` (audit_epoch; 0: never).
    Sync it at start with the sweeper's."""
    if every_ms < MIN_ANCHOR_EVERY_MS:
        raise InvalidInput(
            f"audit_anchor_every {format_duration(every_ms)} is too short: at least 1m"
        )
    spec = ScheduleSpec(
        name=ANCHOR_SCHEDULE,
        trigger=IntervalTrigger(every_ms, 0),
        command=ANCHOR_COMMAND,
        payload={
            **({} if file is None else {"file": file}),
            **({"seal_every": seal_every_ms} if seal_every_ms else {}),
        },
        timezone="UTC",
        tenant=ANCHOR_TENANT,
        misfire=MisfirePolicy(kind=MisfireKind.LATEST),
        overlap=OverlapPolicy.SKIP,
        metadata={SOURCE_KEY: ANCHOR_SOURCE},
    )
    return StaticSchedule(spec, ANCHOR_SOURCE)
