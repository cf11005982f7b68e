"""Acceptance 8: bad input to the execution CLI gets a clear one-line error, its exit code, and
changes nothing.

Covers app commands and their payloads, the process allowlist, trigger and backfill, the dead
letter queue, `runs show`, the options of `vortos run` and `vortos consume`, and `--app` modules
that cannot be loaded. Each case runs the real CLI in a subprocess against its own copy of a
database holding schedules, a dead letter, a completed and a waiting run, and compares the
database's full content (read through the stdlib sqlite3 module) before and after.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engine import (
    CronTrigger,
    FireContext,
    IntervalTrigger,
    ManualClock,
    RetryPolicy,
    RunState,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.commands.decorators import SOURCE_KEY, StaticSchedule
from engine.domain.timeutil import HOUR_MS, MINUTE_MS
from tests.cli.support import (
    DbState,
    assert_clean_error,
    assert_usage_error,
    checkpoint,
    cli_json,
    copy_database,
    db_state,
    table_count,
)
from tests.conftest import T0, CliResult, run_cli

APP_MODULE = "vortos_bad_input_app"
APP_SOURCE = """
from engine import FireContext, schedulable


@schedulable("greet")
def greet(name: str, times: int = 1, tags: list[str] | None = None, *, fire: FireContext) -> str:
    return f"hello {name}"


@schedulable("explode")
def explode(reason: str = "boom") -> None:
    raise RuntimeError(reason)
"""


# -- the database every case starts from ----------------------------------------------------------


def greet(name: str, times: int = 1, tags: list[str] | None = None, *, fire: FireContext) -> str:
    """The app's `greet`, registered in-process to build the database."""
    return f"hello {name} (run {fire.run_id}, {times}, {tags})"


def explode(reason: str = "boom") -> None:
    raise RuntimeError(reason)


@dataclass(frozen=True)
class Seeded:
    path: Path
    dead: int  # a dead letter (its command failed its only attempt)
    done: int  # a completed run
    waiting: int  # a dispatched run, its fire claimable


def build_database(path: Path) -> Seeded:
    commands = builtin_commands()
    commands.register("greet", greet)
    commands.register("explode", explode)
    clock = ManualClock(T0)
    with open_engine(path, clock=clock, commands=commands) as engine:
        service = engine.service
        for tenant in ("default", "acme"):
            service.create(
                ScheduleSpec(
                    name="heartbeat",
                    trigger=IntervalTrigger(MINUTE_MS, T0 + MINUTE_MS),
                    command="noop",
                    tenant=tenant,
                ),
                actor="seed",
            )
        hourly = IntervalTrigger(HOUR_MS, T0 + HOUR_MS)
        service.create(
            ScheduleSpec(name="greeting", trigger=hourly, command="greet", payload={"name": "ada"}),
            actor="seed",
        )
        service.create(
            ScheduleSpec(
                name="doomed",
                trigger=hourly,
                command="explode",
                payload={"reason": "disk on fire"},
                retry=RetryPolicy(max_attempts=1),
            ),
            actor="seed",
        )
        service.create(
            ScheduleSpec(name="five", trigger=CronTrigger("*/5 * * * *"), command="noop"),
            actor="seed",
        )
        service.create(
            ScheduleSpec(
                name="berlin",
                trigger=CronTrigger("0 * * * *"),
                command="noop",
                timezone="Europe/Berlin",
            ),
            actor="seed",
        )
        dead = service.trigger("doomed", actor="seed").id
        done = service.trigger("greeting", actor="seed").id
        consumer = engine.consumer(consumer_id="seed-consumer", concurrency=2)

        def state(run_id: int) -> RunState:
            run = engine.storage.runs.get(run_id)
            assert run is not None
            return run.state

        deadline = time.monotonic() + 10
        while consumer.busy or {state(dead), state(done)} != {
            RunState.DEAD_LETTERED,
            RunState.COMPLETED,
        }:
            assert time.monotonic() < deadline, "the seed consumer did not settle"
            consumer.step()
            time.sleep(0.002)
        consumer.close()
        waiting = service.trigger("heartbeat", actor="seed").id
        daemon = engine.daemon(node_id="seed-node", lease_ttl_ms=3_600_000)
        daemon.step()  # takes the lease
        for _ in range(2):
            clock.advance(60)
            daemon.step()  # dispatches heartbeat slots in both tenants
        daemon.release()
        assert state(dead) is RunState.DEAD_LETTERED
        assert state(done) is RunState.COMPLETED
        assert state(waiting) is RunState.DISPATCHED
    return Seeded(path, dead, done, waiting)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    seeded = build_database(tmp_path_factory.mktemp("execution-seed") / "template.db")
    checkpoint(seeded.path)
    return seeded


