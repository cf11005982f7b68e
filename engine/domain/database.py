"""Where the data lives: a SQLite file path or a PostgreSQL URL (pure: no I/O)."""

from __future__ import annotations

import re
from pathlib import Path

from engine.domain.redact import redact_url, url_userinfo

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(db: str | Path | object) -> bool:
    """True for a PostgreSQL URL (postgresql://... or postgres://...); a Path never is one."""
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


# A database: a SQLite file's path, or a PostgreSQL URL (kept as text: a Path would fold its //).
Database = Path | str


def parse_database(text: str | Path) -> Database:
    """A --db value or setting: a URL stays text, anything else is a file path."""
    if isinstance(text, Path):
        return text
    value = text.strip()
    if not value:
        raise ValueError("an empty database: give a file path or a postgresql:// URL")
    if _KEYWORD_STRING.match(value):
        # Taken as a file name, it would put the password into every message naming the file.
        raise ValueError(
            f"a postgresql:// URL, not a libpq keyword string ({redact_url(value)}): write it "
            "as postgresql://user:password@host:port/database (for a file of that name, "
            "start it with ./)"
        )
    return unambiguous_url(value) if is_postgres_url(value) else Path(value)


# In a URL's user or password these end it early or split it: each driver then reads another
# host out of it, and quotes in its complaint the pieces it could not parse (password included).
_AMBIGUOUS_IN_USERINFO = "@#/?"


def unambiguous_url(url: str) -> str:
    """`url` (a database's or Redis server's), refused with ValueError when its host cannot be
    told from its password: an `@`, `#`, `/` or `?` not percent-encoded before the host. The
    message never holds the password (the caller shows the URL through redact_url)."""
    userinfo = url_userinfo(url)
    if userinfo is not None and any(c in userinfo for c in _AMBIGUOUS_IN_USERINFO):
        raise ValueError(
            "a URL whose user and password percent-encode @ as %40, : as %3A, # as %23, / as "
            "%2F and ? as %3F (in this one the host cannot be told from the password)"
        )
    return url


# A libpq keyword string (`host=db dbname=vortos password=...`): not a database Vortos takes.
_KEYWORD_STRING = re.compile(
    r"(host|hostaddr|port|dbname|user|password|passfile|sslmode|service)\s*=", re.IGNORECASE
)


def shown(db: Database) -> str:
    """The database for messages, tables, JSON and logs: a URL without its secrets
    (engine.domain.redact); a file's path as it is."""
    return str(db) if isinstance(db, Path) else redact_url(db)
