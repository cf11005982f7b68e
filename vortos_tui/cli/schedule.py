"""`vortos schedule ...`: define and manage schedules."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any

import typer
import typer.main
from typer._click.exceptions import ClickException

from engine import (
    CronTrigger,
    MisfireKind,
    MissingHour,
    OverlapPolicy,
    RepeatedHour,
    ScheduleStatus,
)
from engine.domain.clock import SystemClock
from engine.domain.errors import InvalidInput
from engine.domain.patch import SchedulePatch, new_spec
from engine.domain.schedule import (
    DEFAULT_TENANT,
    TIMEOUT_MAX_MS,
    Schedule,
    parse_payload,
    validate_name,
)
from engine.domain.timeutil import parse_duration, parse_instant
from engine.service import validate_spec
from vortos_tui.cli.context import open_existing, open_for_read, open_for_write, operator, state
from vortos_tui.cli.output import EXIT_CODES, emit_json, handles_errors, say, stdout
from vortos_tui.cli.views import (
    backfill_json,
    preview_json,
    preview_table,
    run_json,
    schedule_json,
    schedule_table,
    schedules_table,
)

app = typer.Typer(help="Define and manage schedules.", no_args_is_help=True)

Tenant = Annotated[str, typer.Option("--tenant", help="Tenant the schedule belongs to.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only (messages go to stderr).")]
Name = Annotated[str, typer.Argument(help="The schedule's name.", show_default=False)]
DST_REPEATED_HELP = (
    "Cron only. A wall time the clock repeats (autumn): first, last or both passes; auto: both "
    "when the minute or hour field starts with * (elapsed time, as cron(8)), else the first."
)
DST_MISSING_HELP = (
    "Cron only. A wall time the clock skips (spring): shift it by the gap (02:30 -> 03:30), "
    "fire at the transition (03:00, as cron(8)) or skip it."
)

# The options `add` and `edit` share: None is "not given" (add: the default; edit: unchanged).
Cron = Annotated[
    str | None, typer.Option("--cron", help="Cron: 5 fields, or 6 with seconds first.")
]
Every = Annotated[
    str | None, typer.Option("--every", help="Fixed interval: 90, 30s, 5m, 1h (at least 1s).")
]
At = Annotated[str | None, typer.Option("--at", help="One-shot instant (ISO 8601).")]
Start = Annotated[
    str | None,
    typer.Option(
        "--start", help="First slot of an --every schedule (default: one interval from now)."
    ),
]
Tz = Annotated[
    str | None, typer.Option("--tz", help="IANA time zone of the trigger (default for add: UTC).")
]
Misfire = Annotated[
    MisfireKind | None,
    typer.Option(
        "--misfire",
        help="Missed slots: skip, latest (fire once) or each (default for add: latest).",
    ),
]
CatchUpCap = Annotated[
    int | None,
    typer.Option(
        "--catch-up-cap",
        help="With --misfire each: fire at most N missed slots (newest) (default for add: 100).",
    ),
]
MaxCatchUpAge = Annotated[
    str | None,
    typer.Option(
        "--max-catch-up-age", help="Slots older than this are never fired (default for add: 1d)."
    ),
]
MisfireGrace = Annotated[
    str | None,
    typer.Option(
        "--misfire-grace", help="A slot this late still counts as on time (default for add: 60s)."
    ),
]
DstRepeated = Annotated[
    RepeatedHour | None,
    typer.Option("--dst-repeated", help=DST_REPEATED_HELP + " (default for add: auto)"),
]
DstMissing = Annotated[
    MissingHour | None,
    typer.Option("--dst-missing", help=DST_MISSING_HELP + " (default for add: shift)"),
]
Overlap = Annotated[
    OverlapPolicy | None,
    typer.Option("--overlap", help="While the previous run is open (default for add: skip)."),
]
Jitter = Annotated[
    str | None,
    typer.Option(
        "--jitter",
        help="Spread each slot by a stable offset up to this (max 1h) (default for add: 0).",
    ),
]
MaxAttempts = Annotated[
    int | None,
    typer.Option(
        "--max-attempts",
        help="Attempts before a failing fire is dead-lettered (1 to 100) (default for add: 3).",
    ),
]
RetryBackoff = Annotated[
    str | None,
    typer.Option(
        "--retry-backoff",
        help="Wait before the first retry; it doubles with each one (default for add: 2s).",
    ),
]
RetryBackoffCap = Annotated[
    str | None,
    typer.Option(
        "--retry-backoff-cap", help="The longest wait between retries (default for add: 5m)."
    ),
]
Timeout = Annotated[
    str | None,
    typer.Option(
        "--timeout",
        help="How long one run may take (up to 7d) before it ends timed_out and is retried; "
        "overrides the command's own limit; 'none' removes it (default for add: the "
        "command's).",
    ),
]
Payload = Annotated[str | None, typer.Option("--payload", help="JSON object for the command.")]


def parse_meta(pairs: list[str]) -> dict[str, str | None]:
    """KEY=VALUE pairs; KEY= (no value) is None: an edit removes that key."""
    meta: dict[str, str | None] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--meta {pair!r} is not KEY=VALUE")
        meta[key] = value or None
    return meta


def _duration(text: str | None, what: str) -> int | None:
    return None if text is None else parse_duration(text, what=what)


def _timeout(text: str | None) -> int | None:
    """--timeout's text in ms: 0 for 'none' (an edit removes the schedule's own limit)."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return 0
    if text.strip().startswith("-"):
        raise InvalidInput(f"--timeout {text!r} is negative: give a duration such as 30s, or none")
    limit = parse_duration(text, what="timeout", longest_ms=TIMEOUT_MAX_MS)
    if limit <= 0:
        raise InvalidInput(f"--timeout {text!r} is zero: give at least 1ms, or none")
    return limit


