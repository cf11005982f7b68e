"""`vortos run`: the headless scheduler (daemon and consumers) under systemd or a terminal."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer

from engine.api import Engine, default_node_id
from engine.config import parse_option
from engine.domain.approvals import approval_ttl_ms
from engine.domain.database import POSTGRESQL
from engine.domain.errors import AuditKeyMissing, DatabaseUnavailable, InvalidInput
from engine.domain.timeutil import format_duration, parse_duration
from engine.file_modes import FileAccess, file_access, tighten_all, use_file_access, vortos_files
from engine.governance.keys import key_source
from engine.observability import DEFAULT_METRICS_HOST
from engine.plugins.runtime import Runtime
from engine.ports.dispatch import DispatchReport
from engine.retention import retention_schedule
from engine.retention.audit_upkeep import anchor_schedule
from engine.runtime.breaker import (
    DEFAULT_BREAKER_FAILURES,
    MAX_BREAKER_FAILURES,
    MIN_BREAKER_RECOVERY_MS,
)
from engine.runtime.consumer import FireQueueConsumer
from engine.runtime.daemon import (
    DEFAULT_TENANT_CAP,
    MAX_LOOKAHEAD_MS,
    MAX_SHARDS,
    MIN_LEASE_TTL_MS,
    SchedulerDaemon,
)
from engine.runtime.nodes import Membership
from vortos_tui.cli.context import (
    START_BACKOFF_S,
    CliState,
    configured,
    open_to_serve,
    operator,
    state,
)
from vortos_tui.cli.demo import seed_demo
from vortos_tui.cli.doctor import run_doctor
from vortos_tui.cli.output import handles_errors
from vortos_tui.cli.workers import (
    DEFAULT_CONSUMERS,
    ClaimTtl,
    Consumers,
    ConsumerSettings,
    Grace,
    LogLevel,
    MetricsHost,
    MetricsPort,
    NodeId,
    ServiceThread,
    Telemetry,
    Tracing,
    build_consumer,
    check_node_id,
    configure_logging,
    consumer_settings,
    on_stop_signals,
    start_consumer,
    start_plugins,
    start_telemetry,
)

log = logging.getLogger("vortos.run")

# The options of `vortos run` of its own (the consumers' and telemetry's are workers').
LeaseTtl = Annotated[
    str,
    typer.Option("--lease-ttl", help="Leader lease time to live; a standby takes over within it."),
]
Lookahead = Annotated[
    str,
    typer.Option(
        "--lookahead",
        help="Dispatch slots up to this long before they are due (0 to 10s, default 1s); "
        "their fires still become available at the due instant, so a burst of thousands of "
        "slots due at once is written before it. A pause or delete within it still stops "
        "the slot (consumers skip it at claim). 0: dispatch at the due instant.",
    ),
]
TenantCap = Annotated[
    int,
    typer.Option(
        "--tenant-cap",
        min=0,
        max=1_000_000,
        help="While other tenants have schedules due, one tenant's backlog takes at most "
        "this many due schedules of a dispatch transaction, so it cannot delay the others "
        "(0: no cap).",
    ),
]
BreakerFailures = Annotated[
    int,
    typer.Option(
        "--breaker-failures",
        min=1,
        max=MAX_BREAKER_FAILURES,
        help="Open the dispatch circuit breaker after this many dispatch transactions in a "
        "row failed (the database locked past its busy timeout, say): no dispatch is tried "
        "while it is open, and no slot is lost.",
    ),
]
BreakerRecovery = Annotated[
    str,
    typer.Option(
        "--breaker-recovery",
        help="How long the open breaker waits before trying one dispatch again (at "
        "least 1s); success closes it, failure opens it for another wait.",
    ),
]
ControlSocket = Annotated[
    Path | None,
    typer.Option(
        "--control-socket",
        help="Serve operators' changes on this Unix socket (mode 0660), each made as the "
        "account the kernel reports for the caller. See the README's deployment section.",
    ),
]
ControlGroup = Annotated[
    str | None,
    typer.Option("--control-group", help="The group whose members may use the control socket."),
]
ApprovalTtl = Annotated[
    str,
    typer.Option(
        "--approval-ttl",
        envvar="VORTOS_APPROVAL_TTL",
        help="How long a four-eyes request stays open for approval, and an approval for "
        "use (1s to 30d).",
    ),
]
Shards = Annotated[
    int,
    typer.Option(
        "--shards",
        min=1,
        max=MAX_SHARDS,
        help="Split the schedules into this many lease shards (PostgreSQL): each shard has "
        "its own leader, so several nodes dispatch at once. Every node must use the same "
        "number.",
    ),
]
LeaseDriver = Annotated[
    str,
    typer.Option(
        "--lease-driver",
        help="How the leader lease is held: row (default), advisory (a PostgreSQL "
        "advisory lock: a crashed leader is replaced at once), redis (--redis-url), or a "
        "plug-in's name or dotted path (see `vortos plugins`).",
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option("--redis-url", help="The Redis server of --lease-driver redis."),
]
RedisPrefix = Annotated[
    str | None,
    typer.Option(
        "--redis-prefix",
        help="The prefix of this deployment's Redis keys (--lease-driver redis); default: "
        "vortos:<id>: with <id> derived from the database, so deployments sharing one Redis "
        "never share a key.",
    ),
]
NoConsume = Annotated[
    bool,
    typer.Option(
        "--no-consume", help="Dispatch only; run commands elsewhere with `vortos consume`."
    ),
]
Demo = Annotated[
    bool,
    typer.Option(
        "--demo", help="First add a few demo schedules (tenant 'demo') if they are missing."
    ),
]


@handles_errors
def run(
    ctx: typer.Context,
    lease_ttl: LeaseTtl = "15s",
    node_id: NodeId = None,
    lookahead: Lookahead = "1s",
    tenant_cap: TenantCap = DEFAULT_TENANT_CAP,
    breaker_failures: BreakerFailures = DEFAULT_BREAKER_FAILURES,
    breaker_recovery: BreakerRecovery = "30s",
    control_socket: ControlSocket = None,
    control_group: ControlGroup = None,
    approval_ttl: ApprovalTtl = "24h",
    shards: Shards = 1,
    lease_driver: LeaseDriver = "row",
    redis_url: RedisUrl = None,
    redis_prefix: RedisPrefix = None,
    consumers: Consumers = DEFAULT_CONSUMERS,
    no_consume: NoConsume = False,
    claim_ttl: ClaimTtl = "60s",
    grace: Grace = "30s",
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = DEFAULT_METRICS_HOST,
    trace: Tracing = True,
    demo: Demo = False,
    log_level: LogLevel = "info",
) -> None:
    """Run the scheduler: lead (or stand by) and dispatch every due slot exactly once, and run
    the fires' commands on worker threads (unless --no-consume).

    With --app, the app's static schedules are synced first. Stops cleanly on SIGTERM or
    SIGINT: the lease is released at once so a standby takes over, running commands get the
    grace to finish (or their fires are given back), and the exit code is 0.
    """
    o = _options(ctx)
    configure_logging(o.log_level)
    check_node_id(node_id)
    node = node_id or default_node_id()
    cli = state(ctx)
    cli.serving = True  # it runs fires: its own allowlists, whatever socket the env names
    cli.commands()  # import the app (and refuse a broken one) before opening the database
    # The engine is built with run's own flags; every plug-in the settings name is imported
    # now: a missing or broken one stops us here.
    cli.override(
        lease_driver=o.lease_driver,
        redis_url=o.redis_url,
        redis_prefix=o.redis_prefix,
        approval_ttl=o.approval_ms,
    )
    cli.plugins()
    # A server down or restarting, or a session cut, while starting (DatabaseUnavailable) is
    # waited for: the start-up is undone and tried again with backoff, said as what it is.
    # Once serving, the daemons and consumers retry on their own.
    backoffs = iter((*START_BACKOFF_S, None))
    while True:
        serving_since = False
        try:
            with contextlib.ExitStack() as serving:
                node_ = _start_node(serving, ctx, o, node, trace=trace)
                engine = node_.engine
                # Refused beside live nodes of another --shards before anything is written;
                # on a clean stop the others share this node's shards out at their next beat.
                membership = Membership(
                    engine.storage.nodes,
                    engine.clock,
                    node,
                    o.shards,
                    o.lease_ttl_ms,
                    lease_driver=o.lease_driver,
                )
                membership.join()
                serving.callback(membership.leave)
                _serve_operators(serving, engine, cli, o)
                _sync_static(engine, cli)
                if demo:
                    added = seed_demo(engine, operator())
                    log.info("demo schedules: %s", ", ".join(added) if added else "already present")
                serving_since = True
                _lead_and_consume(node_, cli, o, node, membership, consume=not no_consume)
                log.info("stopped")
        except DatabaseUnavailable as exc:
            backoff = next(backoffs)
            if serving_since or backoff is None:
                raise
            log.warning("%s; retrying in %.1f s (starting over)", exc, backoff)
            time.sleep(backoff)  # starting: nothing else to do until the server answers
        else:
            return


@dataclass(frozen=True, slots=True)
class _Node:
    """What `vortos run` serves with: its engine, telemetry and running plug-ins."""

    engine: Engine
    telemetry: Telemetry
    plugins: Runtime


def _start_node(
    serving: contextlib.ExitStack, ctx: typer.Context, o: _Options, node: str, *, trace: bool
) -> _Node:
    """Telemetry, the engine (its files made private), the plug-ins, each closed by `serving`
    in the order that lets no scrape read a closed database."""
    cli = state(ctx)
    # A metrics port in use fails here, before the database is opened.
    telemetry = start_telemetry(o.metrics_port, o.metrics_host, trace)
    serving.callback(telemetry.close)
    access = file_access(o.control_group, cli.settings.operator_file_access)
    use_file_access(access)  # what it creates: its --control-group's, not only the setting's
    engine = serving.enter_context(open_to_serve(ctx, node_id=node, retry=False))
    _make_files_private(cli, access)
    # Built before anything is written: a plug-in that fails to start changes nothing.
    plugins = start_plugins(engine, cli, node, telemetry, ship_audit=True)
    serving.callback(plugins.close)
    serving.callback(telemetry.close)  # again, first: no scrape once the database closes
    telemetry.watch(engine, cli.db)
    # Every fire is audited: without the key there is no dispatching, so say so now.
    engine.storage.audit.keys()
    return _Node(engine, telemetry, plugins)


def _serve_operators(
    serving: contextlib.ExitStack, engine: Engine, cli: CliState, o: _Options
) -> None:
    """The control socket, when asked for: operators' changes, the console's reads (narrowed
    per operator) and the doctor, until `serving` closes."""
    if o.control_socket is None:
        return
    serving.enter_context(
        engine.serve_control(
            o.control_socket,
            group=o.control_group,
            database=cli.db,  # the console's reads, narrowed per operator
            doctor=lambda: run_doctor(replace(cli, control_socket=None)),
        )
    )


def _lead_and_consume(
    node_: _Node,
    cli: CliState,
    o: _Options,
    node: str,
    membership: Membership,
    *,
    consume: bool,
) -> None:
    """Lead (or stand by) and dispatch with a daemon per shard, with consumers beside (unless
    `consume` is False), until a signal or a failure stops them."""
    engine, telemetry = node_.engine, node_.telemetry
    consumer = (
        build_consumer(engine, node, o.consumers, telemetry.observer, node_.plugins.enqueuer)
        if consume
        else None
    )
    daemons = _daemons(engine, o, node, telemetry, consumer, membership)

    def stop() -> None:
        for daemon in daemons:
            daemon.stop()
        if consumer is not None:
            consumer.stop()

    on_stop_signals(stop)
    log.info(
        "vortos %s on %s (lease ttl %s, %s lease%s, %s, %s)",
        node,
        cli.db.shown,
        format_duration(o.lease_ttl_ms),
        o.lease_driver,
        "" if o.shards == 1 else f", {o.shards} shards",
        "no consumers" if consumer is None else f"{o.consumers.concurrency} consumer thread(s)",
        telemetry.describe(),
    )
    # Audit sinks are fed by the node that leads (shard 0's leader, with shards).
    node_.plugins.start(leading=lambda: daemons[0].leading)
    # A consumer that fails (the database stayed unreadable) stops the daemons, and its
    # error ends the service below: no service dispatching with nobody consuming.
    worker = None if consumer is None else start_consumer(consumer, on_failure=stop)
    try:
        run_daemons(daemons)
    finally:
        if consumer is not None and worker is not None:
            consumer.stop()
            worker.join()


def _daemons(
    engine: Engine,
    o: _Options,
    node: str,
    telemetry: Telemetry,
    consumer: FireQueueConsumer | None,
    membership: Membership,
) -> list[SchedulerDaemon]:
    """A daemon per lease shard (one without shards), each poking the consumer when it
    dispatched, and each leading only while its shard is this node's share (`membership`)."""

    def dispatched(report: DispatchReport) -> None:
        if consumer is not None and report.dispatched:
            consumer.poke()  # run the fires now, not at the consumer's next look

    return [
        engine.daemon(
            node_id=node,
            lease_ttl_ms=o.lease_ttl_ms,
            lookahead_ms=o.lookahead_ms,
            on_dispatch=dispatched,
            tenant_cap=o.tenant_cap or None,
            observer=telemetry.observer,
            breaker_failures=o.breaker_failures,
            breaker_recovery_ms=o.recovery_ms,
            shard=None if o.shards == 1 else (index, o.shards),
            wants_lease=functools.partial(membership.wants, index),
        )
        for index in range(o.shards)
    ]


