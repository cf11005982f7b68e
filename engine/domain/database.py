"""Where the data lives: a SQLite file path or a PostgreSQL URL (pure: no I/O)."""

from __future__ import annotations

from pathlib import Path

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
    return value if is_postgres_url(value) else Path(value)


def shown(db: Database) -> str:
    """The database for messages: a URL without its password."""
    if isinstance(db, Path):
        return str(db)
    import re  # noqa: PLC0415 - only URLs need it

    return re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", db)
