"""Secrets never appear in output: a database or Redis password given in VORTOS_DB or
VORTOS_REDIS_URL is absent from every stream of every command that names them (config show as
a table and as JSON, doctor, db info, the errors of an unreachable server, `vortos run`'s log),
whatever characters it holds. Real processes, the real PostgreSQL (trust: any password is let in).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import PG_URL, fresh_schema, pg_env

ROOT = Path(__file__).resolve().parents[2]
# Percent-encoded in the URL (libpq needs `@` and `:` encoded); both forms must stay hidden.
PG_SECRET = "Pg@Se:cret-4471"
PG_SECRET_ENCODED = "Pg%40Se%3Acret-4471"
REDIS_SECRET = "Rds-Secret-5523"
REDIS_URL = f"redis://:{REDIS_SECRET}@127.0.0.1:6379/0"


def with_password(url: str, encoded: str = PG_SECRET_ENCODED) -> str:
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{encoded}@{host}"


def vortos(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    environment |= {"COLUMNS": "250", **env}
    return subprocess.run(
        [sys.executable, "-m", "vortos_tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=environment,
    )


def assert_hidden(result: subprocess.CompletedProcess[str], *secrets: str) -> None:
    said = result.stdout + result.stderr
    for secret in secrets:
        assert secret not in said, f"{secret!r} shown:\n{said}"


@pytest.fixture
def pg_with_password() -> Iterator[str]:
    with fresh_schema() as url:
        yield with_password(url)


def test_config_show_hides_passwords_in_the_table_and_in_json() -> None:
    """Finding 7: `config show --json` printed both passwords, and a password holding `@` was
    half shown (such a URL, `@` not encoded, is now refused: tests/cli/test_bad_input_more.py)."""
    env = {
        "VORTOS_DB": "postgresql://u:p%40ss%3Aw%40rd@db.example/v",
        "VORTOS_REDIS_URL": REDIS_URL,
    }
    table = vortos("config", "show", env=env)
    as_json = vortos("config", "show", "--json", env=env)
    assert table.returncode == 0, table.stderr
    assert as_json.returncode == 0, as_json.stderr
    for result in (table, as_json):
        assert_hidden(result, "p@ss", "p%40ss", "w%40rd", "w@rd", REDIS_SECRET)
    shown = json.loads(as_json.stdout)
    assert shown["db"] == {"value": "postgresql://u:***@db.example/v", "source": "VORTOS_DB"}
    assert shown["redis_url"]["value"] == "redis://:***@127.0.0.1:6379/0"
    assert "postgresql://u:***@db.example/v" in table.stdout


def test_a_refused_url_setting_is_named_without_its_password() -> None:
    result = vortos("config", "show", env={"VORTOS_REDIS_URL": f"http://:{REDIS_SECRET}@h/0"})
    assert result.returncode == 2
    assert "VORTOS_REDIS_URL" in result.stderr
    assert_hidden(result, REDIS_SECRET)


def test_doctor_json_and_table_never_show_the_password(pg_with_password: str) -> None:
    env = {"VORTOS_DB": pg_with_password, "VORTOS_REDIS_URL": REDIS_URL, **pg_env()}
    as_json = vortos("doctor", "--json", env=env)
    report = json.loads(as_json.stdout)
    assert {f["check_id"] for f in report["findings"]} >= {"storage.schema", "audit.key"}
    table = vortos("doctor", env=env)
    for result in (as_json, table):
        assert_hidden(result, PG_SECRET, PG_SECRET_ENCODED, REDIS_SECRET)


def test_db_info_never_shows_the_password(pg_with_password: str) -> None:
    env = {"VORTOS_DB": pg_with_password, **pg_env()}
    for args in (("db", "info"), ("db", "info", "--json"), ("db", "migrate")):
        result = vortos(*args, env=env)
        assert result.returncode == 0, result.stderr
        assert_hidden(result, PG_SECRET, PG_SECRET_ENCODED)


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        (with_password(PG_URL).replace("5432", "1"), (PG_SECRET, PG_SECRET_ENCODED)),
        # libpq reads this as password `p`, port `ss:w@rd@...`: and says so, quoting it.
        ("postgresql://postgres:p@ss:w@rd@127.0.0.1:1/test", ("p@ss", "w@rd", "ss:w")),
        ("postgresql://postgres:sec ret-9@127.0.0.1:1/test", ("sec ret-9", "ret-9")),
        ("postgresql://postgres@127.0.0.1:1/test?password=Qs-Secret-88", ("Qs-Secret-88",)),
    ],
)
def test_an_unreachable_or_malformed_server_is_reported_without_the_password(
    url: str, secrets: tuple[str, ...]
) -> None:
    for args in (("schedule", "list"), ("db", "info"), ("doctor", "--json")):
        result = vortos("--db", url, *args, env=pg_env())
        assert result.returncode != 0
        assert "error" in result.stderr or '"fail"' in result.stdout
        assert_hidden(result, *secrets)


def test_the_run_log_names_the_database_without_its_password(pg_with_password: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    env |= {"VORTOS_DB": pg_with_password, **pg_env()}
    server = subprocess.Popen(
        [sys.executable, "-m", "vortos_tui.cli", "run", "--no-consume"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert server.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(" on postgresql://" in s for s in lines):
            line = server.stdout.readline()
            if not line:
                break
            lines.append(line)
    finally:
        server.terminate()
        rest, _ = server.communicate(timeout=60)
    said = "".join(lines) + rest
    assert "on postgresql://postgres:***@127.0.0.1:5432/test" in said, said
    assert PG_SECRET not in said
    assert PG_SECRET_ENCODED not in said
