"""`vortos audit ...`: verify, export and read the audit chains; rotate the key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from engine.control import RemoteService
from engine.domain.audit import ChainPoint, parse_point
from engine.domain.errors import InvalidInput, VortosError
from engine.domain.timeutil import iso_utc
from engine.governance.audit import (
    Verification,
    read_export,
    verify,
    verify_export,
    what_was_checked,
)
from engine.governance.keys import key_source, load_keyring, rotate_key_file
from vortos_tui.cli.context import open_existing, open_for_read, operator, state
from vortos_tui.cli.files import private_output
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, one_line, say, stdout

app = typer.Typer(
    help="The audit chains: verify, export, tail; rotate the key.", no_args_is_help=True
)

Chain = Annotated[
    list[str] | None,
    typer.Option("--chain", help="Only this chain (repeat): tenant:NAME or system."),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only (messages go to stderr).")]


FULL_HINT = "run `vortos audit verify --full` to check them too"


class ChainBroken(VortosError):
    exit_code = 1


def _expectations(items: list[str] | None) -> dict[str, ChainPoint]:
    found: dict[str, ChainPoint] = {}
    for item in items or []:
        chain, sep, point = item.partition("=")
        if not sep or not chain:
            raise InvalidInput(
                f"--expect-head {item!r}: write CHAIN=SEQ:HASH, as `vortos audit verify` prints"
            )
        try:
            found[chain] = parse_point(point)
        except ValueError as exc:
            raise InvalidInput(f"--expect-head: {exc}") from None
    return found


def _report(result: Verification, as_json: bool) -> None:
    if as_json:
        emit_json([report.to_json() for report in result.chains])
    else:
        table = Table(box=None, pad_edge=False)
        for column in ("CHAIN", "STATE", "HEAD", "CHECKED", "TRUSTED TO", "FIRST BAD", "PROBLEM"):
            table.add_column(column, overflow="fold")
        for report in result.chains:
            table.add_row(
                report.chain,
                Text("intact", style="green")
                if report.intact
                else Text("BROKEN", style="bold red"),
                str(report.head.seq),
                str(report.checked),
                str(report.trusted_through) if report.trusted_through else "-",
                "-" if report.problem is None else str(report.problem.seq),
                "-" if report.problem is None else one_line(report.problem.reason),
            )
        stdout.print(table)
    broken = [r for r in result.chains if not r.intact]
    if broken:
        first = broken[0]
        assert first.problem is not None
        raise ChainBroken(
            f"audit chain {first.chain} is broken at entry {first.problem.seq}: "
            f"{first.problem.reason}"
            + (f" (and {len(broken) - 1} more chain(s))" if len(broken) > 1 else "")
        )
    if not result.chains:
        # Only said to whoever may read every chain (others are refused before).
        say("no audit entries yet")
        return
    for line in what_was_checked(result, FULL_HINT):
        say(line)
    if not as_json:
        say("to catch a truncated tail later, keep these heads:")
        for report in result.chains:
            sys.stdout.write(f"--expect-head {report.chain}={report.head.spelled()}\n")


@app.command("verify", epilog=EXIT_CODES)
@handles_errors
def verify_(
    ctx: typer.Context,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Walk every entry from the start, with every checkpoint and the signed "
            "verification mark, instead of trusting the entries up to that mark.",
        ),
    ] = False,
    chains: Chain = None,
    expect_head: Annotated[
        list[str] | None,
        typer.Option(
            "--expect-head",
            help="CHAIN=SEQ:HASH printed by an earlier verify: that entry must still be there, "
            "unchanged (catches a truncated tail). Repeat per chain. Works with --file too.",
        ),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--file", help="Verify an export (JSON lines) offline, each chain in full."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Prove the audit chains intact, or name the first broken entry (exit 1). Resumes from the
    last verification's signed mark unless --full, and says so; needs the audit key."""
    expect = _expectations(expect_head)
    cli = state(ctx)
    if from_file is not None:
        if from_file.is_dir():
            raise InvalidInput(
                f"--file {from_file} is a directory: give the file `vortos audit export -o` wrote"
            )
        if not from_file.is_file():
            raise InvalidInput(f"--file {from_file} does not exist")
        keys = load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
        try:
            with from_file.open(encoding="utf-8") as handle:
                result = verify_export(read_export(handle), keys, expect=expect)
        except ValueError as exc:
            raise InvalidInput(f"{from_file}: {exc}") from None
        except OSError as exc:
            raise InvalidInput(f"--file {from_file} cannot be read: {exc.strerror}") from None
        if not result.chains:
            # An empty report would read as "every chain intact": it proves nothing.
            raise InvalidInput(f"{from_file} holds no audit entries: nothing was verified")
        _report(result, as_json)
        return
    if cli.control_socket is not None:
        # The key is the service account's: the server verifies, and records how far.
        with open_existing(ctx) as engine:
            assert isinstance(engine.service, RemoteService)
            found = engine.service.audit_verification(chains=chains, full=full, expect=expect)
        _report(found, as_json)
        return
    with open_for_read(ctx) as reader:
        # Who may read what comes first, on a read-only open: one who may read no chain
        # learns nothing, not even that the key or the file's writing is out of its reach.
        readable, unreadable = reader.service.audit_chains_to_verify(
            actor=operator(), wanted=chains, expected=list(expect)
        )
    with open_existing(ctx) as engine:
        keys = load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
        result = verify(engine.storage.audit, keys, chains=readable, full=full, expect=expect)
        result.unreadable = unreadable
        _report(result, as_json)


