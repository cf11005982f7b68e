"""Backends by URL scheme: which Storage (and console read model) a database opens.

A `--db` value (or VORTOS_DB, or vortos.toml's `db`, or `open_engine`'s first argument) is
parsed once into a Database, which knows its backend; nothing else looks at its spelling.

- A plain path (`vortos.db`, `/var/lib/vortos/vortos.db`, `./a:b.db`): a SQLite file.
- `sqlite:` URLs name a SQLite file too: `sqlite:relative/path.db` is relative to the working
  directory, `sqlite:/abs/path.db` and `sqlite:///abs/path.db` (an empty host) are absolute;
  percent-escapes are decoded, and a host, a query or a fragment is refused. (Unlike
  SQLAlchemy's, three slashes start an absolute path: `sqlite:///x.db` is `/x.db`.)
- `postgresql://...` and `postgres://...`: PostgreSQL.
- Any other scheme: the backend registered for it, in this process with `register_backend`,
  or by an installed package as an entry point of the group `vortos.backends` named by the
  scheme (`[project.entry-points."vortos.backends"] toy = "mypkg.store:open_toy"`), whose
  object is a StorageFactory or a Backend. A scheme nobody registered is refused, by name,
  with the known ones, before anything is created: a value whose first name holds a colon
  reads as a URL, so a file of that name is written `./a:b.db`.

A factory is given an Opening and returns the opened Storage (engine.ports.storage); the
shipped suites in engine.testing.conformance say what it must guarantee.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, cast

from engine.domain.clock import Clock, SystemClock
from engine.domain.database import (
    POSTGRESQL,
    SQLITE,
    Database,
    refuse_keyword_string,
    shown,
    sqlite_file,
    unambiguous_url,
    url_scheme,
    use_parser,
)
from engine.domain.errors import InvalidInput, StorageError

if TYPE_CHECKING:
    from engine.domain.audit import KeyRing
    from engine.ports.read_model import ReadModel, Viewer
    from engine.ports.storage import Storage

BACKEND_GROUP = "vortos.backends"

KeySource = Callable[[], "KeyRing"]


@dataclass(frozen=True, slots=True)
class Opening:
    """What a backend's factory is given. `clock` None: the backend's own (the system clock;
    on PostgreSQL the server's). `audit_keys` (None when read-only) is asked for the key ring
    the first time an entry is signed or checked. `busy_timeout_ms`: how long a write waits
    for another process's transaction (None: the backend's default; a backend without such a
    wait ignores it)."""

    database: Database
    clock: Clock | None = None
    create: bool = True
    readonly: bool = False
    busy_timeout_ms: int | None = None
    audit_keys: KeySource | None = None


StorageFactory = Callable[[Opening], "Storage"]
ReadModelFactory = Callable[[Database, "Viewer | None"], "ReadModel"]


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend as the registry knows it: its name (a Database's `backend`), how it opens a
    Storage, and (optionally) the console's read model on it."""

    name: str
    open: StorageFactory
    read_model: ReadModelFactory | None = None


def _open_sqlite(opening: Opening) -> Storage:
    # Imported when opened: parsing a --db value loads no driver.
    from engine.backends.sqlite import SqliteBackend  # noqa: PLC0415
    from engine.backends.sqlite.connection import BUSY_TIMEOUT_MS  # noqa: PLC0415

    assert opening.database.path is not None
    return SqliteBackend(
        opening.database.path,
        opening.clock or SystemClock(),
        create=opening.create,
        readonly=opening.readonly,
        busy_timeout_ms=opening.busy_timeout_ms or BUSY_TIMEOUT_MS,
        audit_keys=opening.audit_keys,
    )


def _sqlite_read_model(database: Database, viewer: Viewer | None) -> ReadModel:
    from engine.backends.sqlite.connection import inspect_path  # noqa: PLC0415
    from engine.backends.sqlite.read_model import SqliteReadModel  # noqa: PLC0415

    assert database.path is not None
    inspect_path(database.path, create=False)
    return SqliteReadModel(database.path, viewer)


def _open_postgres(opening: Opening) -> Storage:
    # The schema is never created here (`vortos db migrate` does): `create` has no say.
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - the postgres extra

    return PostgresBackend(
        opening.database.location,
        opening.clock,  # None: the database server's clock
        readonly=opening.readonly,
        audit_keys=opening.audit_keys,
    )


def _postgres_read_model(database: Database, viewer: Viewer | None) -> ReadModel:
    from engine.backends.postgres.read_model import PostgresReadModel  # noqa: PLC0415

    return PostgresReadModel(database.location, viewer)


SQLITE_BACKEND = Backend(SQLITE, _open_sqlite, _sqlite_read_model)
POSTGRES_BACKEND = Backend(POSTGRESQL, _open_postgres, _postgres_read_model)
BUILT_IN: dict[str, Backend] = {
    "sqlite": SQLITE_BACKEND,
    "postgresql": POSTGRES_BACKEND,
    "postgres": POSTGRES_BACKEND,
}
_registered: dict[str, Backend] = {}


