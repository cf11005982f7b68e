"""`vortos retention ...` (per-tenant overrides and legal holds) and `vortos prune`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from engine.domain.errors import InvalidInput
from engine.domain.timeutil import iso_utc
from engine.ports.retention import RetentionOverride
from engine.retention import PruneReport
from vortos_tui.cli.context import open_existing, open_for_read, operator
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, one_line, say, stdout

app = typer.Typer(
    help="Run-history retention: per-tenant overrides and legal holds (admins change them).",
    no_args_is_help=True,
)

Tenant = Annotated[str | None, typer.Option("--tenant", help="The tenant (required).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only (messages go to stderr).")]


def _needs_tenant(tenant: str | None, verb: str) -> str:
    if tenant is None:
        raise InvalidInput(
            f"`vortos retention {verb}` needs --tenant T: overrides are per tenant; every "
            "other tenant gets the sweeper's default (`vortos retention show`)"
        )
    return tenant


def _kept(days: int, *, hold: bool = True) -> str:
    """How long history is kept: 0 days is forever (an override's 0 is a legal hold)."""
    if days == 0:
        return "forever (legal hold)" if hold else "forever"
    return f"{days} days"


@app.command("set", epilog=EXIT_CODES)
@handles_errors
def set_(
    ctx: typer.Context,
    tenant: Tenant = None,
    days: Annotated[
        int | None,
        typer.Option("--days", help="Keep the tenant's run history this long; 0: a legal hold."),
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (kept with the override, audited).")
    ] = None,
) -> None:
    """Keep one tenant's run history N days instead of the default; --days 0 is a legal
    hold: nothing of the tenant is pruned until the override is removed."""
    chosen = _needs_tenant(tenant, "set")
    if days is None:
        raise InvalidInput(
            "`vortos retention set` needs --days N: 0 for a legal hold, else the days to keep"
        )
    with open_existing(ctx) as engine:
        override = engine.service.set_retention(chosen, days, actor=operator(), reason=reason)
    say(f"tenant {chosen}: run history kept {_kept(override.days)}")


@app.command("remove", epilog=EXIT_CODES)
@handles_errors
def remove(ctx: typer.Context, tenant: Tenant = None) -> None:
    """Drop a tenant's override (a legal hold included): the default applies again."""
    chosen = _needs_tenant(tenant, "remove")
    with open_existing(ctx) as engine:
        before = engine.service.remove_retention(chosen, actor=operator())
    say(f"tenant {chosen}: override ({_kept(before.days)}) removed; the default applies")


def _override_json(o: RetentionOverride) -> dict[str, Any]:
    return {
        "tenant": o.tenant,
        "days": o.days,
        "legal_hold": o.legal_hold,
        "reason": o.reason,
        "set_by": o.set_by,
        "set_at": iso_utc(o.set_at),
    }


@app.command("show", epilog=EXIT_CODES)
@handles_errors
def show(ctx: typer.Context, as_json: Json = False) -> None:
    """The default retention (the sweeper's settings) and every tenant's override."""
    with open_for_read(ctx) as engine:
        view = engine.service.retention(actor=operator())
    settings = view.settings
    if as_json:
        emit_json(
            {
                **settings.to_payload(),
                "source": view.source,
                "overrides": [_override_json(o) for o in view.overrides],
            }
        )
        return
    say(
        f"default: run history kept {_kept(settings.days, hold=False)}, dead letters "
        f"{_kept(settings.dead_letter_days, hold=False)} (from {view.source})"
    )
    if not view.overrides:
        say("no tenant overrides")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("TENANT", "KEPT", "REASON", "SET BY", "SET AT"):
        table.add_column(column)
    for o in view.overrides:
        cells = (o.tenant, _kept(o.days), o.reason or "", o.set_by, iso_utc(o.set_at))
        table.add_row(*map(one_line, cells))
    stdout.print(table)


def _report_table(report: PruneReport) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("TENANT", "RUNS", "FIRES", "DEAD LETTERS"):
        table.add_column(column, justify="left" if column == "TENANT" else "right")
    for tenant, counts in sorted(report.tenants.items()):
        table.add_row(tenant, str(counts.runs), str(counts.fires), str(counts.dead_letters))
    return table


@handles_errors
def prune(
    ctx: typer.Context,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would go; change nothing.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Run one retention sweep now, with the daily sweeper's settings: terminal runs past
    their tenant's retention go, with their fires (dead letters after a longer retention);
    open runs and legal holds are never touched. Audited; needs admin in every tenant."""
    opener = open_for_read if dry_run else open_existing
    with opener(ctx) as engine:
        report = engine.service.prune(actor=operator(), dry_run=dry_run)
    if as_json:
        emit_json(report.to_json())
        return
    verb = "would prune" if dry_run else "pruned"
    say(
        f"{verb} {report.runs} run(s), {report.fires} fire(s), {report.dead_letters} dead "
        f"letter(s) in {report.duration_s:.1f} s"
        + (" (dry run: nothing changed)" if dry_run else "")
    )
    if report.tenants:
        stdout.print(_report_table(report))
    if report.truncated:
        why = (
            f"its time budget ({report.settings.budget_s} s) ran out"
            if report.stopped_by == "budget"
            else "it was asked to stop"
        )
        say(f"truncated: {why}; the next sweep goes on from where this one stopped")
