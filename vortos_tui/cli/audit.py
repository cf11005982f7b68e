"""`vortos audit ...`: verify, export and read the audit chains; rotate the key."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from engine.backends.sql.audit import SqlAuditLog
from engine.control import RemoteService
from engine.domain.audit import ChainPoint, ChainProblem, KeyRing, parse_point, summary
from engine.domain.audit_keys import KeyKind
from engine.domain.errors import AuditKeyMissing, InvalidInput, VortosError
from engine.domain.timeutil import iso_utc
from engine.governance.archive import ArchiveVerification, read_public_key, verify_with_archive
from engine.governance.audit import (
    ChainReport,
    PublicRoot,
    Verification,
    read_export,
    verify,
    verify_export,
    what_was_checked,
)
from engine.governance.keys import begin_rotation, key_source, load_keyring
from vortos_tui.cli.context import open_existing, open_for_read, operator, state
from vortos_tui.cli.files import private_output
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, one_line, say, stdout

app = typer.Typer(
    help="The audit chains: verify (with the secret key or only the public one), export, "
    "tail, archive, anchor; seal an epoch and rotate the key.",
    no_args_is_help=True,
)

Chain = Annotated[
    list[str] | None,
    typer.Option("--chain", help="Only this chain (repeat): tenant:NAME or system."),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only (messages go to stderr).")]
PublicKeyFile = Annotated[
    Path | None,
    typer.Option(
        "--public-key",
        help="Verify with only this public key file (`vortos audit public-key` writes it): "
        "no secret is read, so whoever runs this can check but never sign.",
    ),
]
# `verify`'s own options.
Full = Annotated[
    bool,
    typer.Option(
        "--full",
        help="Walk every entry from the start, with every checkpoint and the signed "
        "verification mark, instead of trusting the entries up to that mark.",
    ),
]
ExpectHead = Annotated[
    list[str] | None,
    typer.Option(
        "--expect-head",
        help="CHAIN=SEQ:HASH printed by an earlier verify: that entry must still be there, "
        "unchanged (catches a truncated tail). Repeat per chain. Works with --file too.",
    ),
]
ExportFile = Annotated[
    Path | None,
    typer.Option("--file", help="Verify an export (JSON lines) offline, each chain in full."),
]
ArchiveDirectory = Annotated[
    Path | None,
    typer.Option(
        "--with-archive",
        help="Also walk this archive directory (`vortos audit archive` wrote it): each "
        "chain from its first archived entry through the database's head, as one chain.",
    ),
]
AnchorsFile = Annotated[
    Path | None,
    typer.Option(
        "--anchors",
        help="An external anchors file (`vortos audit anchor`): every signed head in it "
        "must still be in the chain, unchanged (catches a truncated or rewritten tail).",
    ),
]


def _public_root(path: Path | None) -> PublicRoot | None:
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"--public-key {path} cannot be read: {exc.strerror}") from None
    try:
        return PublicRoot.from_json(json.loads(text))
    except (ValueError, AttributeError) as exc:
        raise InvalidInput(f"--public-key {path}: {exc}") from None


FULL_HINT = "run `vortos audit verify --full` to check them too"


class ChainBroken(VortosError):
    exit_code = 1


def _state(report: ChainReport) -> Text:
    return _problem_state(report.problem)


def _problem_state(problem: ChainProblem | None) -> Text:
    if problem is None:
        return Text("intact", style="green")
    if problem.unverifiable:
        return Text("UNVERIFIED", style="bold yellow")
    return Text("BROKEN", style="bold red")


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
                _state(report),
                str(report.head.seq),
                str(report.checked),
                str(report.trusted_through) if report.trusted_through else "-",
                "-" if report.problem is None else str(report.problem.seq),
                "-" if report.problem is None else one_line(report.problem.reason),
            )
        stdout.print(table)
    broken = [r for r in result.chains if not r.intact]
    if broken:
        # Tampering first: it is what an operator must see, whatever else could not be checked.
        broken.sort(key=lambda r: r.problem is not None and r.problem.unverifiable)
        first = broken[0]
        assert first.problem is not None
        what = "cannot be verified from" if first.problem.unverifiable else "is broken at"
        raise ChainBroken(
            f"audit chain {first.chain} {what} entry {first.problem.seq}: "
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
    full: Full = False,
    chains: Chain = None,
    expect_head: ExpectHead = None,
    from_file: ExportFile = None,
    public_key: PublicKeyFile = None,
    with_archive: ArchiveDirectory = None,
    anchors: AnchorsFile = None,
    as_json: Json = False,
) -> None:
    """Prove the audit chains intact, or name the first broken entry (exit 1).

    With the secret key: resumes from the last verification's signed mark unless --full, and
    says so. With --public-key (an auditor's): walks everything it is given in full and
    vouches only for what Ed25519 signatures cover (chain openings, epoch seals, rotations,
    checkpoints, an export's signed heads); entries signed only with the secret key after the
    last such signature are reported, not passed."""
    expect = _expectations(expect_head)
    cli = state(ctx)
    root = _public_root(public_key)
    if with_archive is not None or anchors is not None:
        _verify_with_archive(ctx, with_archive, anchors, public_key, chains, as_json)
    elif from_file is not None:
        _verify_export(ctx, from_file, expect, root, as_json)
    elif root is not None:
        _verify_with_public_key(ctx, chains, expect, root, as_json)
    elif cli.control_socket is not None:
        # The key is the service account's: the server verifies, and records how far.
        with open_existing(ctx) as engine:
            assert isinstance(engine.service, RemoteService)
            found = engine.service.audit_verification(chains=chains, full=full, expect=expect)
        _report(found, as_json)
    else:
        _verify_with_secret_key(ctx, chains, full, expect, as_json)


def _verify_export(
    ctx: typer.Context,
    from_file: Path,
    expect: dict[str, ChainPoint],
    root: PublicRoot | None,
    as_json: bool,
) -> None:
    """`verify --file`: an export, offline, each chain in full."""
    cli = state(ctx)
    if from_file.is_dir():
        raise InvalidInput(
            f"--file {from_file} is a directory: give the file `vortos audit export -o` wrote"
        )
    if not from_file.is_file():
        raise InvalidInput(f"--file {from_file} does not exist")
    keys = (
        None
        if root is not None
        else load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
    )
    try:
        with from_file.open(encoding="utf-8") as handle:
            result = verify_export(read_export(handle), keys, expect=expect, root=root)
    except ValueError as exc:
        raise InvalidInput(f"{from_file}: {exc}") from None
    except OSError as exc:
        raise InvalidInput(f"--file {from_file} cannot be read: {exc.strerror}") from None
    if not result.chains:
        # An empty report would read as "every chain intact": it proves nothing.
        raise InvalidInput(f"{from_file} holds no audit entries: nothing was verified")
    _report(result, as_json)


def _verify_with_public_key(
    ctx: typer.Context,
    chains: list[str] | None,
    expect: dict[str, ChainPoint],
    root: PublicRoot,
    as_json: bool,
) -> None:
    """`verify --public-key` on the database: no secret read, every chain walked in full."""
    with open_for_read(ctx) as reader:
        readable, unreadable = reader.service.audit_chains_to_verify(
            actor=operator(), wanted=chains, expected=list(expect)
        )
        every = None if chains is None and unreadable == 0 else readable
        result = verify(reader.storage.audit, None, chains=every, expect=expect, root=root)
    result.unreadable = unreadable
    _report(result, as_json)


def _verify_with_secret_key(
    ctx: typer.Context,
    chains: list[str] | None,
    full: bool,
    expect: dict[str, ChainPoint],
    as_json: bool,
) -> None:
    """`verify` with the audit key: from the signed mark (unless `full`), recording how far."""
    cli = state(ctx)
    with open_for_read(ctx) as reader:
        # Who may read what comes first, on a read-only open: one who may read no chain
        # learns nothing, not even that the key or the file's writing is out of its reach.
        readable, unreadable = reader.service.audit_chains_to_verify(
            actor=operator(), wanted=chains, expected=list(expect)
        )
    with open_existing(ctx) as engine:
        keys = load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
        # Every chain for whoever may read every one: a chain deleted whole is then named.
        every = None if chains is None and unreadable == 0 else readable
        result = verify(engine.storage.audit, keys, chains=every, full=full, expect=expect)
        result.unreadable = unreadable
        _report(result, as_json)


def _verify_with_archive(
    ctx: typer.Context,
    directory: Path | None,
    anchors: Path | None,
    public_key: Path | None,
    chains: list[str] | None,
    as_json: bool,
) -> None:
    """`verify --with-archive/--anchors`: archive files, then the database from its anchor."""
    cli = state(ctx)
    if cli.control_socket is not None:
        raise InvalidInput(
            "--with-archive and --anchors read files on this host: run them as an account "
            "that can read the database (or, an auditor, with --public-key), not through "
            "--control-socket"
        )
    for given, what in ((directory, "--with-archive"), (anchors, "--anchors")):
        if given is not None and not given.exists():
            raise InvalidInput(f"{what} {given} does not exist")
    if directory is not None and not directory.is_dir():
        raise InvalidInput(f"--with-archive {directory} is not a directory")
    root = None
    if public_key is not None:
        try:
            root = read_public_key(public_key)
        except ValueError as exc:
            raise InvalidInput(f"--public-key {public_key}: {exc}") from None
    if root is not None and cli.db.path is not None and not cli.db.path.exists():
        # An auditor with the archive, the anchors and the public key, and no database.
        result = verify_with_archive(
            directory, log=None, keys=None, public_key=root, anchors_file=anchors, chains=chains
        )
        _archive_report(result, as_json, root is not None)
        return
    keys = (
        None
        if root is not None
        else load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
    )
    with open_for_read(ctx) as reader:
        readable, unreadable = reader.service.audit_chains_to_verify(
            actor=operator(), wanted=chains
        )
        audit = reader.storage.audit
        assert isinstance(audit, SqlAuditLog)
        # Whoever may read every chain verifies every chain the archive, the anchors or the
        # database know of: one deleted from the database is then named, not skipped.
        only = None if chains is None and unreadable == 0 else readable
        result = verify_with_archive(
            directory, log=audit, keys=keys, public_key=root, anchors_file=anchors, chains=only
        )
    _archive_report(result, as_json, root is not None)


def _archive_report(result: ArchiveVerification, as_json: bool, public_only: bool) -> None:
    if as_json:
        emit_json(result.to_json())
    else:
        table = Table(box=None, pad_edge=False)
        for column in ("CHAIN", "STATE", "FILES", "ARCHIVED", "IN DATABASE", "END", "PROBLEM"):
            table.add_column(column, overflow="fold")
        for report in result.chains:
            table.add_row(
                report.chain,
                _problem_state(report.problem),
                str(report.files),
                str(report.archived),
                str(report.in_database),
                str(report.end.seq),
                "-" if report.problem is None else one_line(report.problem.reason),
            )
        stdout.print(table)
        for problem in result.problems:
            say(f"problem: {problem}")
    if not result.intact:
        bad = next((c for c in result.chains if c.problem is not None), None)
        if bad is not None and bad.problem is not None:
            what = "cannot be verified from" if bad.problem.unverifiable else "is broken at"
            raise ChainBroken(
                f"audit chain {bad.chain} {what} entry {bad.problem.seq}: {bad.problem.reason}"
            )
        raise ChainBroken(f"the archive does not verify: {result.problems[0]}")
    if not result.chains:
        raise InvalidInput("nothing was verified: no chain in the archive or the database")
    said = sum(c.archived for c in result.chains), sum(c.in_database for c in result.chains)
    say(
        f"{said[0]} archived and {said[1]} database entr(ies) checked in "
        f"{len(result.chains)} chain(s): no tampering found in them"
        + (" (with the public key only)" if public_only else "")
    )


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
    """Every entry as JSON lines, chain by chain, for archiving or `verify --file`.

    First the database's key lineage (public halves); each chain closed by its head, and the
    whole by a roster of every chain and head, signed with Ed25519 when this account holds the
    key, so that `verify --file --public-key` can vouch for every entry and tell a cut."""
    keys = _signing_keys(ctx)
    with open_for_read(ctx) as engine:
        readable = engine.service.audit_chains(actor=operator(), wanted=chains)
        if output is None:
            count = engine.service.audit_export(
                sys.stdout, actor=operator(), chains=readable, keys=keys
            )
        else:
            with private_output(output, force=force) as handle:
                count = engine.service.audit_export(
                    handle, actor=operator(), chains=readable, keys=keys
                )
        say(f"exported {count} audit entr{'y' if count == 1 else 'ies'}")
        if keys is None:
            say(
                "the heads are not signed (this account holds no audit key): a verification "
                "with --public-key vouches only for entries up to each chain's last seal or "
                "checkpoint"
            )


def _signing_keys(ctx: typer.Context) -> KeyRing | None:
    """The audit key when this account can read it (to sign an export's heads), else None."""
    cli = state(ctx)
    if cli.control_socket is not None:
        return None
    try:
        return load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
    except (AuditKeyMissing, InvalidInput):
        return None


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
        data = (
            entry.slot_key
            or summary(entry.event, entry.data)
            or ", ".join(f"{k}={v}" for k, v in sorted(entry.data.items()))
        )
        # One row per entry: a newline in a stored note must not start a forged one.
        cells = (iso_utc(entry.at), entry.chain, str(entry.seq), entry.event, entry.actor, data)
        table.add_row(*map(one_line, cells))
    stdout.print(table)


def _key_file(ctx: typer.Context, what: str) -> tuple[str, Path | None]:
    cli = state(ctx)
    if cli.control_socket is not None:
        raise InvalidInput(
            f"the audit key belongs to the account that runs `vortos run --control-socket`: "
            f"{what} as that account, without --control-socket"
        )
    return key_source(cli.db, cli.settings.audit_key_file)


@app.command("rotate-key", epilog=EXIT_CODES)
@handles_errors
def rotate_key(ctx: typer.Context) -> None:
    """Replace the signing key with a new random one, recorded in the chain.

    Every chain gets a `audit.key_rotated` entry signed and sealed by the old key, naming the
    new one; the database's key lineage records it, endorsed by the old key; the key file
    then holds only the new key (the old one is gone from it). From then on an entry signed
    with the old key fails verification. A running `vortos run` on this host picks the new
    key up at its next write; other hosts need the new key file copied to them (until then
    they refuse to sign and say so)."""
    where, path = _key_file(ctx, "rotate it")
    if path is None:
        raise InvalidInput(
            f"the key comes from {where}: rotating needs a key file (set audit_key_file), so "
            "that the new key is written where every restart finds it"
        )
    cli = state(ctx)
    with open_existing(ctx) as engine:
        ring = load_keyring(cli.db, key_file=cli.settings.audit_key_file, create=False)
        new = begin_rotation(path, ring)
        period = engine.storage.audit.transition(KeyKind.ROTATED, new, operator())
    say(
        f"audit key rotated: {ring.active_id} (epoch {ring.epoch}) retired, {period.key_id} "
        f"(epoch {period.epoch}) signs from now on; {where} holds only the new key: keep a "
        "backup of it and copy it to every node"
    )


@app.command("seal", epilog=EXIT_CODES)
@handles_errors
def seal_(ctx: typer.Context) -> None:
    """Seal the current epoch of the audit key (forward security).

    The key evolves one way to the next epoch's, the old one is erased from the key file, and
    a key stolen from now on cannot sign anything of the sealed epoch. `vortos run` seals by
    itself every `audit_epoch` (a setting)."""
    where, _path = _key_file(ctx, "seal")
    with open_existing(ctx) as engine:
        audit = engine.storage.audit
        ring = audit.keys()
        period = audit.transition(KeyKind.EVOLVED, ring.current.evolved(), operator())
    say(
        f"epoch {period.epoch - 1} sealed: the key evolved to {period.key_id} (epoch "
        f"{period.epoch}); the sealed epoch's key is gone from {where}"
    )


@app.command("public-key", epilog=EXIT_CODES)
@handles_errors
def public_key_(
    ctx: typer.Context,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of stdout (a new file)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """The public key file an auditor verifies with (no secret in it).

    The database's id and its root public key, as JSON, for `verify --public-key FILE`: it
    verifies exports, archives and anchors, and cannot sign anything."""
    with open_for_read(ctx) as engine:
        identity = engine.storage.audit.identity()
    if identity is None or not identity[1]:
        raise InvalidInput(
            "this database records no audit key yet (nothing was written to it): run "
            "`vortos db init` (or any change) first"
        )
    database_id, periods = identity
    root = min(periods, key=lambda p: p.epoch)
    text = json.dumps(PublicRoot(database_id, root.key_id, root.public_key).to_json(), indent=2)
    if output is None:
        sys.stdout.write(text + "\n")
        return
    with private_output(output, force=force) as handle:
        handle.write(text + "\n")
    say(f"public key of database {database_id} written to {output}: give it to your auditors")


# `archive` and `anchor` (vortos_tui.cli.audit_archive): the chain's retention and anchors.
from vortos_tui.cli.audit_archive import register  # noqa: E402

register(app)