def _interval(every: str | None) -> int | None:
    if every is None:
        return None
    if every.strip().startswith("-"):
        raise InvalidInput(f"interval {every!r} is negative: give a positive duration")
    period = parse_duration(every, what="interval")
    if period <= 0:
        raise InvalidInput(f"interval {every!r} is zero: give at least 1s")
    return period


@dataclass(frozen=True)
class DefinitionOptions:
    """What `add` and `edit` were given, as typed (text, not yet parsed)."""

    cron: str | None = None
    every: str | None = None
    at: str | None = None
    start: str | None = None
    payload: str | None = None
    tz: str | None = None
    misfire: MisfireKind | None = None
    catch_up_cap: int | None = None
    max_catch_up_age: str | None = None
    misfire_grace: str | None = None
    dst_repeated: RepeatedHour | None = None
    dst_missing: MissingHour | None = None
    overlap: OverlapPolicy | None = None
    jitter: str | None = None
    sensitive: bool | None = None
    meta: list[str] | None = None
    max_attempts: int | None = None
    retry_backoff: str | None = None
    retry_backoff_cap: str | None = None
    timeout: str | None = None
    command: str | None = None

    def patch(self, zone: str) -> SchedulePatch:
        """The options as a SchedulePatch: only parsing here (instants read in `zone`); every
        rule about what goes with what is the engine's (engine.domain.patch)."""
        return SchedulePatch(
            command=self.command,
            cron=self.cron,
            every_ms=_interval(self.every),
            start_ms=None if self.start is None else parse_instant(self.start, zone),
            at_ms=None if self.at is None else parse_instant(self.at, zone),
            dst_repeated=self.dst_repeated,
            dst_missing=self.dst_missing,
            payload=None if self.payload is None else parse_payload(self.payload),
            timezone=self.tz,
            misfire=self.misfire,
            catch_up_cap=self.catch_up_cap,
            max_age_ms=_duration(self.max_catch_up_age, "maximum catch-up age"),
            grace_ms=_duration(self.misfire_grace, "misfire grace"),
            overlap=self.overlap,
            jitter_ms=_duration(self.jitter, "jitter"),
            sensitive=self.sensitive,
            metadata=None if self.meta is None else parse_meta(self.meta),
            max_attempts=self.max_attempts,
            backoff_ms=_duration(self.retry_backoff, "retry backoff"),
            backoff_cap_ms=_duration(self.retry_backoff_cap, "retry backoff cap"),
            timeout_ms=_timeout(self.timeout),
        )


# What the console's edit refuses of `edit`'s options: it acts on the row the operator selected,
# at the version they saw, and shows no JSON.
NOT_IN_THE_CONSOLE = ("--tenant", "--expect-version", "--json", "--help")


