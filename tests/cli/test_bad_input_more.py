"""Careless input found by attack (issue 15): each is refused with exit 2 and one line saying
what is wrong and what to do, no traceback, and nothing stored is created or changed."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.cli.support import assert_clean_error, db_state
from tests.conftest import CliResult, run_cli

# Passwords whose `@`, `#`, `/` or `?` is not percent-encoded: a driver reads a piece of one
# as the host or port and quotes it (`failed to resolve host 'Xk'`). Pieces of two letters
# that occur in no message, so a leak of any of them shows.
AMBIGUOUS_URLS = [
    pytest.param("postgresql://app:Qz@Xk:J9w@127.0.0.1:5432/test", id="two-at"),
    pytest.param("postgresql://app:Qz#Jx@127.0.0.1/test", id="hash-before-host"),
    pytest.param("postgresql://app:Qz/Jx?Vk@127.0.0.1/test", id="slash-and-question"),
]
REDIS_URL = "redis://user:Qz#Jx@127.0.0.1:6379/0"


def password_pieces(url: str) -> list[str]:
    password = url.split("://", 1)[1].split(":", 1)[1].rsplit("@", 1)[0]
    return [piece for piece in re.split(r"[@:#/?]", password) if len(piece) >= 2]


def assert_refused_unshown(result: CliResult, url: str, *words: str) -> None:
    assert_clean_error(result, 2, "percent-encode @ as %40", *words)
    for piece in password_pieces(url):
        assert piece not in result.stdout + result.stderr, (piece, result.stderr)


@pytest.mark.parametrize("url", AMBIGUOUS_URLS)
def test_an_ambiguous_database_url_is_refused_without_any_piece_of_its_password(url: str) -> None:
    """The promise: secrets never appear in errors, not even the pieces a driver quotes."""
    ways: list[tuple[list[str], dict[str, str], str]] = [
        (["schedule", "list"], {"VORTOS_DB": url}, "VORTOS_DB="),
        (["--db", url, "schedule", "list"], {}, "--db="),
        (["--db", url, "db", "init"], {}, "--db="),
        (["tui", "--db", url], {}, "--db "),
    ]
    for args, env, source in ways:
        result = run_cli(*args, env={"VORTOS_CONFIG": "", **env})
        assert_refused_unshown(result, url, source)
        assert "app:***@" in result.stderr, "the URL is still named, without its password"


def test_an_ambiguous_redis_url_is_refused_before_the_database_is_opened(tmp_path: Path) -> None:
    db = tmp_path / "vortos.db"
    run = ("run", "--lease-driver", "redis")
    for args, env in (
        ((*run, "--redis-url", REDIS_URL), {}),
        (run, {"VORTOS_REDIS_URL": REDIS_URL}),
    ):
        result = run_cli(*args, db=db, env=env, timeout=30)
        assert_refused_unshown(result, REDIS_URL, "redis_url must be")
        assert not db.exists()


def test_a_libpq_keyword_string_given_as_db_flag_is_refused_as_its_variable_is(
    tmp_path: Path,
) -> None:
    """--db skipped the setting's check: a keyword string was taken as a file name."""
    result = run_cli("--db", "host=db password=Qz9Jx", "schedule", "list")
    line = assert_clean_error(result, 2, "not a libpq keyword string")
    assert "Qz9Jx" not in line