@pytest.fixture
def seeded(tmp_path: Path, template: Seeded) -> Seeded:
    """This test's own copy of the database."""
    path = copy_database(template.path, tmp_path / "vortos.db")
    return Seeded(path, template.dead, template.done, template.waiting)


@pytest.fixture
def db(seeded: Seeded) -> Path:
    return seeded.path


# -- helpers --------------------------------------------------------------------------------------

MakeApp = Callable[[str, str], dict[str, str]]


@pytest.fixture
def make_app(tmp_path: Path) -> MakeApp:
    """Write an app module into the test's directory; return the environment that imports it."""
    folder = tmp_path / "app"
    folder.mkdir()

    def write(module: str, source: str) -> dict[str, str]:
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
        return {"PYTHONPATH": os.pathsep.join([str(folder), os.getcwd()])}

    return write


@pytest.fixture
def app_env(make_app: MakeApp) -> dict[str, str]:
    return make_app(APP_MODULE, APP_SOURCE)


def refused(result: CliResult, code: int, db: Path, before: DbState, *words: str) -> str:
    """One clean error line with `words`, exit `code`, and the database as it was."""
    line = assert_clean_error(result, code, *words)
    assert db_state(db) == before, f"the database changed: {line}"
    return line


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def z(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def a_day_ago() -> datetime:
    return (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


# -- schedule add: app commands and their payloads ------------------------------------------------


def add_with_app(db: Path, env: dict[str, str], *options: str) -> CliResult:
    add = ("schedule", "add", "fresh-job", "--every", "1h")
    return run_cli("--app", APP_MODULE, *add, *options, db=db, env=env)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        pytest.param(
            ("--command", "nosuch"),
            ("unknown command 'nosuch'", "greet", "@schedulable", "--app"),
            id="unknown-command",
        ),
        pytest.param(
            ("--command", "greet"), ("missing required field", "name", "greet"), id="no-payload"
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"times": 2}'),
            ("missing required field", "name", "it takes"),
            id="missing-required-field",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": "ada", "colour": "red"}'),
            ("unknown field", "colour", "it takes"),
            id="unknown-field",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": 5}'),
            ("'name'", "must be a string", "not an integer"),
            id="int-for-str",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": null}'),
            ("'name'", "must be a string", "null"),
            id="null-for-str",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": "ada", "times": "two"}'),
            ("'times'", "must be an integer", "not a string"),
            id="str-for-int",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": "ada", "times": true}'),
            ("'times'", "must be an integer"),
            id="bool-for-int",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": "ada", "times": 1.5}'),
            ("'times'", "must be an integer", "not a number"),
            id="float-for-int",
        ),
        pytest.param(
            ("--command", "greet", "--payload", '{"name": "ada", "tags": ["a", 1]}'),
            ("'tags'", "each item a string"),
            id="wrong-item-type",
        ),
        pytest.param(
            ("--command", "explode", "--payload", '{"reason": ["disk"]}'),
            ("'reason'", "must be a string", "not a list"),
            id="list-for-str",
        ),
    ],
)
def test_add_with_a_bad_app_command_or_payload_is_refused(
    db: Path, app_env: dict[str, str], options: tuple[str, ...], words: tuple[str, ...]
) -> None:
    before = db_state(db)
    refused(add_with_app(db, app_env, *options), 2, db, before, *words)


def test_an_app_command_without_app_is_unknown_and_the_error_says_to_load_it(db: Path) -> None:
    before = db_state(db)
    result = run_cli(
        *("schedule", "add", "fresh-job", "--every", "1h", "--command", "greet"),
        *("--payload", '{"name": "ada"}'),
        db=db,
    )
    refused(result, 2, db, before, "unknown command 'greet'", "--app")


