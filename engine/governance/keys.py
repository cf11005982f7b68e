"""Where the audit key comes from: never the database.

In order: VORTOS_AUDIT_KEY (one or more keys, separated by commas; the last signs), the file
named by VORTOS_AUDIT_KEY_FILE (or given by the caller), else `<database>.audit-key` beside the
database, created (mode 0600, a random key) the first time a database needs one. A file holds
one key per line (blank lines and `#` comments ignored); the last line signs, earlier ones still
verify, so rotating is appending a line (`vortos audit rotate-key`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from engine.domain.audit import KeyRing
from engine.domain.database import is_postgres_url
from engine.domain.errors import AuditKeyMissing, InvalidInput
from engine.file_modes import OWNER_ONLY, create_private, tighten

KEY_ENV = "VORTOS_AUDIT_KEY"
KEY_FILE_ENV = "VORTOS_AUDIT_KEY_FILE"
MIN_KEY_CHARS = 32


NO_SHARED_KEY = (
    "a PostgreSQL deployment has no default audit key file: every node signs the audit chain, "
    "so every node must hold the same key. Set audit_key_file (vortos.toml, "
    f"{KEY_FILE_ENV} or --audit-key-file of `vortos db migrate`, which creates the file) "
    f"and copy that file to every node, or set {KEY_ENV}"
)


def default_key_file(db: Path | str) -> Path:
    """Beside a SQLite file; a PostgreSQL URL has none (AuditKeyMissing says what to do)."""
    if is_postgres_url(db):
        raise AuditKeyMissing(NO_SHARED_KEY)
    db = Path(db)
    return db.with_name(db.name + ".audit-key")


def _parse(text: str, where: str) -> KeyRing:
    keys = []
    for number, raw in enumerate(text.replace(",", "\n").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < MIN_KEY_CHARS:
            raise InvalidInput(
                f"audit key {number} in {where} is {len(line)} characters: use at least "
                f"{MIN_KEY_CHARS} (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
            )
        keys.append(line.encode())
    if not keys:
        raise InvalidInput(f"{where} holds no audit key")
    return KeyRing(keys)


def key_source(db: Path | str, key_file: Path | None = None) -> tuple[str, Path | None]:
    """(description, file) of where the key is taken from; file None for the environment."""
    if os.environ.get(KEY_ENV):
        return f"${KEY_ENV}", None
    named = os.environ.get(KEY_FILE_ENV)
    chosen = key_file or (Path(named) if named else None)
    if chosen is not None:
        return str(chosen), chosen
    path = default_key_file(db)
    return str(path), path


def load_keyring(db: Path | str, *, key_file: Path | None = None, create: bool) -> KeyRing:
    """The key ring for the database at `db`. With `create`, a missing default key file is
    made; a missing file that was named explicitly is always an error."""
    env = os.environ.get(KEY_ENV)
    if env:
        return _parse(env, f"${KEY_ENV}")
    where, path = key_source(db, key_file)
    assert path is not None
    explicit = key_file is not None or bool(os.environ.get(KEY_FILE_ENV))
    if not path.exists():
        if explicit or not create:
            raise AuditKeyMissing(
                f"the audit key file {path} does not exist: restore it from your backup (the "
                "audit chain can be neither extended nor verified without it), or point "
                f"{KEY_FILE_ENV} at it"
            )
        return create_key_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuditKeyMissing(f"the audit key file {where} cannot be read: {exc}") from None
    return _parse(text, where)


def load_postgres_keyring(key_file: Path | None) -> KeyRing:
    """The shared key ring of a PostgreSQL deployment: from the environment or a named file,
    never made up here (a node with a key of its own would sign a chain nobody can verify)."""
    return load_keyring("postgresql://", key_file=key_file, create=False)


def create_key_file(path: Path) -> KeyRing:
    """A new random key at `path` (mode 0600). Written aside and linked into place, so a
    process starting at the same moment reads either no file or the whole key, and the first
    one to link wins."""
    key = secrets.token_hex(32)
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = create_private(aside)  # 0600 exactly, whatever the umask; never via a symlink
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(
                "# Vortos audit key: signs this database's audit chain. Keep it (and a backup)\n"
                "# away from the database; without it the chain can be neither extended nor\n"
                "# verified. The last line signs; earlier lines still verify old entries.\n"
            )
            handle.write(key + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(aside, path)
    except OSError as exc:
        raise AuditKeyMissing(f"cannot create the audit key file {path}: {exc}") from None
    finally:
        aside.unlink(missing_ok=True)
    return _parse(path.read_text(encoding="utf-8"), str(path))


def rotate_key_file(path: Path) -> str:
    """Append a new key (the new signing key); return its id."""
    if not path.exists():
        raise AuditKeyMissing(f"the audit key file {path} does not exist: nothing to rotate")
    key = secrets.token_hex(32)
    try:
        tighten(path, OWNER_ONLY)  # a key file copied in looser is made the owner's first
    except PermissionError as exc:
        raise AuditKeyMissing(f"cannot make the audit key file {path} private: {exc}") from None
    with path.open("a", encoding="utf-8") as handle:
        handle.write(key + "\n")
    return KeyRing([key.encode()]).active_id