@dataclass(frozen=True, slots=True)
class _Options:
    """`vortos run`'s options, each as given on its command line or else from the settings
    (vortos.toml, VORTOS_*, defaults), checked."""

    lease_ttl_ms: int
    lookahead_ms: int
    tenant_cap: int
    breaker_failures: int
    recovery_ms: int
    approval_ms: int
    control_socket: Path | None
    control_group: str | None
    consumers: ConsumerSettings
    metrics_port: int | None
    metrics_host: str
    log_level: str
    shards: int
    lease_driver: str
    redis_url: str | None
    redis_prefix: str | None


def run_daemons(daemons: list[SchedulerDaemon]) -> None:
    """Run the daemons until they stop: the first on this thread, each other shard's on a
    thread of its own."""

    def stop_all() -> None:
        for daemon in daemons:
            daemon.stop()

    others = [
        ServiceThread(d.run, f"vortos-shard-{n}", on_failure=stop_all).start()
        for n, d in enumerate(daemons[1:], start=1)
    ]
    try:
        daemons[0].run()
    finally:
        for daemon in daemons[1:]:
            daemon.stop()
        for thread in others:
            thread.join()  # raises a shard's failure: it stopped the others


def _make_files_private(cli: CliState, access: FileAccess) -> None:
    """An existing database or key file looser than the layout is tightened, and said (one
    line each): a file created under another umask, or copied in, must not stay readable."""
    db = cli.db.path
    try:
        _, key = key_source(cli.db, cli.settings.audit_key_file)
    except AuditKeyMissing:
        key = None  # PostgreSQL with the key in the environment
    for line in tighten_all(vortos_files(db, key, access)):
        log.warning("%s", line)
    if access.group is not None and os.geteuid() != 0 and os.getegid() != access.gid():
        log.warning(
            "SQLite gives the -wal/-shm files it creates this process's group, not %s: run "
            "the service with %s as its group (systemd Group=%s) so operators can read them",
            access.group,
            access.group,
            access.group,
        )