def edit_patch(words: Sequence[str], zone: str) -> SchedulePatch:
    """`vortos schedule edit`'s options (without the name), parsed exactly as the command
    parses them, as a SchedulePatch: the console's edit takes what the CLI takes. Instants
    without an offset are read in `zone` (or a --tz given). InvalidInput says what is wrong."""
    for word in words:
        if word.split("=", 1)[0] in NOT_IN_THE_CONSOLE:
            raise InvalidInput(
                f"{word} is not taken here: the console edits the schedule you selected, at "
                "the version you saw"
            )
    edit_command = typing.cast("Any", typer.main.get_command(app)).get_command(None, "edit")
    try:
        parsed = edit_command.make_context("edit", ["-", *words]).params
    except ClickException as exc:
        raise InvalidInput(" ".join(exc.format_message().split())) from None
    given = {k: v for k, v in parsed.items() if k in DefinitionOptions.__dataclass_fields__}
    given["meta"] = list(given["meta"]) or None  # click gives () for a repeatable option unused
    if all(v is None for v in given.values()):
        raise InvalidInput("give at least one change, e.g. --misfire-grace 5m")
    return DefinitionOptions(**given).patch(given["tz"] or zone)


@app.command("add", epilog=EXIT_CODES)
@handles_errors
def add(
    ctx: typer.Context,
    name: Name,
    command: Annotated[
        str, typer.Option("--command", help="Registered command to run.", show_default=False)
    ],
    cron: Cron = None,
    every: Every = None,
    at: At = None,
    start: Start = None,
    payload: Payload = None,
    tz: Tz = None,
    misfire: Misfire = None,
    catch_up_cap: CatchUpCap = None,
    max_catch_up_age: MaxCatchUpAge = None,
    misfire_grace: MisfireGrace = None,
    dst_repeated: DstRepeated = None,
    dst_missing: DstMissing = None,
    overlap: Overlap = None,
    jitter: Jitter = None,
    tenant: Tenant = DEFAULT_TENANT,
    sensitive: Annotated[bool, typer.Option("--sensitive", help="Mark as sensitive.")] = False,
    meta: Annotated[
        list[str] | None, typer.Option("--meta", help="KEY=VALUE metadata; repeat for more.")
    ] = None,
    max_attempts: MaxAttempts = None,
    retry_backoff: RetryBackoff = None,
    retry_backoff_cap: RetryBackoffCap = None,
    timeout: Timeout = None,
    as_json: Json = False,
) -> None:
    """Add a schedule: exactly one of --cron, --every or --at.

    The command must be registered (built-in, or @schedulable in the --app modules), and the
    payload must fit its parameters."""
    options = dict(locals())
    for local in ("ctx", "name", "tenant", "as_json"):
        del options[local]
    validate_name(name)
    validate_name(tenant, what="tenant")
    now = SystemClock().now_ms()
    given = DefinitionOptions(**options).patch(tz or "UTC")
    spec = new_spec(name, command, replace(given, command=None), tenant=tenant, now_ms=now)
    # Everything that can be refused is refused before the database is created or opened.
    validate_spec(spec, state(ctx).commands(), now)
    with open_for_write(ctx) as engine:
        schedule = engine.service.create(spec, actor=operator())
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            say(
                f"added {schedule.tenant}/{schedule.name}: {spec.trigger.describe()} in "
                f"{spec.timezone}"
            )
            stdout.print(schedule_table(schedule, engine.clock.now_ms()))