ADD_OK = ("--every", "1m", "--command", "noop")


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param('{"a": "\\ud800"}', ('payload["a"]', "lone surrogate"), id="lone-surrogate"),
        pytest.param('{"a": [{"b\\udc00": 1}]}', ("a key of", "lone surrogate"), id="in-a-key"),
        pytest.param(
            '{"a": ' + "[" * 5000 + "]" * 5000 + "}", ("more than 64 levels",), id="5000-deep"
        ),
        pytest.param('{"a": ' + "[" * 64 + "]" * 64 + "}", ("more than 64 levels",), id="65-deep"),
        pytest.param('{"to": "a", "to": "b"}', ('the key "to" twice',), id="duplicate-key"),
    ],
)
def test_a_payload_that_cannot_be_stored_or_says_two_things_is_refused_unchanged(
    seeded_db: Path, payload: str, words: tuple[str, ...]
) -> None:
    """Careless payloads were an unexpected UnicodeEncodeError or RecursionError ("a bug"), or a
    repeated key silently took its last value."""
    before = db_state(seeded_db)
    for args in (
        ("schedule", "add", "fresh-job", *ADD_OK, "--payload", payload),
        ("schedule", "edit", "nightly-report", "--payload", payload),
    ):
        result = run_cli(*args, db=seeded_db)
        assert_clean_error(result, 2, *words)
    assert db_state(seeded_db) == before


def test_a_payload_64_levels_deep_is_taken(seeded_db: Path) -> None:
    result = run_cli(
        "schedule",
        "add",
        "deep",
        *ADD_OK,
        "--payload",
        '{"a": ' + "[" * 63 + "]" * 63 + "}",
        db=seeded_db,
    )
    assert result.code == 0, result.stderr


def test_metadata_that_is_not_utf8_is_refused_unchanged(seeded_db: Path) -> None:
    """An argument of bytes that are not UTF-8 reaches Python as lone surrogates."""
    before = db_state(seeded_db)
    value = os.fsdecode(b"k=\xff")
    result = run_cli("schedule", "add", "fresh-job", *ADD_OK, "--meta", value, db=seeded_db)
    assert_clean_error(result, 2, "metadata value of 'k' must be UTF-8 text")
    assert db_state(seeded_db) == before


@pytest.mark.parametrize("command", [("db", "init"), ("db", "migrate")])
def test_db_init_through_a_control_socket_is_refused_and_creates_nothing(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """It said "this is a bug of vortos": the schema is written by the service account
    itself, never through the socket."""
    db = tmp_path / "vortos.db"
    socket = str(tmp_path / "control.sock")
    for args, env in (
        (command, {"VORTOS_CONTROL_SOCKET": socket}),
        (("--control-socket", socket, *command), {}),
    ):
        result = run_cli(*args, db=db, env=env)
        assert_clean_error(result, 2, f"{' '.join(command)} is the service account's", "without")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [
        pytest.param("-1", "process timeout -1 is out of range", id="negative"),
        pytest.param("0.0001", "process timeout 0.0001 is out of range", id="rounds-to-0"),
    ],
)
def test_a_process_timeout_out_of_range_is_shown_as_given(
    seeded_db: Path, timeout: str, shown: str
) -> None:
    """-1 was reported as "1s", a value the user never gave."""
    before = db_state(seeded_db)
    payload = '{"argv": ["/bin/true"], "timeout": ' + timeout + "}"
    result = run_cli(
        "--allow-exec", "/bin/true", "schedule", "add", "proc", "--every", "1m",
        "--command", "process", "--payload", payload, db=seeded_db,
    )  # fmt: skip
    assert_clean_error(result, 2, shown, "at most 7d")
    assert db_state(seeded_db) == before


def test_audit_verify_of_a_directory_says_it_is_a_directory(seeded_db: Path) -> None:
    result = run_cli("audit", "verify", "--file", str(seeded_db.parent), db=seeded_db)
    assert_clean_error(result, 2, "is a directory", "audit export -o")


def test_audit_verify_of_an_empty_export_claims_nothing(seeded_db: Path) -> None:
    """The promise: verify never reports success for what it did not check (it exited 0)."""
    empty = seeded_db.with_name("empty.jsonl")
    empty.write_text("\n")
    for extra in ((), ("--json",)):
        result = run_cli("audit", "verify", "--file", str(empty), *extra, db=seeded_db)
        assert_clean_error(result, 2, f"{empty} holds no audit entries: nothing was verified")
