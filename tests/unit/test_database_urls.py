"""What a --db value names: a parsed Database knows its backend (engine.backends.registry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.registry import known_schemes, parse_database
from engine.domain.database import Database


@pytest.mark.parametrize(
    ("given", "path"),
    [
        ("vortos.db", "vortos.db"),
        ("/var/lib/vortos/vortos.db", "/var/lib/vortos/vortos.db"),
        ("./a:b.db", "a:b.db"),  # a colon in the first name: written ./ to be a file
        ("sqlite:relative/x.db", "relative/x.db"),
        ("sqlite:/abs/x.db", "/abs/x.db"),
        ("sqlite:///abs/x.db", "/abs/x.db"),  # an empty host: three slashes start the path
        ("SQLite:///abs/x.db", "/abs/x.db"),  # a scheme is case-insensitive
        ("sqlite:///abs/my%20file.db", "/abs/my file.db"),  # percent-escapes decoded
    ],
)
def test_a_path_or_a_sqlite_url_is_a_sqlite_file(given: str, path: str) -> None:
    db = parse_database(given)

    assert db.backend == "sqlite"
    assert db.is_file
    assert db.path == Path(path)
    assert db.shown == path


def test_a_path_object_is_a_sqlite_file_and_a_database_stays_as_it_is() -> None:
    db = parse_database(Path("/x/y.db"))

    assert db == Database("sqlite", "/x/y.db", Path("/x/y.db"))
    assert parse_database(db) is db


@pytest.mark.parametrize(
    "given", ["postgresql://app:secret@db.example.com/vortos", "postgres://db/vortos"]
)
def test_a_postgres_url_is_postgresql_and_never_shows_its_password(given: str) -> None:
    db = parse_database(given)

    assert db.backend == "postgresql"
    assert not db.is_file
    assert db.path is None
    assert db.location == given  # what the driver connects with
    assert "secret" not in db.shown
    assert "secret" not in repr(db)


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("sqlite://host/x.db", "without a host"),
        ("sqlite:", "naming a file"),
        ("sqlite:///x.db?mode=ro", "without a query or fragment"),
        ("sqlite:x.db#top", "without a query or fragment"),
    ],
)
def test_a_sqlite_url_that_names_no_local_file_is_refused(given: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_database(given)


@pytest.mark.parametrize(
    ("given", "scheme"),
    [("mysql://x/y", "mysql"), ("MySQL://u:secret@x/y", "mysql"), ("backup:2024.db", "backup")],
)
def test_an_unknown_scheme_is_refused_by_name_with_the_known_ones(given: str, scheme: str) -> None:
    with pytest.raises(ValueError, match="known backend") as refused:
        parse_database(given)

    message = str(refused.value)
    assert f"{scheme}: is none" in message
    for known in ("sqlite:", "postgresql:", "postgres:"):
        assert known in message
    assert "./" in message  # how to name a file whose name holds a colon
    assert "secret" not in message


def test_the_built_in_schemes_are_known() -> None:
    assert {"sqlite", "postgresql", "postgres"} <= set(known_schemes())