def test_a_refused_app_payload_creates_no_database(tmp_path: Path, app_env: dict[str, str]) -> None:
    path = tmp_path / "fresh.db"
    assert_clean_error(add_with_app(path, app_env, "--command", "greet"), 2, "name")
    assert not path.exists()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        pytest.param(("--max-attempts", "0"), ("max attempts 0", "1 to 100"), id="attempts-0"),
        pytest.param(
            ("--max-attempts", "101"), ("max attempts 101", "1 to 100"), id="attempts-101"
        ),
        pytest.param(("--retry-backoff", "soon"), ("retry backoff", "soon"), id="backoff-garbage"),
        pytest.param(("--retry-backoff", "-1s"), ("retry backoff",), id="backoff-negative"),
        pytest.param(
            ("--retry-backoff", "10m", "--retry-backoff-cap", "1m"),
            ("backoff cap", "between the backoff and 1d"),
            id="cap-below-backoff",
        ),
        pytest.param(("--retry-backoff-cap", "2d"), ("backoff cap", "1d"), id="cap-over-a-day"),
    ],
)
def test_add_with_a_bad_retry_policy_is_refused(
    db: Path, options: tuple[str, ...], words: tuple[str, ...]
) -> None:
    before = db_state(db)
    result = run_cli(
        "schedule", "add", "fresh-job", "--every", "1h", "--command", "noop", *options, db=db
    )
    refused(result, 2, db, before, *words)


# -- the process command's allowlist --------------------------------------------------------------

PYTHON = sys.executable


def process_payload(argv: list[str], **extra: object) -> str:
    return json.dumps({"argv": argv, **extra})


@pytest.mark.parametrize(
    ("globals_", "env", "payload", "words"),
    [
        pytest.param(
            (),
            {},
            process_payload(["/bin/rm", "-rf", "/tmp/x"]),
            ("'/bin/rm'", "not on the process allowlist", "VORTOS_PROCESS_ALLOW", "--allow-exec"),
            id="empty-allowlist",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload(["/bin/rm", "-rf", "/tmp/x"]),
            ("'/bin/rm'", "not on the process allowlist", PYTHON),
            id="not-on-the-allowlist",
        ),
        pytest.param(
            (),
            {"VORTOS_PROCESS_ALLOW": PYTHON},
            process_payload(["/bin/sh", "-c", "echo hi"]),
            ("'/bin/sh'", "not on the process allowlist"),
            id="not-on-the-env-allowlist",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload([Path(PYTHON).name, "-c", "pass"]),
            ("not on the process allowlist", "give the full path"),
            id="bare-program-name",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload([]),
            ("argv is empty",),
            id="empty-argv",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            json.dumps({"argv": f"{PYTHON} -c pass"}),
            ("'argv'", "must be a list"),
            id="argv-as-a-string",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload([PYTHON], cwd="relative/dir"),
            ("cwd", "absolute path"),
            id="relative-cwd",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload([PYTHON], env={"BAD-NAME": "x"}),
            ("env name", "BAD-NAME"),
            id="bad-env-name",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload([PYTHON], timeout="forever"),
            ("'forever'", "duration"),
            id="timeout-garbage",
        ),
        pytest.param(
            ("--allow-exec", PYTHON),
            {},
            process_payload([PYTHON], timeout="8d"),
            ("process timeout 8d", "out of range", "7d"),
            id="timeout-over-7d",
        ),
    ],
)
def test_a_process_command_outside_the_allowlist_or_malformed_is_refused(
    db: Path,
    globals_: tuple[str, ...],
    env: dict[str, str],
    payload: str,
    words: tuple[str, ...],
) -> None:
    before = db_state(db)
    result = run_cli(
        *globals_,
        *("schedule", "add", "fresh-job", "--every", "1h", "--command", "process"),
        *("--payload", payload),
        db=db,
        env=env,
    )
    refused(result, 2, db, before, *words)