def register_backend(
    scheme: str, factory: StorageFactory, *, read_model: ReadModelFactory | None = None
) -> None:
    """Open `scheme:` URLs in this process with `factory` (and the console's reads with
    `read_model`). ValueError for a scheme that is not one, or one built in."""
    name = scheme.lower()
    if url_scheme(f"{name}:") != name or len(name) < 2:
        raise ValueError(f"{scheme!r} is not a URL scheme (a letter, then letters, digits, +-.)")
    if name in BUILT_IN:
        raise ValueError(f"{name}: is built in and cannot be registered again")
    _registered[name] = Backend(name, factory, read_model)


def unregister_backend(scheme: str) -> None:
    """Forget what `register_backend(scheme, ...)` registered (nothing if it did not)."""
    _registered.pop(scheme.lower(), None)


def known_schemes() -> list[str]:
    """Every scheme a database URL may use here: built in, registered, installed."""
    installed = {ep.name.lower() for ep in entry_points(group=BACKEND_GROUP)}
    return sorted({*BUILT_IN, *_registered, *installed})


def backend_for(scheme: str) -> Backend | None:
    """The backend of `scheme` (lower case): built in, registered, else an installed entry
    point (imported now); None when nobody provides one."""
    found = BUILT_IN.get(scheme) or _registered.get(scheme)
    if found is not None:
        return found
    matches = [ep for ep in entry_points(group=BACKEND_GROUP) if ep.name.lower() == scheme]
    if not matches:
        return None
    if len(matches) > 1:
        raise InvalidInput(
            f"several installed packages provide the {scheme}: backend "
            f"({', '.join(_dist(ep.dist) for ep in matches)}); uninstall one"
        )
    try:
        loaded = matches[0].load()
    except Exception as exc:
        raise InvalidInput(
            f"the {scheme}: backend {matches[0].value} failed to import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(loaded, Backend):
        return loaded
    if not callable(loaded):
        raise InvalidInput(f"the {scheme}: backend {matches[0].value} is not a factory")
    return Backend(scheme, cast("StorageFactory", loaded))


def _dist(dist: object) -> str:
    name = getattr(dist, "name", None)
    return "an unknown distribution" if name is None else f"{name} {getattr(dist, 'version', '')}"


NAME_MAX = 255  # bytes in one file name (Linux and macOS file systems)


def parse_database(text: str | Path | Database) -> Database:
    """A --db value or setting as a Database (see the module's docstring). ValueError, saying
    what is allowed and never showing a password, for one that names no known backend."""
    if isinstance(text, Database):
        return text
    if not isinstance(text, str | Path):
        raise TypeError(f"a file path or a URL, not {type(text).__name__}")
    value = str(text) if isinstance(text, Path) else text.strip()
    if not value:
        raise ValueError("a file path or a postgresql:// URL, not an empty value")
    if "\x00" in value:
        raise ValueError("a file path or a URL without a NUL character")
    if isinstance(text, Path):
        return _checked_file(Database.file(text))
    refuse_keyword_string(value)
    scheme = url_scheme(value)
    if scheme is None:
        return _checked_file(Database.file(Path(value)))
    if scheme == SQLITE:
        return _checked_file(Database.file(sqlite_file(value), value))
    try:
        backend = backend_for(scheme)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if backend is None:
        known = ", ".join(f"{s}:" for s in known_schemes())
        raise ValueError(
            f"a file path or a URL of a known backend ({scheme}: is none; known schemes: "
            f"{known}; a file whose name holds a colon is written ./name)"
        )
    if backend is POSTGRES_BACKEND:
        return Database(POSTGRESQL, unambiguous_url(value))
    return Database(backend.name, value)


use_parser(parse_database)


def _checked_file(database: Database) -> Database:
    """A SQLite database that is a file Vortos can name: not SQLite's in-memory one (each
    connection would see another, empty database), no NUL, each name within the system's
    limit."""
    path = database.path
    assert path is not None
    if str(path) == ":memory:":
        raise ValueError(
            "a file: ':memory:' is SQLite's in-memory database, which every connection sees "
            "empty (for a file of that name, write ./:memory:)"
        )
    if "\x00" in str(path):
        raise ValueError("a file path without a NUL character")
    if any(len(part.encode()) > NAME_MAX for part in path.parts):
        raise ValueError(f"a file path whose every name is at most {NAME_MAX} bytes")
    return database


def database_of(db: str | Path | Database) -> Database:
    """`db` parsed, InvalidInput (exit 2 in the CLI) when it names no known backend."""
    try:
        return parse_database(db)
    except (ValueError, TypeError) as exc:
        named = shown(db) if isinstance(db, str | Path) else type(db).__name__
        raise InvalidInput(f"database {named!r} is refused: it must be {exc}") from None


def backend_of(database: Database) -> Backend:
    """The backend that opens `database` (parsed here, so it has one)."""
    scheme = SQLITE if database.is_file else url_scheme(database.location)
    found = None if scheme is None else backend_for(scheme)
    if found is None:  # unregistered since it was parsed
        raise InvalidInput(f"no backend is registered for {database.shown}")
    return found


def open_storage(opening: Opening) -> Storage:
    """The Storage `opening.database`'s backend opens."""
    return backend_of(opening.database).open(opening)


def open_read_model(database: Database, viewer: Viewer | None = None) -> ReadModel:
    """The console's read model on `database`; StorageError for a backend without one."""
    backend = backend_of(database)
    if backend.read_model is None:
        raise StorageError(
            f"the console cannot read {database.shown}: its backend ({backend.name}) has no "
            "read model"
        )
    return backend.read_model(database, viewer)