def _options(ctx: typer.Context) -> _Options:
    ttl = parse_duration(configured(ctx, "lease_ttl"), what="lease TTL")
    if ttl < MIN_LEASE_TTL_MS:
        raise InvalidInput(f"lease TTL {format_duration(ttl)} is too short: use at least 1s")
    control_socket = configured(ctx, "control_socket")
    control_group = configured(ctx, "control_group")
    if control_group is not None and control_socket is None:
        raise InvalidInput("--control-group needs --control-socket")
    return _Options(
        lease_ttl_ms=ttl,
        lookahead_ms=_lookahead_ms(configured(ctx, "lookahead")),
        tenant_cap=configured(ctx, "tenant_cap"),
        breaker_failures=configured(ctx, "breaker_failures"),
        recovery_ms=_breaker_recovery_ms(configured(ctx, "breaker_recovery")),
        approval_ms=approval_ttl_ms(configured(ctx, "approval_ttl")),
        control_socket=control_socket,
        control_group=control_group,
        consumers=consumer_settings(
            configured(ctx, "consumers"),
            configured(ctx, "claim_ttl"),
            configured(ctx, "grace"),
            state(ctx).settings.consumer_deaths,
        ),
        metrics_port=configured(ctx, "metrics_port"),
        metrics_host=configured(ctx, "metrics_host"),
        log_level=configured(ctx, "log_level"),
        shards=_shards(ctx, configured(ctx, "shards")),
        lease_driver=configured(ctx, "lease_driver"),
        redis_url=_redis_url(configured(ctx, "redis_url")),
        redis_prefix=_checked("redis_prefix", configured(ctx, "redis_prefix")),
    )