@pytest.mark.parametrize(
    ("globals_", "env", "args"),
    [
        pytest.param(
            ("--allow-exec", "bin/backup"),
            {},
            ("schedule", "add", "fresh-job", "--every", "1h", "--command", "noop"),
            id="option-add",
        ),
        pytest.param(
            ("--allow-exec", "./backup"),
            {},
            ("schedule", "trigger", "heartbeat"),
            id="option-trigger",
        ),
        pytest.param(("--allow-exec", "backup"), {}, ("run", "--no-consume"), id="option-run"),
        pytest.param(("--allow-exec", "bin/backup"), {}, ("consume",), id="option-consume"),
        pytest.param((), {"VORTOS_PROCESS_ALLOW": "bin/backup"}, ("run",), id="environment-run"),
        pytest.param(
            (),
            {"VORTOS_PROCESS_ALLOW": os.pathsep.join([PYTHON, "bin/backup"])},
            ("consume",),
            id="environment-consume",
        ),
    ],
)
def test_a_relative_allowlist_entry_is_refused(
    db: Path, globals_: tuple[str, ...], env: dict[str, str], args: tuple[str, ...]
) -> None:
    before = db_state(db)
    result = run_cli(*globals_, *args, db=db, env=env, timeout=20)
    refused(result, 2, db, before, "backup", "not an absolute path", "full path")


def test_a_relative_allowlist_entry_creates_no_database(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    result = run_cli("--allow-exec", "bin/backup", "run", db=path, timeout=20)
    assert_clean_error(result, 2, "not an absolute path")
    assert files_in(tmp_path) == []


# -- trigger and backfill -------------------------------------------------------------------------


def backfill(db: Path, name: str, start: str, end: str, *more: str) -> CliResult:
    return run_cli("schedule", "backfill", name, "--from", start, "--to", end, *more, db=db)


def test_backfill_with_end_before_start_is_refused(db: Path) -> None:
    before = db_state(db)
    end = a_day_ago()
    result = backfill(db, "five", z(end), z(end - timedelta(hours=1)))
    refused(result, 2, db, before, "range is reversed", "must be after the start")


@pytest.mark.parametrize(
    ("start", "end"),
    [
        pytest.param("{day}T10:00:00Z", "{day}T10:00:00Z", id="same-text"),
        pytest.param("{day}T11:00:00+01:00", "{day}T10:00:00Z", id="same-instant-other-offset"),
    ],
)
def test_backfill_with_end_equal_to_start_is_refused(db: Path, start: str, end: str) -> None:
    before = db_state(db)
    day = a_day_ago().date().isoformat()
    result = backfill(db, "five", start.format(day=day), end.format(day=day))
    refused(result, 2, db, before, "range is empty", "must be after the start")


def test_backfill_ending_in_the_future_is_refused(db: Path) -> None:
    before = db_state(db)
    now = datetime.now(UTC)
    result = backfill(db, "five", z(now - timedelta(hours=1)), z(now + timedelta(hours=1)))
    refused(result, 2, db, before, "in the future", "at or before now")


def test_backfill_of_more_than_10000_slots_needs_yes_and_yes_accepts_it(db: Path) -> None:
    end = a_day_ago()
    start = end - timedelta(minutes=5 * 10_001)  # 10,001 slots of */5
    before = db_state(db)
    refused(backfill(db, "five", z(start), z(end)), 2, db, before, "more than 10000 slots", "--yes")
    runs_before = table_count(db, "runs")
    confirmed = backfill(db, "five", z(start), z(end), "--yes", "--json")
    assert confirmed.code == 0, confirmed.stderr
    assert json.loads(confirmed.stdout)["dispatched"] == 10_001
    assert table_count(db, "runs") == runs_before + 10_001


@pytest.mark.parametrize(
    ("start", "end", "words"),
    [
        pytest.param(
            "yesterday", "{end}", ("'yesterday'", "not an instant", "ISO 8601"), id="from"
        ),
        pytest.param("{start}", "tomorrow", ("'tomorrow'", "not an instant"), id="to"),
        pytest.param("{start}", "2026-13-01", ("'2026-13-01'", "not an instant"), id="month-13"),
        pytest.param("{start}", "", ("not an instant",), id="empty-to"),
        pytest.param("1900-01-01T00:00:00Z", "{end}", ("out of range", "1970"), id="before-1970"),
        pytest.param(
            "2026-10-25T02:30:00",
            "{end}",
            ("ambiguous or does not exist", "Europe/Berlin", "offset"),
            id="ambiguous-local-time",
        ),
        pytest.param(
            "2026-03-29T02:30:00",
            "{end}",
            ("ambiguous or does not exist", "offset"),
            id="skipped-local-time",
        ),
    ],
)
def test_backfill_with_a_malformed_instant_is_refused(
    db: Path, start: str, end: str, words: tuple[str, ...]
) -> None:
    before = db_state(db)
    last = a_day_ago()
    fill = {"start": z(last - timedelta(hours=1)), "end": z(last)}
    result = backfill(db, "berlin", start.format(**fill), end.format(**fill))
    refused(result, 2, db, before, *words)


@pytest.mark.parametrize(
    "option", [pytest.param("--from", id="no-from"), pytest.param("--to", id="no-to")]
)
def test_backfill_without_from_or_to_is_a_usage_error(db: Path, option: str) -> None:
    before = db_state(db)
    other = "--to" if option == "--from" else "--from"
    result = run_cli("schedule", "backfill", "five", other, z(a_day_ago()), db=db)
    assert_usage_error(result, option)
    assert db_state(db) == before


WINDOW = ("--from", "{start}", "--to", "{end}")


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("schedule", "trigger", "nosuch"), id="trigger"),
        pytest.param(("schedule", "trigger", "nosuch", "--json"), id="trigger-json"),
        pytest.param(("schedule", "trigger", "greeting", "--tenant", "acme"), id="trigger-tenant"),
        pytest.param(("schedule", "backfill", "nosuch", *WINDOW), id="backfill"),
        pytest.param(("schedule", "backfill", "nosuch", *WINDOW, "--json"), id="backfill-json"),
        pytest.param(
            ("schedule", "backfill", "five", "--tenant", "acme", *WINDOW), id="backfill-tenant"
        ),
    ],
)
def test_trigger_or_backfill_of_a_missing_schedule_is_not_found(
    db: Path, args: tuple[str, ...]
) -> None:
    before = db_state(db)
    end = a_day_ago()
    fill = {"start": z(end - timedelta(hours=1)), "end": z(end)}
    result = run_cli(*(a.format(**fill) for a in args), db=db)
    refused(result, 3, db, before, "no schedule named", "schedule list")


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("schedule", "trigger", "heartbeat"), id="trigger"),
        pytest.param(
            ("schedule", "backfill", "heartbeat", "--from", "2026-01-01T00:00:00Z"),
            id="backfill",
        ),
        pytest.param(("queue", "requeue", "1"), id="requeue"),
        pytest.param(("queue", "purge", "--all", "--yes"), id="purge"),
        pytest.param(("runs", "show", "1"), id="runs-show"),
    ],
)
def test_a_path_with_no_database_is_an_error_and_creates_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    if args[1] == "backfill":
        args = (*args, "--to", "2026-01-01T01:00:00Z")
    result = run_cli(*args, db=tmp_path / "vortos.db")
    assert_clean_error(result, 1, "no database", "db init")
    assert files_in(tmp_path) == []


