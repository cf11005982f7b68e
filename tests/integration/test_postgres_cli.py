"""The CLI on PostgreSQL: `vortos db migrate`, and a database URL that is wrong, unreachable, or
names a server without the schema gets one clear line naming the problem and the fix, exit 1,
and nothing is created (acceptance 5 of the many-machines issue)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engine.backends.postgres.connection import SCHEMA_VERSION
from tests.conftest import CliResult, cli_env, run_cli
from tests.integration.processes import Daemon, wait_for
from tests.pg import PG_AUDIT_KEY, PG_URL, fresh_schema, need_postgres

KEY = {"VORTOS_AUDIT_KEY": PG_AUDIT_KEY}


@pytest.fixture
def empty_schema() -> Iterator[str]:
    """A URL of a schema that exists but holds no Vortos tables."""
    with fresh_schema(migrated=False) as url:
        yield url


@pytest.fixture
def migrated() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def vortos(url: str, *args: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli("--db", url, *args, env=env)


def tables_in(url: str) -> list[str]:
    schema = url.rsplit("%3D", 1)[1]
    with psycopg.connect(PG_URL) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        ]


def assert_one_clear_line(result: CliResult, *needles: str) -> None:
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# --- db migrate -------------------------------------------------------------------------------


def test_migrate_creates_the_schema_and_then_says_it_is_current(empty_schema: str) -> None:
    created = vortos(empty_schema, "db", "migrate", env=KEY)
    assert created.code == 0, created.stderr
    assert f"created the Vortos schema (version {SCHEMA_VERSION})" in created.stderr
    assert {"schedules", "runs", "fire_queue", "leases", "audit_entries"} <= set(
        tables_in(empty_schema)
    )

    again = vortos(empty_schema, "db", "migrate", env=KEY)
    assert again.code == 0, again.stderr
    assert f"is current (version {SCHEMA_VERSION})" in again.stderr


def test_migrators_racing_on_a_new_schema_create_it_once(empty_schema: str) -> None:
    command = [sys.executable, "-m", "vortos_tui.cli", "--db", empty_schema, "db", "migrate"]
    racers = [
        subprocess.Popen(command, env=cli_env(KEY), stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    said = [racer.communicate(timeout=60)[1] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0, 0], said
    assert sum("created the Vortos schema" in s for s in said) == 1, said


def test_migrate_creates_the_shared_audit_key_file_named_in_the_settings(
    empty_schema: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "audit.key"
    result = vortos(empty_schema, "db", "migrate", env={"VORTOS_AUDIT_KEY_FILE": str(key_file)})
    assert result.code == 0, result.stderr
    assert key_file.exists()
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert "copy it to every node" in result.stderr

    added = vortos(
        empty_schema,
        "schedule",
        "add",
        "hourly",
        "--cron",
        "0 * * * *",
        "--command",
        "noop",
        env={"VORTOS_AUDIT_KEY_FILE": str(key_file)},
    )
    assert added.code == 0, added.stderr


def test_migrate_refuses_a_schema_holding_another_applications_tables(
    empty_schema: str,
) -> None:
    schema = empty_schema.rsplit("%3D", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.invoices (id int)")

    result = vortos(empty_schema, "db", "migrate")

    assert_one_clear_line(result, "invoices", "will not touch it")
    assert tables_in(empty_schema) == ["invoices"]


# --- a working database -------------------------------------------------------------------------


def test_schedules_are_added_listed_and_shown_on_postgres(migrated: str) -> None:
    added = vortos(
        migrated, "schedule", "add", "nightly", "--cron", "0 2 * * *", "--command", "noop", env=KEY
    )
    assert added.code == 0, added.stderr

    listed = vortos(migrated, "schedule", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert [s["name"] for s in json.loads(listed.stdout)] == ["nightly"]

    info = vortos(migrated, "db", "info", "--json")
    assert info.code == 0, info.stderr
    facts = json.loads(info.stdout)
    assert (facts["backend"], facts["schema_version"], facts["schedules"]) == (
        "postgres",
        SCHEMA_VERSION,
        1,
    )


def test_a_change_without_the_shared_audit_key_is_refused_naming_the_setting(
    migrated: str,
) -> None:
    result = vortos(
        migrated, "schedule", "add", "nightly", "--cron", "0 2 * * *", "--command", "noop"
    )

    assert result.code != 0
    assert "Traceback" not in result.stderr
    assert "audit_key_file" in result.stderr
    assert "same key" in result.stderr
    assert json.loads(vortos(migrated, "schedule", "list", "--json").stdout) == []


# --- bad URLs -----------------------------------------------------------------------------------


def test_a_server_without_the_schema_names_vortos_db_migrate(empty_schema: str) -> None:
    for args in (("schedule", "list"), ("run",), ("db", "info")):
        result = vortos(empty_schema, *args, env=KEY)
        assert_one_clear_line(result, "no Vortos schema", "vortos --db URL db migrate")
    assert tables_in(empty_schema) == []


def test_an_unreachable_server_is_named_with_what_to_check() -> None:
    need_postgres()
    result = vortos("postgresql://postgres@127.0.0.1:1/test", "schedule", "list")
    assert_one_clear_line(result, "127.0.0.1:1", "Connection refused", "server is running")


def test_a_database_that_does_not_exist_is_named() -> None:
    need_postgres()
    result = vortos("postgresql://postgres@127.0.0.1:5432/no_such_db", "schedule", "list")
    assert_one_clear_line(result, 'database "no_such_db" does not exist', "createdb")


def test_an_unknown_role_is_named() -> None:
    need_postgres()
    result = vortos("postgresql://nobody_here@127.0.0.1:5432/test", "schedule", "list")
    assert_one_clear_line(result, 'role "nobody_here" does not exist', "fix the user")


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql://127.0.0.1:port/test", "invalid PostgreSQL URL"),
        ("postgresql://127.0.0.1:5432", "names no database"),
        ("postgresql://[::1/test", "invalid PostgreSQL URL"),
    ],
)
def test_a_malformed_url_is_refused_with_its_form(url: str, needle: str) -> None:
    need_postgres()
    result = vortos(url, "schedule", "list")
    assert_one_clear_line(result, needle)


def test_the_form_survives_the_password_mask() -> None:
    """The form shown beside a malformed URL with a password is whole (the mask read the
    form's own `user[:password]@` as a password: `user[:***@host`)."""
    need_postgres()
    result = vortos("postgresql://postgres:pw@127.0.0.1:99999/test", "schedule", "list")
    assert_one_clear_line(result, "Port out of range", "postgresql://user@host:5432/database")
    assert "[:***" not in result.stderr


def test_a_bad_option_in_the_url_is_named_not_the_host_or_port() -> None:
    need_postgres()
    result = vortos("postgresql://postgres@127.0.0.1:5432/test?sslmode=bogus", "schedule", "list")
    assert_one_clear_line(result, 'invalid sslmode value: "bogus"', "fix that option in the URL")
    assert "host and port" not in result.stderr


def test_a_password_in_the_url_is_never_printed() -> None:
    need_postgres()
    result = vortos("postgresql://postgres:hunter2@127.0.0.1:1/test", "schedule", "list")
    assert result.code == 1
    assert "hunter2" not in result.stderr
    assert "postgres:***@127.0.0.1:1" in result.stderr


def test_an_old_schema_version_names_vortos_db_migrate(migrated: str) -> None:
    schema = migrated.rsplit("%3D", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.vortos_meta SET value = '0' WHERE key = 'schema_version'")

    result = vortos(migrated, "schedule", "list")

    assert_one_clear_line(result, "version 0", "vortos --db URL db migrate")


def test_nodes_starting_at_once_on_a_new_schema_all_run(migrated: str, tmp_path: Path) -> None:
    """Each `vortos run` syncs the built-in static schedules at start; three starting at the
    same instant must not trip over each other's (one creates, the others find it)."""
    nodes = [Daemon(migrated, f"n{i}", tmp_path, env=KEY) for i in range(3)]
    try:
        wait_for(
            lambda: all("vortos n" in n.log and " on postgresql://" in n.log for n in nodes),
            30,
            "every node to start",
        )
        assert all(n.process.poll() is None for n in nodes), [n.log for n in nodes]
    finally:
        codes = [n.terminate() for n in nodes]
    assert codes == [0, 0, 0], [n.log for n in nodes]
