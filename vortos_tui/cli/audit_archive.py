"""`vortos audit archive` and `vortos audit anchor`: the chain's retention and its external
anchors (engine.governance.archive, engine.governance.anchors)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from engine.api import Engine
from engine.backends.sql.audit import SqlAuditLog
from engine.domain.access import Operation
from engine.domain.database import Database
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import DAY_MS, iso_utc, parse_duration, parse_instant
from engine.governance.anchors import anchor_file_for
from engine.governance.archive import archive
from engine.retention.audit_upkeep import anchor_heads, held_tenants
from vortos_tui.cli.context import open_existing, operator, state
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say

ARCHIVE_HELP = (
    "Seal the audit entries older than --before into files, verify them, then prune them "
    "from the database, leaving a signed anchor where the database's chain now starts.\n\n"
    "For each chain: DIR/<database id>-<chain>-<first>-<last>.jsonl (the entries, one JSON "
    "object a line) and .manifest.json beside it (the range, first previous hash and last "
    "hash, count, SHA-256 of the entries file, the key lineage and an Ed25519 signature). "
    "Nothing is pruned before the files are fsync'd and verified; a crash at any point "
    "leaves the database verifiable, and running it again finishes the job. A tenant under "
    "a legal hold keeps its chain whole. --before defaults to the sweeper's "
    "audit_archive_days (else its retention days); DIR to the sweeper's audit_archive_dir, "
    "else <db>.archive beside the database. An auditor verifies archive and database with "
    "the root public key only (`vortos audit public-key`); keep DIR on storage the "
    "database's administrators cannot rewrite."
)

ANCHOR_HELP = (
    "Append every chain's signed head to the anchors file (default <db>.anchors.jsonl "
    "beside the database, mode 0600, append-only): one JSON line {database_id, chain, seq, "
    "hash, key_id, at, signature} per chain, signed with Ed25519. A later verification "
    "given the file catches a truncated or rewritten tail. The built-in schedule "
    "vortos.audit-anchor (tenant system) does this every hour; copy the file somewhere the "
    "database's administrators cannot write (as CloudTrail digest files are)."
)


def _refuse_socket(ctx: typer.Context, verb: str) -> None:
    if state(ctx).control_socket is not None:
        raise InvalidInput(
            f"`vortos audit {verb}` signs with the audit key, which belongs to the account "
            "that runs `vortos run --control-socket`: run it as that account, without "
            "--control-socket"
        )


def _before(text: str, now_ms: int) -> int:
    """An instant (ISO 8601) or an age (30d: older than 30 days)."""
    try:
        return now_ms - parse_duration(text, what="--before")
    except InvalidInput:
        pass
    try:
        instant = parse_instant(text)
    except InvalidInput:
        raise InvalidInput(
            f"--before {text!r} is neither an instant (2026-01-31T00:00:00Z) nor an age "
            "(30d: entries older than 30 days)"
        ) from None
    if instant > now_ms:
        raise InvalidInput(f"--before {text!r} is in the future: archive only the past")
    return instant


def _sql_log(engine: Engine) -> SqlAuditLog[Any]:
    audit = engine.storage.audit
    if not isinstance(audit, SqlAuditLog):
        raise InvalidInput("this database's audit log cannot be archived")
    return audit


def _default_dir(db: Database) -> Path:
    if db.path is None:
        raise InvalidInput(
            "a PostgreSQL database has no default archive directory: give -o DIR (or set the "
            "sweeper's audit_archive_dir)"
        )
    return db.path.with_name(db.path.name + ".archive")


def archive_(
    ctx: typer.Context,
    before: Annotated[
        str | None,
        typer.Option(
            "--before",
            help="Archive entries made before this instant (ISO 8601) or older than this age "
            "(30d). Default: the sweeper's audit_archive_days, else its retention days.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="The archive directory (one per database; made 0700). Default: the "
            "sweeper's audit_archive_dir, else <db>.archive beside the database.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    _refuse_socket(ctx, "archive")
    cli = state(ctx)
    with open_existing(ctx) as engine:
        # Archiving prunes history: the right to manage retention in every tenant.
        engine.service._authorize(operator(), Operation.MANAGE_RETENTION, None)
        settings = engine.service.retention_settings()[0]
        now = engine.clock.now_ms()
        if before is not None:
            cutoff = _before(before, now)
        elif settings.archive_days == 0:
            raise InvalidInput(
                "the retention keeps history forever (days 0): give --before to archive"
            )
        else:
            cutoff = now - settings.archive_days * DAY_MS
        directory = output or (
            Path(settings.audit_archive_dir) if settings.audit_archive_dir else None
        )
        directory = directory or _default_dir(cli.db)
        report = archive(
            _sql_log(engine),
            directory,
            before_ms=cutoff,
            now_ms=now,
            held_tenants=held_tenants(engine.storage),
        )
    if as_json:
        emit_json(report.to_json())
        return
    for done in report.files:
        say(
            f"{done.chain}: entries {done.first_seq}..{done.last_seq} ({done.count}) archived "
            f"to {directory / done.entries_file} and pruned; the chain is anchored at "
            f"{done.last_seq}"
        )
    for chain in report.held:
        say(f"{chain}: kept whole in the database (its tenant is under a legal hold)")
    if not report.files:
        say(f"nothing to archive before {iso_utc(cutoff)}")


def anchor_(
    ctx: typer.Context,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Append to this file (default <db>.anchors.jsonl beside it)."
        ),
    ] = None,
) -> None:
    _refuse_socket(ctx, "anchor")
    cli = state(ctx)
    path = anchor_file_for(cli.db, output)
    if path.is_dir():
        raise InvalidInput(f"-o {path} is a directory: give the anchors file")
    with open_existing(ctx) as engine:
        engine.service._authorize(operator(), Operation.VIEW, None)
        written = anchor_heads(engine.storage, engine.clock, path)
    say(f"anchored the heads of {written} chain(s) in {path}")


def register(app: typer.Typer) -> None:
    """Add `archive` and `anchor` to `vortos audit`."""
    app.command("archive", epilog=EXIT_CODES, help=ARCHIVE_HELP)(handles_errors(archive_))
    app.command("anchor", epilog=EXIT_CODES, help=ANCHOR_HELP)(handles_errors(anchor_))
