"""`vortos approvals ...`: four-eyes requests: list, show, approve, reject."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from engine.domain.approvals import Approval, ApprovalState
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import iso_utc
from vortos_tui.cli.context import open_existing, open_for_read, operator
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, one_line, say, stdout

app = typer.Typer(
    help="Four-eyes approvals of sensitive changes: list, show, approve, reject.",
    no_args_is_help=True,
)

Tenant = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only (messages go to stderr).")]
ApprovalId = Annotated[str, typer.Argument(help="The request's id (from `approvals list`).")]


def approval_json(a: Approval, now_ms: int) -> dict[str, Any]:
    return {
        "id": a.id,
        "tenant": a.tenant,
        "schedule": a.schedule,
        "operation": a.operation.value,
        "state": a.state_at(now_ms).value,
        "change": dict(a.change),
        "digest": a.digest,
        "requested_by": a.requested_by,
        "requested_at": iso_utc(a.requested_at),
        "expires_at": iso_utc(a.expires_at),
        "decided_by": a.decided_by,
        "decided_at": None if a.decided_at is None else iso_utc(a.decided_at),
        "reason": a.reason,
        "consumed_at": None if a.consumed_at is None else iso_utc(a.consumed_at),
    }


def _state(text: str | None) -> ApprovalState | None:
    if text is None:
        return None
    try:
        return ApprovalState(text)
    except ValueError:
        raise InvalidInput(
            f"unknown state {text!r}: use one of {', '.join(s.value for s in ApprovalState)}"
        ) from None


@app.command("list", epilog=EXIT_CODES)
@handles_errors
def list_(
    ctx: typer.Context,
    tenant: Tenant = None,
    state: Annotated[
        str | None, typer.Option("--state", help="pending, approved, rejected, expired, consumed.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    as_json: Json = False,
) -> None:
    """Requests, pending first."""
    chosen = _state(state)
    with open_for_read(ctx) as engine:  # a read: the group-readable file serves it
        found = engine.service.approvals(actor=operator(), tenant=tenant, state=chosen, limit=limit)
        now = engine.clock.now_ms()
    if as_json:
        emit_json([approval_json(a, now) for a in found])
        return
    if not found:
        say("no approval requests")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("ID", "STATE", "OPERATION", "SCHEDULE", "REQUESTED BY", "EXPIRES (UTC)"):
        table.add_column(column)
    for a in found:
        cells = (
            a.id,
            a.state_at(now).value,
            a.operation.value,
            f"{a.tenant}/{a.schedule}",
            a.requested_by,
            iso_utc(a.expires_at),
        )
        table.add_row(*map(one_line, cells))
    stdout.print(table)


@app.command("show", epilog=EXIT_CODES)
@handles_errors
def show(ctx: typer.Context, approval_id: ApprovalId, tenant: Tenant = None) -> None:
    """One request in full, with the change it would allow."""
    with open_for_read(ctx) as engine:
        found = engine.service.approval(approval_id, actor=operator(), tenant=tenant)
        emit_json(approval_json(found, engine.clock.now_ms()))


@app.command("approve", epilog=EXIT_CODES)
@handles_errors
def approve(ctx: typer.Context, approval_id: ApprovalId, tenant: Tenant = None) -> None:
    """Approve someone else's pending request (approver role in its tenant). The requester
    then runs the change again; it can run once."""
    with open_existing(ctx) as engine:
        done = engine.service.approve(approval_id, actor=operator(), tenant=tenant)
    say(
        f"approved {done.id}: {done.operation.value} of {done.tenant}/{done.schedule} may now "
        f"run once, when {done.requested_by} runs it again, until {iso_utc(done.expires_at)}"
    )


@app.command("reject", epilog=EXIT_CODES)
@handles_errors
def reject(
    ctx: typer.Context,
    approval_id: ApprovalId,
    reason: Annotated[str, typer.Option("--reason", help="Why (at least 10 characters).")],
    tenant: Tenant = None,
) -> None:
    """Reject someone else's pending request, saying why."""
    with open_existing(ctx) as engine:
        done = engine.service.reject(approval_id, actor=operator(), reason=reason, tenant=tenant)
    say(f"rejected {done.id}: {json.dumps(done.reason)}")
