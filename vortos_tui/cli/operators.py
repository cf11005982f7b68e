"""`vortos operators ...`: who may do what (admin only; every change audited)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from engine.domain.access import ANY_TENANT, parse_role
from vortos_tui.cli.context import open_existing, operator
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say, stdout

app = typer.Typer(
    help="Operators and their roles: list, grant, revoke (admins only).", no_args_is_help=True
)

Tenant = Annotated[
    str,
    typer.Option("--tenant", help="Only in this tenant [default: every tenant]."),
]
Operator = Annotated[str, typer.Argument(help="The operator's account name.")]
RoleName = Annotated[str, typer.Argument(help="viewer, operator, approver or admin.")]


@app.command("list", epilog=EXIT_CODES)
@handles_errors
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Every grant: operator, role, tenant ('*' is every tenant)."""
    with open_existing(ctx) as engine:
        grants = engine.service.operators(actor=operator())
    if as_json:
        emit_json(
            [{"operator": g.operator, "role": g.role.value, "tenant": g.tenant} for g in grants]
        )
        return
    table = Table(box=None, pad_edge=False)
    for column in ("OPERATOR", "ROLE", "TENANT"):
        table.add_column(column)
    for g in grants:
        table.add_row(
            g.operator, g.role.value, "every tenant" if g.tenant == ANY_TENANT else g.tenant
        )
    stdout.print(table)


@app.command("grant", epilog=EXIT_CODES)
@handles_errors
def grant(ctx: typer.Context, name: Operator, role: RoleName, tenant: Tenant = ANY_TENANT) -> None:
    """Give an operator a role, in one tenant or in every tenant. Roles include the ones below
    them: viewer < operator < approver < admin."""
    chosen = parse_role(role)
    with open_existing(ctx) as engine:
        added = engine.service.grant_role(name, chosen, actor=operator(), tenant=tenant)
    scope = "every tenant" if tenant == ANY_TENANT else f"tenant {tenant}"
    say(f"{name} {'now holds' if added else 'already held'} {chosen.value} in {scope}")


@app.command("revoke", epilog=EXIT_CODES)
@handles_errors
def revoke(ctx: typer.Context, name: Operator, role: RoleName, tenant: Tenant = ANY_TENANT) -> None:
    """Take a role back (the last admin's cannot be)."""
    chosen = parse_role(role)
    with open_existing(ctx) as engine:
        engine.service.revoke_role(name, chosen, actor=operator(), tenant=tenant)
    scope = "every tenant" if tenant == ANY_TENANT else f"tenant {tenant}"
    say(f"{name} no longer holds {chosen.value} in {scope}")