def test_trigger_of_a_schedule_whose_payload_no_longer_fits_its_command_is_refused(
    db: Path, make_app: MakeApp
) -> None:
    # The code changed since the schedule was made: `name` is an integer now.
    env = make_app(
        "vortos_changed_app",
        """
        from engine import schedulable

        @schedulable("greet")
        def greet(name: int) -> None: ...
        """,
    )
    before = db_state(db)
    trigger = run_cli(
        "--app", "vortos_changed_app", "schedule", "trigger", "greeting", db=db, env=env
    )
    refused(trigger, 2, db, before, "'name'", "greet", "must be an integer")
    end = a_day_ago()
    filled = run_cli(
        *("--app", "vortos_changed_app", "schedule", "backfill", "greeting"),
        *("--from", z(end - timedelta(hours=3)), "--to", z(end)),
        db=db,
        env=env,
    )
    refused(filled, 2, db, before, "'name'", "must be an integer")


# -- the dead letter queue ------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_requeue_or_purge_of_an_unknown_run_is_not_found(db: Path, verb: str) -> None:
    before = db_state(db)
    result = run_cli("queue", verb, "999", db=db)
    refused(result, 3, db, before, "999", "queue list")


@pytest.mark.parametrize("verb", ["requeue", "purge"])
@pytest.mark.parametrize("which", ["done", "waiting"])
def test_requeue_or_purge_of_a_run_that_is_not_a_dead_letter_is_refused(
    seeded: Seeded, verb: str, which: str
) -> None:
    run_id = seeded.done if which == "done" else seeded.waiting
    before = db_state(seeded.path)
    result = run_cli("queue", verb, str(run_id), db=seeded.path)
    refused(
        result, 2, seeded.path, before, f"run {run_id} is not a dead letter", "only dead letters"
    )


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_one_bad_id_among_dead_letters_changes_nothing_at_all(seeded: Seeded, verb: str) -> None:
    before = db_state(seeded.path)
    unknown = run_cli("queue", verb, str(seeded.dead), "999", db=seeded.path)
    refused(unknown, 3, seeded.path, before, "999")
    alive = run_cli("queue", verb, str(seeded.dead), str(seeded.waiting), db=seeded.path)
    refused(alive, 2, seeded.path, before, f"run {seeded.waiting} is not a dead letter")
    letters = cli_json("queue", "list", db=seeded.path)
    assert [f["run_id"] for f in letters] == [seeded.dead]


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_requeue_or_purge_of_a_dead_letter_of_another_tenant_is_not_found(
    seeded: Seeded, verb: str
) -> None:
    before = db_state(seeded.path)
    result = run_cli("queue", verb, str(seeded.dead), "--tenant", "acme", db=seeded.path)
    refused(result, 3, seeded.path, before, str(seeded.dead), "acme")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(("queue", "requeue"), ("run ids", "--all"), id="requeue-nothing"),
        pytest.param(("queue", "purge"), ("run ids", "--all"), id="purge-nothing"),
        pytest.param(("queue", "purge", "--yes"), ("run ids", "--all"), id="purge-only-yes"),
        pytest.param(("queue", "requeue", "{dead}", "--all"), ("not both",), id="requeue-both"),
        pytest.param(
            ("queue", "purge", "{dead}", "--all", "--yes"), ("not both",), id="purge-both"
        ),
        pytest.param(("queue", "purge", "--all"), ("--yes",), id="purge-all-without-yes"),
    ],
)
def test_queue_selection_mistakes_are_refused(
    seeded: Seeded, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    before = db_state(seeded.path)
    result = run_cli(*(a.format(dead=seeded.dead) for a in args), db=seeded.path)
    refused(result, 2, seeded.path, before, *words)


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_a_run_id_that_is_not_a_number_is_a_usage_error(db: Path, verb: str) -> None:
    before = db_state(db)
    result = run_cli("queue", verb, "abc", db=db)
    refused(result, 2, db, before, "integer", f"vortos queue {verb} --help")


# -- runs show and runs list ----------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["999", "0"])
def test_runs_show_of_a_missing_run_is_not_found(db: Path, run_id: str) -> None:
    before = db_state(db)
    refused(run_cli("runs", "show", run_id, db=db), 3, db, before, f"no run {run_id}", "runs list")
    json_result = run_cli("runs", "show", run_id, "--json", db=db)
    assert_clean_error(json_result, 3, f"no run {run_id}")


def test_runs_show_of_an_id_too_large_for_the_database_is_a_clean_error(db: Path) -> None:
    result = run_cli("runs", "show", "99999999999999999999", db=db)
    line = assert_clean_error(result, result.code, "99999999999999999999")
    assert result.code in (2, 3), line
    assert "unexpected" not in line


def test_runs_show_of_a_run_id_that_is_not_a_number_is_a_usage_error(db: Path) -> None:
    result = run_cli("runs", "show", "latest", db=db)
    assert_clean_error(result, 2, "integer", "vortos runs show --help")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        pytest.param(("--until", "garbage"), ("'garbage'", "not an instant"), id="until-garbage"),
        pytest.param(
            ("--since", "2026-01-05T00:00:00Z", "--until", "2026-01-05T00:00:00Z"),
            ("--until must be after --since",),
            id="until-equals-since",
        ),
        pytest.param(
            ("--since", "2026-01-05T01:00:00Z", "--until", "2026-01-05T00:00:00Z"),
            ("--until must be after --since",),
            id="until-before-since",
        ),
    ],
)
def test_runs_list_with_a_bad_until_is_refused(
    db: Path, options: tuple[str, ...], words: tuple[str, ...]
) -> None:
    assert_clean_error(run_cli("runs", "list", *options, db=db), 2, *words)


