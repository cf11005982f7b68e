"""The CLI's happy paths, each through a real `vortos` process on a real database file."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from engine import open_engine
from engine.domain.access import Role
from tests.cli.support import assert_clean_error, cli_json, copy_database, db_state
from tests.conftest import run_cli
from vortos_tui.cli.context import operator

FAR_FUTURE = "2099-01-01T00:00:00Z"
BERLIN = ZoneInfo("Europe/Berlin")


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def add(db: Path, name: str, *options: str) -> None:
    result = run_cli("schedule", "add", name, *options, db=db)
    assert result.code == 0, result.stderr


def show(db: Path, name: str, *options: str) -> Any:
    return cli_json("schedule", "show", name, *options, db=db)


@pytest.fixture
def empty_db(db_path: Path) -> Path:
    """An initialised database with nothing in it (made in-process: `db init` is tested below)."""
    open_engine(db_path).close()
    return db_path


@pytest.fixture(scope="module")
def shared_seeded_db(tmp_path_factory: pytest.TempPathFactory, seed_template: Path) -> Path:
    """One seeded copy for the tests that only read it."""
    return copy_database(seed_template, tmp_path_factory.mktemp("read-only") / "vortos.db")


# -- schedule add / show --------------------------------------------------------------------------


def approved_by_someone_else(db: Path, waiting: str) -> None:
    """A sensitive change waits (exit 6) for another operator: approve it as one."""
    request = waiting.split("request ", 1)[1].split(" ", 1)[0]
    with open_engine(db, create=False, enforce=True) as engine:
        engine.service.grant_role("bea", Role.APPROVER, actor=operator())
        engine.service.approve(request, actor="bea")


def test_add_cron_then_show_json_has_every_field(db_path: Path) -> None:
    options = (
        *("--cron", "30 2 * * *", "--tz", "Europe/Berlin"),
        *("--dst-repeated", "both", "--dst-missing", "skip"),
        *("--command", "echo", "--payload", '{"to": "ops@example.com"}'),
        *("--misfire", "each", "--catch-up-cap", "5", "--max-catch-up-age", "2h"),
        *("--misfire-grace", "30s", "--overlap", "buffer-one", "--jitter", "10s"),
        *("--tenant", "acme", "--sensitive", "--meta", "owner=ops", "--meta", "tier=gold"),
    )
    waiting = run_cli("schedule", "add", "nightly-report", *options, db=db_path)
    assert waiting.code == 6, waiting  # sensitive: four-eyes first
    approved_by_someone_else(db_path, waiting.stderr)
    add(
        db_path,
        "nightly-report",
        *("--cron", "30 2 * * *", "--tz", "Europe/Berlin"),
        *("--dst-repeated", "both", "--dst-missing", "skip"),
        *("--command", "echo", "--payload", '{"to": "ops@example.com"}'),
        *("--misfire", "each", "--catch-up-cap", "5", "--max-catch-up-age", "2h"),
        *("--misfire-grace", "30s", "--overlap", "buffer-one", "--jitter", "10s"),
        *("--tenant", "acme", "--sensitive", "--meta", "owner=ops", "--meta", "tier=gold"),
    )
    schedule = show(db_path, "nightly-report", "--tenant", "acme")
    assert schedule["name"] == "nightly-report"
    assert schedule["tenant"] == "acme"
    assert schedule["trigger"]["kind"] == "cron"
    assert schedule["trigger"]["cron"] == "30 2 * * *"
    assert schedule["trigger"]["dst_repeated"] == "both"
    assert schedule["trigger"]["dst_missing"] == "skip"
    assert schedule["timezone"] == "Europe/Berlin"
    assert schedule["command"] == "echo"
    assert schedule["payload"] == {"to": "ops@example.com"}
    assert schedule["misfire"] == {
        "kind": "each",
        "catch_up_cap": 5,
        "max_age_ms": 7_200_000,
        "grace_ms": 30_000,
    }
    assert schedule["overlap"] == "buffer-one"
    assert schedule["jitter_ms"] == 10_000
    assert schedule["sensitive"] is True
    assert schedule["metadata"] == {"owner": "ops", "tier": "gold"}
    assert schedule["status"] == "active"
    assert schedule["version"] == 1
    next_slot = instant(schedule["next_slot_at"]).astimezone(BERLIN)
    assert (next_slot.hour, next_slot.minute) == (2, 30)


def test_add_cron_takes_the_documented_defaults(db_path: Path) -> None:
    add(db_path, "hourly", "--cron", "0 * * * *", "--command", "noop")
    schedule = show(db_path, "hourly")
    assert schedule["tenant"] == "default"
    assert schedule["timezone"] == "UTC"
    assert schedule["payload"] == {}
    assert schedule["trigger"]["dst_repeated"] == "auto"
    assert schedule["trigger"]["dst_missing"] == "shift"
    assert schedule["misfire"]["kind"] == "latest"
    assert schedule["overlap"] == "skip"
    assert schedule["jitter_ms"] == 0
    assert schedule["sensitive"] is False
    assert schedule["pause_note"] is None


def test_add_six_field_cron_with_seconds(db_path: Path) -> None:
    add(db_path, "every-ten-seconds", "--cron", "*/10 * * * * *", "--command", "noop")
    assert instant(show(db_path, "every-ten-seconds")["next_slot_at"]).second % 10 == 0


def test_add_interval_then_show_json_has_its_period_and_anchor(db_path: Path) -> None:
    add(db_path, "poll", "--every", "90", "--start", FAR_FUTURE, "--command", "noop")
    schedule = show(db_path, "poll")
    assert schedule["trigger"]["kind"] == "interval"
    assert schedule["trigger"]["every_ms"] == 90_000
    assert schedule["trigger"]["anchor_ms"] == int(instant(FAR_FUTURE).timestamp() * 1000)
    assert instant(schedule["next_slot_at"]) == instant(FAR_FUTURE)


@pytest.mark.parametrize(("every", "ms"), [("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000)])
def test_add_interval_reads_each_duration_spelling(db_path: Path, every: str, ms: int) -> None:
    add(db_path, "poll", "--every", every, "--command", "noop")
    assert show(db_path, "poll")["trigger"]["every_ms"] == ms


def test_add_one_shot_then_show_json_has_its_instant(db_path: Path) -> None:
    add(db_path, "launch", "--at", "2099-06-01T12:00:00+02:00", "--command", "noop")
    schedule = show(db_path, "launch")
    assert schedule["trigger"]["kind"] == "once"
    assert instant(schedule["next_slot_at"]) == datetime(2099, 6, 1, 10, tzinfo=UTC)


def test_add_one_shot_without_offset_is_read_in_its_zone(db_path: Path) -> None:
    add(db_path, "launch", "--at", "2099-06-01T12:00:00", "--tz", "Asia/Tokyo", "--command", "noop")
    assert instant(show(db_path, "launch")["next_slot_at"]) == datetime(2099, 6, 1, 3, tzinfo=UTC)


def test_add_json_prints_only_the_new_schedule(db_path: Path) -> None:
    result = run_cli(
        "schedule", "add", "poll", "--every", "1m", "--command", "noop", "--json", db=db_path
    )
    assert result.code == 0, result.stderr
    created = json.loads(result.stdout)
    assert created["name"] == "poll"
    assert created == show(db_path, "poll")


def test_add_says_what_it_added(db_path: Path) -> None:
    result = run_cli("schedule", "add", "poll", "--every", "1m", "--command", "noop", db=db_path)
    assert result.code == 0
    assert "added default/poll" in result.stderr
    assert "poll" in result.stdout


def test_add_creates_the_database_when_there_is_none(db_path: Path) -> None:
    assert not db_path.exists()
    add(db_path, "poll", "--every", "1m", "--command", "noop")
    assert db_state(db_path).user_version >= 1


# -- schedule list --------------------------------------------------------------------------------


def test_list_json_is_an_empty_array_on_an_empty_database(empty_db: Path) -> None:
    result = run_cli("schedule", "list", "--json", db=empty_db)
    assert result.code == 0
    assert json.loads(result.stdout) == []


def test_list_without_json_on_an_empty_database_says_so_on_stderr(empty_db: Path) -> None:
    result = run_cli("schedule", "list", db=empty_db)
    assert result.code == 0
    assert result.stdout == ""
    assert "no schedules" in result.stderr


def test_list_json_puts_the_soonest_due_first(empty_db: Path) -> None:
    add(empty_db, "hourly", "--every", "1h", "--command", "noop")
    add(empty_db, "minutely", "--every", "1m", "--command", "noop")
    add(empty_db, "ten-minutes", "--every", "10m", "--command", "noop")
    names = [s["name"] for s in cli_json("schedule", "list", db=empty_db)]
    assert names == ["minutely", "ten-minutes", "hourly"]


def test_list_prints_a_table_naming_every_schedule(shared_seeded_db: Path) -> None:
    result = run_cli("schedule", "list", db=shared_seeded_db)
    assert result.code == 0
    assert "NAME" in result.stdout
    for name in ("heartbeat", "nightly-report", "acme"):
        assert name in result.stdout


def test_list_filters_by_tenant(shared_seeded_db: Path) -> None:
    listed = cli_json("schedule", "list", "--tenant", "acme", db=shared_seeded_db)
    assert [(s["tenant"], s["name"]) for s in listed] == [("acme", "heartbeat")]


def test_show_prints_a_table_of_the_schedule(shared_seeded_db: Path) -> None:
    result = run_cli("schedule", "show", "nightly-report", db=shared_seeded_db)
    assert result.code == 0
    assert "Europe/Berlin" in result.stdout
    assert "ops@example.com" in result.stdout


# -- schedule preview -----------------------------------------------------------------------------


def test_preview_json_gives_the_next_slots_with_local_utc_and_distinct_slot_keys(
    db_path: Path,
) -> None:
    add(
        db_path,
        "berlin-hourly",
        "--cron",
        "0 * * * *",
        "--tz",
        "Europe/Berlin",
        "--command",
        "noop",
    )
    slots = cli_json("schedule", "preview", "berlin-hourly", "--count", "5", db=db_path)
    assert len(slots) == 5
    for slot in slots:
        assert {"local", "utc", "slot_key", "dst"} <= slot.keys()
        local, utc = instant(slot["local"]), instant(slot["utc"])
        assert local == utc
        assert local.utcoffset() == utc.astimezone(BERLIN).utcoffset()
        assert slot["slot_key"].endswith(slot["local"])
    assert len({slot["slot_key"] for slot in slots}) == 5
    moments = [instant(slot["utc"]) for slot in slots]
    assert moments == sorted(moments)
    assert len(set(moments)) == 5


def test_preview_marks_no_dst_effect_on_ordinary_slots(db_path: Path) -> None:
    add(db_path, "poll", "--cron", "*/5 * * * *", "--command", "noop")
    slots = cli_json("schedule", "preview", "poll", "--count", "3", db=db_path)
    assert [slot["dst"] for slot in slots] == [None, None, None]


def test_preview_of_a_one_shot_has_exactly_one_slot(db_path: Path) -> None:
    add(db_path, "launch", "--at", FAR_FUTURE, "--command", "noop")
    slots = cli_json("schedule", "preview", "launch", "--count", "5", db=db_path)
    assert [instant(slot["utc"]) for slot in slots] == [instant(FAR_FUTURE)]


def test_preview_prints_a_table(db_path: Path) -> None:
    add(db_path, "poll", "--every", "1m", "--start", FAR_FUTURE, "--command", "noop")
    result = run_cli("schedule", "preview", "poll", "--count", "2", db=db_path)
    assert result.code == 0
    assert "SLOT KEY" in result.stdout
    assert "2099-01-01T00:01:00" in result.stdout


# -- pause / resume / delete ----------------------------------------------------------------------


def test_pause_with_a_note_shows_paused_with_the_note(seeded_db: Path) -> None:
    result = run_cli("schedule", "pause", "heartbeat", "--note", "disk swap tonight", db=seeded_db)
    assert result.code == 0, result.stderr
    schedule = show(seeded_db, "heartbeat")
    assert schedule["status"] == "paused"
    assert schedule["pause_note"] == "disk swap tonight"


def test_pause_twice_is_fine(seeded_db: Path) -> None:
    assert run_cli("schedule", "pause", "heartbeat", db=seeded_db).code == 0
    second = run_cli("schedule", "pause", "heartbeat", db=seeded_db)
    assert second.code == 0, second.stderr
    assert show(seeded_db, "heartbeat")["status"] == "paused"


def test_pause_touches_only_the_named_tenant(seeded_db: Path) -> None:
    assert run_cli("schedule", "pause", "heartbeat", "--tenant", "acme", db=seeded_db).code == 0
    assert show(seeded_db, "heartbeat", "--tenant", "acme")["status"] == "paused"
    assert show(seeded_db, "heartbeat")["status"] == "active"


def test_resume_makes_a_paused_schedule_active_again(seeded_db: Path) -> None:
    assert run_cli("schedule", "pause", "heartbeat", "--note", "x", db=seeded_db).code == 0
    result = run_cli("schedule", "resume", "heartbeat", db=seeded_db)
    assert result.code == 0, result.stderr
    schedule = show(seeded_db, "heartbeat")
    assert schedule["status"] == "active"
    assert schedule["pause_note"] is None
    # the slots missed while paused are skipped: the cursor moves to the next slot after now
    assert instant(schedule["next_slot_at"]) > datetime.now(UTC) - timedelta(minutes=1)


def test_resume_of_an_active_schedule_is_fine(seeded_db: Path) -> None:
    result = run_cli("schedule", "resume", "heartbeat", db=seeded_db)
    assert result.code == 0, result.stderr
    assert show(seeded_db, "heartbeat")["status"] == "active"


def test_delete_then_show_is_not_found(seeded_db: Path) -> None:
    assert run_cli("schedule", "delete", "heartbeat", db=seeded_db).code == 0
    assert_clean_error(run_cli("schedule", "show", "heartbeat", db=seeded_db), 3, "heartbeat")


def test_delete_keeps_the_schedules_runs_in_the_ledger(seeded_db: Path) -> None:
    before = cli_json("runs", "list", db=seeded_db)
    assert run_cli("schedule", "delete", "heartbeat", db=seeded_db).code == 0
    assert cli_json("runs", "list", db=seeded_db) == before


def test_delete_json_prints_the_deleted_schedule(seeded_db: Path) -> None:
    result = run_cli("schedule", "delete", "heartbeat", "--json", db=seeded_db)
    assert result.code == 0
    assert json.loads(result.stdout)["name"] == "heartbeat"


# -- runs list ------------------------------------------------------------------------------------


def test_runs_list_json_is_an_empty_array_on_an_empty_database(empty_db: Path) -> None:
    result = run_cli("runs", "list", "--json", db=empty_db)
    assert result.code == 0
    assert json.loads(result.stdout) == []


def test_runs_list_json_gives_the_ledger_newest_slot_first(shared_seeded_db: Path) -> None:
    runs = cli_json("runs", "list", db=shared_seeded_db)
    assert len(runs) >= 6
    slots = [instant(r["slot_at"]) for r in runs]
    assert slots == sorted(slots, reverse=True)
    assert {"slot_key", "state", "schedule", "tenant", "node"} <= runs[0].keys()


def test_runs_list_filters_by_schedule_and_tenant(shared_seeded_db: Path) -> None:
    runs = cli_json(
        "runs", "list", "--schedule", "heartbeat", "--tenant", "acme", db=shared_seeded_db
    )
    assert runs
    assert {(r["tenant"], r["schedule"]) for r in runs} == {("acme", "heartbeat")}


def test_runs_list_limit_caps_the_rows(shared_seeded_db: Path) -> None:
    assert len(cli_json("runs", "list", "--limit", "2", db=shared_seeded_db)) == 2


def test_runs_list_since_keeps_later_slots_only(shared_seeded_db: Path) -> None:
    everything = cli_json("runs", "list", db=shared_seeded_db)
    newest = max(instant(r["slot_at"]) for r in everything)
    since = newest.isoformat()
    recent = cli_json("runs", "list", "--since", since, db=shared_seeded_db)
    assert recent
    assert all(instant(r["slot_at"]) >= newest for r in recent)
    assert len(recent) < len(everything)


def test_runs_list_prints_a_table(shared_seeded_db: Path) -> None:
    result = run_cli("runs", "list", db=shared_seeded_db)
    assert result.code == 0
    assert "heartbeat" in result.stdout
    assert "SLOT (UTC)" in result.stdout


# -- db -------------------------------------------------------------------------------------------


def test_db_init_twice_is_idempotent(seeded_db: Path) -> None:
    before = db_state(seeded_db)
    first = run_cli("db", "init", db=seeded_db)
    second = run_cli("db", "init", db=seeded_db)
    assert (first.code, second.code) == (0, 0), first.stderr + second.stderr
    assert db_state(seeded_db) == before


def test_db_init_creates_a_new_database(db_path: Path) -> None:
    result = run_cli("db", "init", db=db_path)
    assert result.code == 0, result.stderr
    assert "schema version" in result.stderr
    assert db_state(db_path).user_version >= 1


def test_db_info_json_has_the_schema_version_and_counts(shared_seeded_db: Path) -> None:
    info = cli_json("db", "info", db=shared_seeded_db)
    assert info["schema_version"] >= 1
    assert info["schedules"] == 3
    assert info["runs"] == len(cli_json("runs", "list", db=shared_seeded_db))


def test_db_info_prints_a_table(shared_seeded_db: Path) -> None:
    result = run_cli("db", "info", db=shared_seeded_db)
    assert result.code == 0
    assert "schema version" in result.stdout


# -- help and the database's location -------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        pytest.param((), id="vortos"),
        pytest.param(("run",), id="run"),
        pytest.param(("schedule",), id="schedule"),
        pytest.param(("schedule", "add"), id="schedule-add"),
        pytest.param(("schedule", "list"), id="schedule-list"),
        pytest.param(("schedule", "show"), id="schedule-show"),
        pytest.param(("schedule", "preview"), id="schedule-preview"),
        pytest.param(("schedule", "pause"), id="schedule-pause"),
        pytest.param(("schedule", "resume"), id="schedule-resume"),
        pytest.param(("schedule", "delete"), id="schedule-delete"),
        pytest.param(("runs",), id="runs"),
        pytest.param(("runs", "list"), id="runs-list"),
        pytest.param(("db",), id="db"),
        pytest.param(("db", "init"), id="db-init"),
        pytest.param(("db", "info"), id="db-info"),
    ],
)
def test_help_documents_the_exit_codes(tmp_path: Path, command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--help", db=tmp_path / "vortos.db")
    assert result.code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "Exit codes" in text, f"`vortos {' '.join(command)} --help` omits the exit codes"
    for documented in ("0 ok", "1 error", "2 usage", "3 not found", "5 conflict"):
        assert documented in text
    assert list(tmp_path.iterdir()) == []


def test_vortos_db_environment_variable_is_honoured(db_path: Path) -> None:
    env = {"VORTOS_DB": str(db_path)}
    result = run_cli("schedule", "add", "poll", "--every", "1m", "--command", "noop", env=env)
    assert result.code == 0, result.stderr
    assert show(db_path, "poll")["name"] == "poll"
    listed = run_cli("schedule", "list", "--json", env=env)
    assert [s["name"] for s in json.loads(listed.stdout)] == ["poll"]


def test_db_option_wins_over_the_environment_variable(tmp_path: Path) -> None:
    from_env = tmp_path / "env.db"
    from_option = tmp_path / "option.db"
    result = run_cli(
        "schedule",
        "add",
        "poll",
        "--every",
        "1m",
        "--command",
        "noop",
        db=from_option,
        env={"VORTOS_DB": str(from_env)},
    )
    assert result.code == 0, result.stderr
    assert not from_env.exists()
    assert show(from_option, "poll")["name"] == "poll"
