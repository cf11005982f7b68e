"""`vortos schedule ...`: define and manage schedules."""

from __future__ import annotations

from typing import Annotated

import typer

from engine import (
    CronTrigger,
    IntervalTrigger,
    MisfireKind,
    MisfirePolicy,
    MissingHour,
    OneShotTrigger,
    OverlapPolicy,
    RepeatedHour,
    RetryPolicy,
    ScheduleSpec,
    ScheduleStatus,
    Trigger,
)
from engine.domain.clock import SystemClock
from engine.domain.errors import InvalidInput
from engine.domain.schedule import DEFAULT_TENANT, Schedule, parse_payload, validate_name
from engine.domain.timeutil import DAY_MS, parse_duration, parse_instant
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


def build_trigger(
    *,
    cron: str | None,
    every: str | None,
    at: str | None,
    start: str | None,
    tz: str,
    repeated: RepeatedHour | None,
    missing: MissingHour | None,
    now_ms: int,
) -> Trigger:
    chosen = [
        flag
        for flag, value in (("--cron", cron), ("--every", every), ("--at", at))
        if value is not None
    ]
    if len(chosen) != 1:
        raise InvalidInput(
            "give exactly one of --cron EXPR, --every DURATION or --at INSTANT"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    if (repeated or missing) and cron is None:
        raise InvalidInput("--dst-repeated and --dst-missing apply only to --cron schedules")
    if start is not None and every is None:
        raise InvalidInput("--start applies only to --every schedules")
    if cron is not None:
        return CronTrigger(cron, repeated or RepeatedHour.AUTO, missing or MissingHour.SHIFT)
    if every is not None:
        if every.strip().startswith("-"):
            raise InvalidInput(f"interval {every!r} is negative: give a positive duration")
        period = parse_duration(every, what="interval")
        if period <= 0:
            raise InvalidInput(f"interval {every!r} is zero: give at least 1s")
        # Without --start the first slot is one period from now, on a whole second.
        if start:
            return IntervalTrigger(period, parse_instant(start, tz))
        return IntervalTrigger(period, (now_ms // 1000) * 1000 + period, anchored=False)
    assert at is not None
    return OneShotTrigger(parse_instant(at, tz))


def parse_meta(pairs: list[str]) -> dict[str, str]:
    meta: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--meta {pair!r} is not KEY=VALUE")
        meta[key] = value
    return meta


@app.command("add", epilog=EXIT_CODES)
@handles_errors
def add(
    ctx: typer.Context,
    name: Name,
    command: Annotated[
        str, typer.Option("--command", help="Registered command to run.", show_default=False)
    ],
    cron: Annotated[
        str | None, typer.Option("--cron", help="Cron: 5 fields, or 6 with seconds first.")
    ] = None,
    every: Annotated[
        str | None, typer.Option("--every", help="Fixed interval: 90, 30s, 5m, 1h (at least 1s).")
    ] = None,
    at: Annotated[str | None, typer.Option("--at", help="One-shot instant (ISO 8601).")] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--start", help="First slot of an --every schedule (default: one interval from now)."
        ),
    ] = None,
    payload: Annotated[str, typer.Option("--payload", help="JSON object for the command.")] = "{}",
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the trigger.")] = "UTC",
    misfire: Annotated[
        MisfireKind,
        typer.Option("--misfire", help="Missed slots: skip, latest (fire once) or each."),
    ] = MisfireKind.LATEST,
    catch_up_cap: Annotated[
        int | None,
        typer.Option(
            "--catch-up-cap", help="With --misfire each: fire at most N missed slots (newest)."
        ),
    ] = None,
    max_catch_up_age: Annotated[
        str, typer.Option("--max-catch-up-age", help="Slots older than this are never fired.")
    ] = "1d",
    misfire_grace: Annotated[
        str, typer.Option("--misfire-grace", help="A slot this late still counts as on time.")
    ] = "60s",
    dst_repeated: Annotated[
        RepeatedHour | None,
        typer.Option("--dst-repeated", help=DST_REPEATED_HELP + " [default: auto]"),
    ] = None,
    dst_missing: Annotated[
        MissingHour | None,
        typer.Option("--dst-missing", help=DST_MISSING_HELP + " [default: shift]"),
    ] = None,
    overlap: Annotated[
        OverlapPolicy, typer.Option("--overlap", help="While the previous run is open.")
    ] = OverlapPolicy.SKIP,
    jitter: Annotated[
        str,
        typer.Option("--jitter", help="Spread each slot by a stable offset up to this (max 1h)."),
    ] = "0",
    tenant: Tenant = DEFAULT_TENANT,
    sensitive: Annotated[bool, typer.Option("--sensitive", help="Mark as sensitive.")] = False,
    meta: Annotated[
        list[str] | None, typer.Option("--meta", help="KEY=VALUE metadata; repeat for more.")
    ] = None,
    max_attempts: Annotated[
        int,
        typer.Option(
            "--max-attempts", help="Attempts before a failing fire is dead-lettered (1 to 100)."
        ),
    ] = RetryPolicy().max_attempts,
    retry_backoff: Annotated[
        str,
        typer.Option(
            "--retry-backoff", help="Wait before the first retry; it doubles with each one."
        ),
    ] = "2s",
    retry_backoff_cap: Annotated[
        str, typer.Option("--retry-backoff-cap", help="The longest wait between retries.")
    ] = "5m",
    as_json: Json = False,
) -> None:
    """Add a schedule: exactly one of --cron, --every or --at.

    The command must be registered (built-in, or @schedulable in the --app modules), and the
    payload must fit its parameters."""
    validate_name(name)
    validate_name(tenant, what="tenant")
    if catch_up_cap is not None and misfire is not MisfireKind.EACH:
        raise InvalidInput("--catch-up-cap applies only to --misfire each")
    max_age = parse_duration(max_catch_up_age, what="maximum catch-up age")
    grace = parse_duration(misfire_grace, what="misfire grace")
    if max_age > 366 * DAY_MS:
        raise InvalidInput("maximum catch-up age must be at most 366d")
    now = SystemClock().now_ms()
    trigger = build_trigger(
        cron=cron,
        every=every,
        at=at,
        start=start,
        tz=tz,
        repeated=dst_repeated,
        missing=dst_missing,
        now_ms=now,
    )
    spec = ScheduleSpec(
        name=name,
        trigger=trigger,
        command=command,
        payload=parse_payload(payload),
        timezone=tz,
        tenant=tenant,
        misfire=MisfirePolicy(
            misfire, 100 if catch_up_cap is None else catch_up_cap, max_age, grace
        ),
        overlap=overlap,
        jitter_ms=parse_duration(jitter, what="jitter"),
        sensitive=sensitive,
        metadata=parse_meta(meta or []),
        retry=RetryPolicy(
            max_attempts=max_attempts,
            backoff_ms=parse_duration(retry_backoff, what="retry backoff"),
            backoff_cap_ms=parse_duration(retry_backoff_cap, what="retry backoff cap"),
        ),
    )
    # Everything that can be refused is refused before the database is created or opened.
    validate_spec(spec, state(ctx).commands(), now)
    with open_for_write(ctx) as engine:
        schedule = engine.service.create(spec, actor=operator())
        if as_json:
            emit_json(schedule_json(schedule))
        else:
            say(f"added {schedule.tenant}/{schedule.name}: {trigger.describe()} in {tz}")
            stdout.print(schedule_table(schedule, engine.clock.now_ms()))


@app.command("edit", epilog=EXIT_CODES)
@handles_errors
def edit(
    ctx: typer.Context,
    name: Name,
    command: Annotated[str | None, typer.Option("--command", help="Registered command.")] = None,
    cron: Annotated[str | None, typer.Option("--cron", help="A new cron trigger.")] = None,
    every: Annotated[str | None, typer.Option("--every", help="A new fixed interval.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="A new one-shot instant.")] = None,
    start: Annotated[
        str | None, typer.Option("--start", help="First slot of a new --every trigger.")
    ] = None,
    payload: Annotated[str | None, typer.Option("--payload", help="A new JSON payload.")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="A new IANA time zone.")] = None,
    misfire: Annotated[
        MisfireKind | None, typer.Option("--misfire", help="skip, latest or each.")
    ] = None,
    catch_up_cap: Annotated[
        int | None, typer.Option("--catch-up-cap", help="With --misfire each.")
    ] = None,
    max_catch_up_age: Annotated[str | None, typer.Option("--max-catch-up-age")] = None,
    misfire_grace: Annotated[str | None, typer.Option("--misfire-grace")] = None,
    dst_repeated: Annotated[
        RepeatedHour | None, typer.Option("--dst-repeated", help=DST_REPEATED_HELP)
    ] = None,
    dst_missing: Annotated[
        MissingHour | None, typer.Option("--dst-missing", help=DST_MISSING_HELP)
    ] = None,
    overlap: Annotated[OverlapPolicy | None, typer.Option("--overlap")] = None,
    jitter: Annotated[str | None, typer.Option("--jitter")] = None,
    tenant: Tenant = DEFAULT_TENANT,
    sensitive: Annotated[
        bool | None,
        typer.Option("--sensitive/--not-sensitive", help="Mark or unmark as sensitive."),
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option("--meta", help="KEY=VALUE to set (KEY= removes it); repeat for more."),
    ] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts")] = None,
    retry_backoff: Annotated[str | None, typer.Option("--retry-backoff")] = None,
    retry_backoff_cap: Annotated[str | None, typer.Option("--retry-backoff-cap")] = None,
    expect_version: Annotated[
        int | None,
        typer.Option(
            "--expect-version", help="Refuse if the schedule changed since you read this version."
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Change a schedule: only what you give changes. A new trigger, zone or jitter fires
    from the first slot after now. A sensitive schedule (or making one sensitive or not)
    needs a second operator's approval."""
    with open_existing(ctx) as engine:
        current = engine.service.get(name, tenant=tenant, actor=operator())
        trigger: Trigger = current.trigger
        if any(v is not None for v in (cron, every, at)):
            # A new cron keeps the DST rules it had unless they are given: an edit changes
            # only what it is given.
            was = current.trigger if isinstance(current.trigger, CronTrigger) else None
            trigger = build_trigger(
                cron=cron,
                every=every,
                at=at,
                start=start,
                tz=tz or current.timezone,
                repeated=dst_repeated or (was.repeated if was and cron is not None else None),
                missing=dst_missing or (was.missing if was and cron is not None else None),
                now_ms=engine.clock.now_ms(),
            )
            same_period = (
                isinstance(trigger, IntervalTrigger)
                and isinstance(current.trigger, IntervalTrigger)
                and trigger.every_ms == current.trigger.every_ms
            )
            if same_period and start is None:
                trigger = current.trigger  # the same interval: keep its slots where they are
        elif start is not None:
            raise InvalidInput("--start applies only with a new --every")
        elif dst_repeated or dst_missing:
            if not isinstance(trigger, CronTrigger):
                raise InvalidInput("--dst-repeated and --dst-missing apply only to cron schedules")
            trigger = CronTrigger(
                trigger.expression, dst_repeated or trigger.repeated, dst_missing or trigger.missing
            )
        kind = misfire or current.misfire.kind
        if catch_up_cap is not None and kind is not MisfireKind.EACH:
            raise InvalidInput("--catch-up-cap applies only to --misfire each")
        metadata = dict(current.metadata)
        for key, value in parse_meta(meta or []).items():
            if value:
                metadata[key] = value
            else:
                metadata.pop(key, None)
        retry = current.retry
        spec = ScheduleSpec(
            name=name,
            trigger=trigger,
            command=command or current.command,
            payload=current.payload if payload is None else parse_payload(payload),
            timezone=tz or current.timezone,
            tenant=tenant,
            misfire=MisfirePolicy(
                kind,
                current.misfire.catch_up_cap if catch_up_cap is None else catch_up_cap,
                current.misfire.max_age_ms
                if max_catch_up_age is None
                else parse_duration(max_catch_up_age, what="maximum catch-up age"),
                current.misfire.grace_ms
                if misfire_grace is None
                else parse_duration(misfire_grace, what="misfire grace"),
            ),
            overlap=overlap or current.overlap,
            jitter_ms=current.jitter_ms
            if jitter is None
            else parse_duration(jitter, what="jitter"),
            sensitive=current.sensitive if sensitive is None else sensitive,
            metadata=metadata,
            retry=RetryPolicy(
                max_attempts=retry.max_attempts if max_attempts is None else max_attempts,
                backoff_ms=retry.backoff_ms
                if retry_backoff is None
                else parse_duration(retry_backoff, what="retry backoff"),
                backoff_cap_ms=retry.backoff_cap_ms
                if retry_backoff_cap is None
                else parse_duration(retry_backoff_cap, what="retry backoff cap"),
            ),
        )
        updated = engine.service.update(spec, actor=operator(), expected_version=expect_version)
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