# -- vortos run and vortos consume: bad options start nothing -------------------------------------

WORKER_OPTIONS = [
    pytest.param(("--claim-ttl", "0s"), ("claim ttl 0s", "at least 1s"), id="claim-ttl-0s"),
    pytest.param(("--claim-ttl", "0"), ("claim ttl", "at least 1s"), id="claim-ttl-0"),
    pytest.param(("--claim-ttl", "500ms"), ("claim ttl", "at least 1s"), id="claim-ttl-500ms"),
    pytest.param(
        ("--claim-ttl", "garbage"),
        ("claim ttl", "'garbage'", "not a duration"),
        id="claim-ttl-text",
    ),
    pytest.param(("--grace", "garbage"), ("grace", "'garbage'", "not a duration"), id="grace-text"),
    pytest.param(("--grace", "-1s"), ("grace", "'-1s'"), id="grace-negative"),
]
CONSUMER_COUNTS = [
    pytest.param("0", id="consumers-0"),
    pytest.param("257", id="consumers-257"),
    pytest.param("many", id="consumers-text"),
]
WORKERS = [pytest.param(("run",), id="run"), pytest.param(("consume",), id="consume")]


@pytest.mark.parametrize("command", WORKERS)
@pytest.mark.parametrize(("options", "words"), WORKER_OPTIONS)
def test_a_bad_worker_option_starts_nothing(
    db: Path, command: tuple[str, ...], options: tuple[str, ...], words: tuple[str, ...]
) -> None:
    before = db_state(db)
    result = run_cli(*command, *options, db=db, timeout=20)
    refused(result, 2, db, before, *words)