@app.command("export", epilog=EXIT_CODES)
@handles_errors
def export_(
    ctx: typer.Context,
    chains: Chain = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write here (a new file, mode 0600) instead of stdout."
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace an existing --output file (atomically)."),
    ] = False,
) -> None:
    """Every entry as JSON lines, chain by chain, for archiving or `verify --file`."""
    with open_for_read(ctx) as engine:
        readable = engine.service.audit_chains(actor=operator(), wanted=chains)
        if output is None:
            count = engine.service.audit_export(sys.stdout, actor=operator(), chains=readable)
        else:
            with private_output(output, force=force) as handle:
                count = engine.service.audit_export(handle, actor=operator(), chains=readable)
        say(f"exported {count} audit entr{'y' if count == 1 else 'ies'}")


@app.command("tail", epilog=EXIT_CODES)
@handles_errors
def tail(
    ctx: typer.Context,
    chain: Annotated[str | None, typer.Option("--chain", help="tenant:NAME or system.")] = None,
    count: Annotated[int, typer.Option("-n", "--count", min=1, max=10_000)] = 20,
    as_json: Json = False,
) -> None:
    """The newest entries, newest first."""
    with open_for_read(ctx) as engine:
        entries = engine.service.audit_latest(actor=operator(), chain=chain, limit=count)
    if as_json:
        emit_json([entry.to_json() for entry in entries])
        return
    if not entries:
        say("no audit entries")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("AT (UTC)", "CHAIN", "SEQ", "EVENT", "ACTOR", "SLOT KEY / DATA"):
        table.add_column(column)
    for entry in entries:
        data = entry.slot_key or ", ".join(f"{k}={v}" for k, v in sorted(entry.data.items()))
        # One row per entry: a newline in a stored note must not start a forged one.
        cells = (iso_utc(entry.at), entry.chain, str(entry.seq), entry.event, entry.actor, data)
        table.add_row(*map(one_line, cells))
    stdout.print(table)


@app.command("rotate-key", epilog=EXIT_CODES)
@handles_errors
def rotate_key(ctx: typer.Context) -> None:
    """Add a new signing key to the key file; older keys stay, so old entries still verify."""
    cli = state(ctx)
    if cli.control_socket is not None:
        raise InvalidInput(
            "the audit key belongs to the account that runs `vortos run --control-socket`: "
            "rotate it as that account, without --control-socket"
        )
    where, path = key_source(cli.db, cli.settings.audit_key_file)
    if path is None:
        raise InvalidInput(
            f"the key comes from {where}: rotate it there (append a new key after a comma)"
        )
    key_id = rotate_key_file(path)
    say(f"new audit signing key {key_id} added to {where}; keep a backup of the file")


# `archive` and `anchor` (vortos_tui.cli.audit_archive): the chain's retention and anchors.
from vortos_tui.cli.audit_archive import register  # noqa: E402

register(app)
