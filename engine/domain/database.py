"""Where the data lives: a parsed `--db` value, which knows its backend (pure: no I/O).

Which backends exist, and so which URL schemes a `--db` value may use, is the registry's
(engine.backends.registry: `parse_database` there makes a Database from text). Here is the
value itself and the spelling rules every backend shares.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from engine.domain.redact import redact_url, url_userinfo

SQLITE = "sqlite"  # the built-in backend on a file
POSTGRESQL = "postgresql"  # the built-in backend on a server
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# What plug-ins are given as `PluginContext.db`: the file's Path, or the URL as text.
PlainDatabase = Path | str


@dataclass(frozen=True, slots=True)
class Database:
    """A database: the backend that opens it and where it is.

    `backend` is the registered backend's name ("sqlite", "postgresql", or a plug-in's URL
    scheme). `location` is the file's path or the URL as given (the URL with its password:
    show it through `shown`); `path` is the file of a file backend (SQLite), None for one
    reached through a URL."""

    backend: str
    location: str
    path: Path | None = None

    @classmethod
    def file(cls, path: Path, location: str | None = None) -> Database:
        """The SQLite file at `path` (`location`: how it was written, by default the path)."""
        return cls(SQLITE, str(path) if location is None else location, path)

    @property
    def is_file(self) -> bool:
        """A file on this host (SQLite): key files, anchors and archives go beside it."""
        return self.path is not None

    @property
    def shown(self) -> str:
        """For messages, tables, JSON and logs: a URL without its secrets, a file's path."""
        return str(self.path) if self.path is not None else redact_url(self.location)

    @property
    def plain(self) -> PlainDatabase:
        """The file's Path, or the URL as text (PluginContext.db)."""
        return self.path if self.path is not None else self.location

    def __str__(self) -> str:
        return self.location

    def __repr__(self) -> str:
        return f"Database({self.backend!r}, {self.shown!r})"  # never the password


def plain_database(db: Database | PlainDatabase) -> PlainDatabase:
    """`db` as plug-ins are given it: a file's Path, or the URL as text."""
    return db.plain if isinstance(db, Database) else db


def shown(db: Database | PlainDatabase) -> str:
    """The database for messages, tables, JSON and logs: a URL without its secrets
    (engine.domain.redact); a file's path as it is."""
    if isinstance(db, Database):
        return db.shown
    return str(db) if isinstance(db, Path) else redact_url(db)


def is_postgres_url(db: str | Path | object) -> bool:
    """True for a PostgreSQL database, or a postgresql:// or postgres:// URL given as text.
    The engine asks a Database for its `backend` instead; bench/postgres.py still asks this."""
    if isinstance(db, Database):
        return db.backend == POSTGRESQL
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


# RFC 3986: a scheme is a letter, then letters, digits, `+`, `-` or `.`, ended by a colon.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def url_scheme(text: str) -> str | None:
    """The scheme of `text` in lower case, None for a plain path (no `scheme:` at its start).
    A file whose first name holds a colon (`a:b.db`) reads as a URL: write `./a:b.db`."""
    found = _SCHEME.match(text)
    return found.group(1).lower() if found else None


def sqlite_file(url: str) -> Path:
    """The file a `sqlite:` URL names: `sqlite:relative/path.db` (from the working
    directory), `sqlite:/abs/path.db` or `sqlite:///abs/path.db` (an empty host: a file has
    none), percent-escapes decoded. ValueError for a host, a query, a fragment or no path."""
    rest = url[len("sqlite:") :]
    if "?" in rest or "#" in rest:
        raise ValueError(
            "a sqlite: URL without a query or fragment (for a file whose name holds ? or #, "
            "give its path, not a URL)"
        )
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host:
            raise ValueError(
                "a sqlite: URL without a host (a SQLite file is on this one): "
                "sqlite:///abs/path.db or sqlite:relative/path.db"
            )
        rest = slash + path
    if not rest:
        raise ValueError("a sqlite: URL naming a file: sqlite:///abs/path.db or sqlite:file.db")
    return Path(unquote(rest))


def refuse_keyword_string(value: str) -> None:
    """ValueError for a libpq keyword string (`host=db dbname=vortos password=...`): taken as
    a file name, it would put the password into every message naming the file."""
    if _KEYWORD_STRING.match(value):
        raise ValueError(
            f"a postgresql:// URL, not a libpq keyword string ({redact_url(value)}): write it "
            "as postgresql://user:password@host:port/database (for a file of that name, "
            "start it with ./)"
        )


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


# The registry's parser: engine.backends.registry hands it over when it is imported (as any
# `import engine...` does), so the domain imports nothing above it.
_parse: Callable[[str | Path | Database], Database] | None = None


def use_parser(parse: Callable[[str | Path | Database], Database]) -> None:
    """Make `parse_database` here the registry's (engine.backends.registry calls this)."""
    global _parse  # noqa: PLW0603 - the one hand-over, at the registry's import
    _parse = parse


def parse_database(text: str | Path | Database) -> Database:
    """engine.backends.registry.parse_database, callable from here while
    vortos_tui/console/main.py and vortos_tui/cli/workers.py import it from this module."""
    if _parse is None:
        raise RuntimeError("engine.backends.registry is not imported: import engine first")
    return _parse(text)