@pytest.mark.parametrize("command", WORKERS)
@pytest.mark.parametrize("count", CONSUMER_COUNTS)
def test_a_bad_consumer_count_is_a_usage_error(
    db: Path, command: tuple[str, ...], count: str
) -> None:
    before = db_state(db)
    assert_usage_error(run_cli(*command, "--consumers", count, db=db, timeout=20), "--consumers")
    assert db_state(db) == before


def test_no_consume_does_not_make_a_bad_consumer_count_acceptable(db: Path) -> None:
    before = db_state(db)
    result = run_cli("run", "--no-consume", "--consumers", "0", db=db, timeout=20)
    assert_usage_error(result, "--consumers")
    assert db_state(db) == before


@pytest.mark.parametrize("command", WORKERS)
def test_a_bad_worker_option_creates_no_database(tmp_path: Path, command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--claim-ttl", "0s", db=tmp_path / "vortos.db", timeout=20)
    assert_clean_error(result, 2, "claim ttl")
    assert files_in(tmp_path) == []


# -- --app modules that cannot be loaded ----------------------------------------------------------

BROKEN_APPS = [
    pytest.param(
        None,
        ("cannot import app module", "no module named", "PYTHONPATH"),
        id="missing-module",
    ),
    pytest.param(
        'raise RuntimeError("config file /etc/jobs.toml is missing")\n',
        ("raised RuntimeError", "config file /etc/jobs.toml is missing"),
        id="raises-at-import",
    ),
    pytest.param(
        "import no_such_dependency_for_vortos_tests\n",
        ("no_such_dependency_for_vortos_tests",),
        id="missing-dependency",
    ),
    pytest.param(
        """
        from engine import schedulable

        @schedulable("Nightly Report")
        def nightly() -> None: ...
        """,
        ("command name 'Nightly Report'", "not allowed", "lower-case"),
        id="invalid-command-name",
    ),
    pytest.param(
        """
        from engine import schedulable

        @schedulable("same")
        def first() -> None: ...

        @schedulable("same")
        def second() -> None: ...
        """,
        ("'same'", "twice", "another name"),
        id="command-name-twice",
    ),
    pytest.param(
        """
        from datetime import datetime
        from engine import schedulable

        @schedulable("at")
        def at(when: datetime) -> None: ...
        """,
        ("'when'", "JSON payload cannot carry"),
        id="parameter-not-json",
    ),
    pytest.param(
        """
        from engine import schedulable, scheduled

        @scheduled(cron="61 * * * *")
        @schedulable("tick")
        def tick() -> None: ...
        """,
        ("cron", "61 * * * *"),
        id="static-bad-cron",
    ),
    pytest.param(
        """
        from engine import schedulable, scheduled

        @scheduled(every="1h", payload={"n": "x"})
        @schedulable("count")
        def count(n: int) -> None: ...
        """,
        ("'n'", "must be an integer"),
        id="static-payload-does-not-fit",
    ),
]


@pytest.mark.parametrize("args", WORKERS)
@pytest.mark.parametrize(("source", "words"), BROKEN_APPS)
def test_an_app_that_cannot_be_loaded_is_refused_before_anything_starts(
    db: Path,
    make_app: MakeApp,
    args: tuple[str, ...],
    source: str | None,
    words: tuple[str, ...],
) -> None:
    module = "vortos_broken_app"
    env = make_app("vortos_unrelated", "") if source is None else make_app(module, source)
    before = db_state(db)
    result = run_cli("--app", module, *args, db=db, env=env, timeout=20)
    line = refused(result, 2, db, before, *words)
    assert module in line


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(
            ("schedule", "add", "fresh-job", "--every", "1h", "--command", "noop"), id="add"
        ),
        pytest.param(("schedule", "trigger", "heartbeat"), id="trigger"),
        pytest.param(("schedule", "pause", "heartbeat"), id="pause"),
    ],
)
def test_a_change_with_an_app_that_cannot_be_loaded_is_refused(
    db: Path, make_app: MakeApp, args: tuple[str, ...]
) -> None:
    env = make_app("vortos_broken_app", 'raise RuntimeError("config file is missing")\n')
    before = db_state(db)
    result = run_cli("--app", "vortos_broken_app", *args, db=db, env=env)
    refused(result, 2, db, before, "vortos_broken_app", "config file is missing")