def _redis_url(given: str | None) -> str | None:
    # --redis-url is checked as VORTOS_REDIS_URL is: an ambiguous URL's driver echoes its password.
    return None if given is None else parse_option("redis_url", given)


def _checked(name: str, given: str | None) -> str | None:
    # An option of run's own is refused as its setting is (VORTOS_REDIS_PREFIX).
    return None if given is None else parse_option(name, given)


def _shards(ctx: typer.Context, shards: int) -> int:
    if shards > 1 and state(ctx).db.backend != POSTGRESQL:
        raise InvalidInput(
            f"--shards {shards}: lease shards need PostgreSQL (--db postgresql://...); one "
            "SQLite file has one writer, so one leader dispatches it all"
        )
    return shards


def _sync_static(engine: Engine, cli: CliState) -> None:
    """The app's static schedules and the built-in retention sweep. Without --app only the
    sweep is made sure of: static schedules of an app not given are not disabled."""
    declared = [
        *cli.loaded_app().static,
        retention_schedule(),
        # Every chain's signed head to the anchors file, and the key's epoch sealed, on time.
        anchor_schedule(cli.settings.audit_anchor_every, seal_every_ms=cli.settings.audit_epoch),
    ]
    report = engine.service.sync_static(declared, actor=operator(), complete=cli.app is not None)
    if cli.app is None:
        return
    log.info(
        "app %s: %d command(s); static schedules %d created, %d updated, %d unchanged, %d disabled",
        cli.app,
        len(cli.loaded_app().commands),
        len(report.created),
        len(report.updated),
        len(report.unchanged),
        len(report.disabled),
    )


def _lookahead_ms(text: str) -> int:
    ahead = parse_duration(text, what="lookahead")
    if ahead > MAX_LOOKAHEAD_MS:
        raise InvalidInput(f"lookahead {text!r} is too long: at most 10s")
    return ahead


def _breaker_recovery_ms(text: str) -> int:
    recovery_ms = parse_duration(text, what="breaker recovery")
    if recovery_ms < MIN_BREAKER_RECOVERY_MS:
        raise InvalidInput(
            f"breaker recovery {format_duration(recovery_ms)} is too short: use at least 1s"
        )
    return recovery_ms