@app.command("edit", epilog=EXIT_CODES)
@handles_errors
def edit(
    ctx: typer.Context,
    name: Name,
    command: Annotated[
        str | None, typer.Option("--command", help="A registered command to run instead.")
    ] = None,
    cron: Cron = None,
    every: Every = None,
    at: At = None,
    start: Start = None,
    payload: Payload = None,
    tz: Tz = None,
    misfire: Misfire = None,
    catch_up_cap: CatchUpCap = None,
    max_catch_up_age: MaxCatchUpAge = None,
    misfire_grace: MisfireGrace = None,
    dst_repeated: DstRepeated = None,
    dst_missing: DstMissing = None,
    overlap: Overlap = None,
    jitter: Jitter = None,
    tenant: Tenant = DEFAULT_TENANT,
    sensitive: Annotated[
        bool | None,
        typer.Option("--sensitive/--not-sensitive", help="Mark or unmark as sensitive."),
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option("--meta", help="KEY=VALUE to set (KEY= removes it); repeat for more."),
    ] = None,
    max_attempts: MaxAttempts = None,
    retry_backoff: RetryBackoff = None,
    retry_backoff_cap: RetryBackoffCap = None,
    timeout: Timeout = None,
    expect_version: Annotated[
        int | None,
        typer.Option(
            "--expect-version", help="Refuse if the schedule changed since you read this version."
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Change a schedule: only what you give changes (an option left out leaves its value as
    it is; "default for add" is what `add` takes). A new trigger, zone or jitter fires from
    the first slot after now. A sensitive schedule (or making one sensitive or not) needs a
    second operator's approval."""
    options = dict(locals())
    for local in ("ctx", "name", "tenant", "as_json", "expect_version"):
        del options[local]
    with open_existing(ctx) as engine:
        current = engine.service.get(name, tenant=tenant, actor=operator())
        changes = DefinitionOptions(**options).patch(tz or current.timezone)
        updated = engine.service.patch(
            name, changes, actor=operator(), tenant=tenant, expected_version=expect_version
        )
        if as_json:
            emit_json(schedule_json(updated))
        elif updated.version == current.version:
            say(f"{tenant}/{name} already is so: nothing changed")
        else:
            say(f"updated {tenant}/{name} (version {updated.version})")
            stdout.print(schedule_table(updated, engine.clock.now_ms()))


@app.command("list", epilog=EXIT_CODES)
@handles_errors
def list_(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    status: Annotated[
        ScheduleStatus | None, typer.Option("--status", help="Only this status.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100_000)] = 1000,
    as_json: Json = False,
) -> None:
    """List schedules, the soonest due first."""
    with open_for_read(ctx) as engine:
        schedules = engine.service.schedules(
            tenant=tenant, status=status, limit=limit, actor=operator()
        )
        if as_json:
            emit_json([schedule_json(s) for s in schedules])
        elif not schedules:
            say("no schedules yet: add one with `vortos schedule add`")
        else:
            stdout.print(schedules_table(schedules, engine.clock.now_ms()))


@app.command("show", epilog=EXIT_CODES)
@handles_errors
def show(
    ctx: typer.Context, name: Name, tenant: Tenant = DEFAULT_TENANT, as_json: Json = False
) -> None:
    """Show one schedule in full."""
    with open_for_read(ctx) as engine:
        schedule = engine.service.get(name, tenant=tenant, actor=operator())
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            stdout.print(schedule_table(schedule, engine.clock.now_ms()))


@app.command("preview", epilog=EXIT_CODES)
@handles_errors
def preview(
    ctx: typer.Context,
    name: Name,
    count: Annotated[int, typer.Option("--count", min=1, max=1000, help="How many slots.")] = 10,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            help=(
                "Preview from this instant (inclusive) instead of now: ISO 8601 with an offset "
                "or Z, e.g. 2027-03-28T00:00Z; without one it is read as UTC."
            ),
        ),
    ] = None,
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
) -> None:
    """The next fire instants, in the schedule's zone and in UTC, with DST marks."""
    after = None if start is None else parse_instant(start)
    with open_for_read(ctx) as engine:
        slots = engine.service.preview(
            name, tenant=tenant, count=count, after_ms=after, actor=operator()
        )
        if as_json:
            emit_json([preview_json(s) for s in slots])
        elif not slots:
            say("no further slots: the trigger is exhausted")
        else:
            schedule = engine.service.get(name, tenant=tenant, actor=operator())
            trigger = schedule.trigger
            rules = trigger.dst_rules() if isinstance(trigger, CronTrigger) else None
            stdout.print(preview_table(slots, rules, stdout.width))


@app.command("pause", epilog=EXIT_CODES)
@handles_errors
def pause(
    ctx: typer.Context,
    name: Name,
    note: Annotated[str | None, typer.Option("--note", help="Why, for other operators.")] = None,
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
) -> None:
    """Stop dispatching a schedule until it is resumed."""
    with open_existing(ctx) as engine:
        schedule = engine.service.pause(name, tenant=tenant, note=note, actor=operator())
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            say(f"paused {schedule.tenant}/{schedule.name}" + _override_said(schedule))


@app.command("resume", epilog=EXIT_CODES)
@handles_errors
def resume(
    ctx: typer.Context,
    name: Name,
    catch_up: Annotated[
        bool,
        typer.Option(
            "--catch-up",
            help="Also fire the slots missed while paused, as the schedule's misfire policy "
            "says (within its maximum catch-up age).",
        ),
    ] = False,
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
) -> None:
    """Dispatch again from the next slot; slots missed while paused do not fire (unless
    --catch-up)."""
    with open_existing(ctx) as engine:
        schedule = engine.service.resume(name, tenant=tenant, actor=operator(), catch_up=catch_up)
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            say(f"resumed {schedule.tenant}/{schedule.name}" + _override_said(schedule))


def _override_said(schedule: Schedule) -> str:
    if schedule.override is None:
        return ""
    return (
        f" (an override of its code, which declares it {schedule.declared_status.value}: it "
        "stays so across deploys until `vortos schedule clear-override`)"
    )


@app.command("clear-override", epilog=EXIT_CODES)
@handles_errors
def clear_override(
    ctx: typer.Context, name: Name, tenant: Tenant = DEFAULT_TENANT, as_json: Json = False
) -> None:
    """Return a static (code-declared) schedule to what its code declares, dropping an
    operator's pause or resume of it."""
    with open_existing(ctx) as engine:
        schedule = engine.service.clear_override(name, tenant=tenant, actor=operator())
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            say(
                f"{schedule.tenant}/{schedule.name} is {schedule.status.value}, "
                "as its code declares"
            )


@app.command("delete", epilog=EXIT_CODES)
@handles_errors
def delete(
    ctx: typer.Context, name: Name, tenant: Tenant = DEFAULT_TENANT, as_json: Json = False
) -> None:
    """Delete a schedule. Its runs stay in the ledger."""
    with open_existing(ctx) as engine:
        schedule = engine.service.delete(name, tenant=tenant, actor=operator())
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            say(f"deleted {schedule.tenant}/{schedule.name}")


@app.command("trigger", epilog=EXIT_CODES)
@handles_errors
def trigger(
    ctx: typer.Context, name: Name, tenant: Tenant = DEFAULT_TENANT, as_json: Json = False
) -> None:
    """Fire a schedule now, once (a manual run). The schedule's next slots are unchanged."""
    with open_existing(ctx) as engine:
        run = engine.service.trigger(name, tenant=tenant, actor=operator())
        if as_json:
            emit_json(run_json(run))
        else:
            say(f"triggered {run.tenant}/{run.schedule_name}: run {run.id} ({run.slot_key})")


@app.command("backfill", epilog=EXIT_CODES)
@handles_errors
def backfill(
    ctx: typer.Context,
    name: Name,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="First instant of the range (ISO 8601; without an offset, in the "
            "schedule's zone).",
            show_default=False,
        ),
    ],
    end: Annotated[
        str,
        typer.Option(
            "--to", help="End of the range, exclusive; at or before now.", show_default=False
        ),
    ],
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm a range of more than 10,000 slots.")
    ] = False,
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
) -> None:
    """Dispatch every slot of the schedule in [--from, --to) that never fired, as backfill
    runs. Run it twice and nothing fires twice: slots already dispatched are left alone."""
    with open_existing(ctx) as engine:
        zone_of = engine.service.get(name, tenant=tenant, actor=operator()).timezone
        report = engine.service.backfill(
            name,
            start_ms=_instant_option("--from", start, zone_of),
            end_ms=_instant_option("--to", end, zone_of),
            actor=operator(),
            tenant=tenant,
            confirmed=yes,
        )
        if as_json:
            emit_json(backfill_json(report))
        elif report.slots == 0:
            say(f"no slot of {tenant}/{name} falls in that range")
        else:
            say(
                f"backfilled {tenant}/{name}: {report.slots} slot(s) in range, "
                f"{report.dispatched} dispatched, {report.already} already dispatched before"
            )


def _instant_option(option: str, text: str, tz: str) -> int:
    try:
        return parse_instant(text, tz)
    except InvalidInput as exc:
        raise InvalidInput(f"{option}: {exc}") from None