def test_an_app_that_cannot_be_loaded_creates_no_database(
    tmp_path: Path, make_app: MakeApp
) -> None:
    env = make_app("vortos_broken_app", "raise ImportError('half-installed')\n")
    path = tmp_path / "fresh.db"
    result = run_cli("--app", "vortos_broken_app", "run", db=path, env=env, timeout=20)
    assert_clean_error(result, 2, "vortos_broken_app", "half-installed")
    assert not path.exists()


@pytest.mark.parametrize("value", ["", " , "])
def test_an_empty_app_is_refused(db: Path, value: str) -> None:
    before = db_state(db)
    result = run_cli("--app", value, "run", db=db, timeout=20)
    refused(result, 2, db, before, "empty", "--app myjobs")


def test_vortos_app_naming_a_missing_module_is_refused(db: Path) -> None:
    before = db_state(db)
    result = run_cli("consume", db=db, env={"VORTOS_APP": "vortos_no_such_app"}, timeout=20)
    refused(result, 2, db, before, "vortos_no_such_app", "VORTOS_APP")


# -- static schedules: a clash with a dynamic one ------------------------------------------------


def test_run_with_a_static_schedule_named_like_a_dynamic_one_is_a_conflict_and_changes_nothing(
    db: Path, make_app: MakeApp
) -> None:
    env = make_app(
        "vortos_clash_app",
        """
        from engine import schedulable, scheduled

        @scheduled(every="1h", name="fresh-static")
        @scheduled(every="1m", name="heartbeat")
        @schedulable("beat")
        def beat() -> None: ...
        """,
    )
    before = db_state(db)
    result = run_cli("--app", "vortos_clash_app", "run", db=db, env=env, timeout=20)
    line = refused(result, 5, db, before, "'heartbeat'", "clashes with a dynamic schedule")
    assert "delete the dynamic one" in line or "another name" in line
    names = {s["name"] for s in cli_json("schedule", "list", db=db)}
    assert "fresh-static" not in names  # checked before anything was written
    assert cli_json("db", "info", db=db)["leader"] is None  # no lease was taken


def test_resume_of_a_static_schedule_no_longer_declared_in_code_is_refused(db: Path) -> None:
    retired = StaticSchedule(
        ScheduleSpec(
            name="retired",
            trigger=IntervalTrigger(HOUR_MS, 0),
            command="noop",
            metadata={SOURCE_KEY: "jobs.retired"},
        ),
        "jobs.retired",
    )
    with open_engine(db) as engine:
        engine.service.sync_static([retired], actor="app")
        assert engine.service.sync_static([], actor="app").disabled == ["default/retired"]
    assert cli_json("schedule", "show", "retired", db=db)["status"] == "disabled"
    before = db_state(db)
    result = run_cli("schedule", "resume", "retired", db=db)
    refused(result, 5, db, before, "'retired'", "no longer declared")
