"""Where the audit key comes from: never the database.

In order: VORTOS_AUDIT_KEY (lines separated by commas), the file named by VORTOS_AUDIT_KEY_FILE
(or given by the caller), else `<database>.audit-key` beside the database, created (mode 0600,
a random key) the first time a database needs one. Blank lines and `#` comments are ignored;
the other lines are:

- `KEY` or `epoch N KEY`: a secret key; the last one signs (at epoch N, or 0), earlier ones
  (from before epochs) only verify the entries they signed;
- `root HEX`: the database's root public key, what verification trusts when the key has moved
  on from epoch 0 (written with the first key);
- `next N KEY`: a rotation under way (`vortos audit rotate-key`): the key of epoch N, taken
  once the database has recorded the rotation, so a crash between the two loses nothing.

When the database seals an epoch or records a rotation, the file is rewritten (atomically)
with the new key only: the old secret is gone from it, so a copy of the file taken later
cannot sign anything of a sealed epoch.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from engine.backends.registry import database_of
from engine.domain.audit import KeyRing
from engine.domain.audit_keys import EpochKey
from engine.domain.database import Database
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


def default_key_file(db: Database | Path | str) -> Path:
    """Beside a SQLite file; a database on a server has none (AuditKeyMissing says what to
    do)."""
    path = database_of(db).path
    if path is None:
        raise AuditKeyMissing(NO_SHARED_KEY)
    return path.with_name(path.name + ".audit-key")


def _parse(text: str, where: str, store: Callable[[KeyRing], None] | None = None) -> KeyRing:
    keys: list[bytes] = []
    epoch = 0
    root: str | None = None
    pending: EpochKey | None = None
    for number, raw in enumerate(text.replace(",", "\n").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0] == "root" and len(words) == 2:
            root = _public_hex(words[1], number, where)
            continue
        if words[0] in ("epoch", "next") and len(words) == 3 and words[1].isdigit():
            key = _secret(words[2], number, where)
            if words[0] == "next":
                pending = EpochKey(int(words[1]), key)
            else:
                keys.append(key)
                epoch = int(words[1])
            continue
        if len(words) != 1:
            raise InvalidInput(
                f"line {number} of {where} is not an audit key line: write KEY, `epoch N KEY`, "
                "`root HEX` or `next N KEY`"
            )
        keys.append(_secret(line, number, where))
        epoch = 0
    if not keys:
        raise InvalidInput(f"{where} holds no audit key")
    return KeyRing(keys, epoch=epoch, root_public_key=root, store=store, pending=pending)


def _secret(text: str, number: int, where: str) -> bytes:
    if len(text) < MIN_KEY_CHARS:
        raise InvalidInput(
            f"audit key {number} in {where} is {len(text)} characters: use at least "
            f"{MIN_KEY_CHARS} (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return text.encode()


def _public_hex(text: str, number: int, where: str) -> str:
    if len(text) != 64 or not all(c in "0123456789abcdef" for c in text):
        raise InvalidInput(f"line {number} of {where}: a root public key is 64 hex digits")
    return text


def key_text(ring: KeyRing) -> str:
    """A key file holding `ring`'s current key only (and the root public key)."""
    lines = [HEADER]
    if ring.root_public_key is not None:
        lines.append(f"root {ring.root_public_key}\n")
    lines.append(f"epoch {ring.epoch} {ring.current.secret.decode()}\n")
    if ring.pending is not None:
        lines.append(f"next {ring.pending.epoch} {ring.pending.secret.decode()}\n")
    return "".join(lines)


def write_key_file(path: Path, text: str) -> None:
    """Replace the key file atomically (mode 0600): a reader sees the old file or the new
    one, never a part; the old secret is gone from the file once this returns."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = create_private(aside)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(aside, path)
        _sync_directory(path.parent)
    except OSError as exc:
        raise AuditKeyMissing(f"cannot write the audit key file {path}: {exc}") from None
    finally:
        aside.unlink(missing_ok=True)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_store(path: Path) -> Callable[[KeyRing], None]:
    def store(ring: KeyRing) -> None:
        write_key_file(path, key_text(ring))

    return store


def key_source(db: Database | Path | str, key_file: Path | None = None) -> tuple[str, Path | None]:
    """(description, file) of where the key is taken from; file None for the environment."""
    if os.environ.get(KEY_ENV):
        return f"${KEY_ENV}", None
    named = os.environ.get(KEY_FILE_ENV)
    chosen = key_file or (Path(named) if named else None)
    if chosen is not None:
        return str(chosen), chosen
    path = default_key_file(db)
    return str(path), path


def load_keyring(
    db: Database | Path | str, *, key_file: Path | None = None, create: bool
) -> KeyRing:
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
    return _parse(text, where, _file_store(path))


HEADER = (
    "# Vortos audit key: signs this database's audit chain. Keep it (and a backup) away\n"
    "# from the database; without it the chain can be neither extended nor verified by\n"
    "# its key. Vortos rewrites this file when an epoch is sealed or the key rotated.\n"
)


def create_key_file(path: Path) -> KeyRing:
    """A new random key at `path` (mode 0600). Written aside and linked into place, so a
    process starting at the same moment reads either no file or the whole key, and the first
    one to link wins."""
    key = secrets.token_hex(32)
    ring = KeyRing([key.encode()])
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = create_private(aside)  # 0600 exactly, whatever the umask; never via a symlink
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(key_text(ring))
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(aside, path)
    except OSError as exc:
        raise AuditKeyMissing(f"cannot create the audit key file {path}: {exc}") from None
    finally:
        aside.unlink(missing_ok=True)
    return _parse(path.read_text(encoding="utf-8"), str(path), _file_store(path))


def begin_rotation(path: Path, ring: KeyRing) -> EpochKey:
    """Write a new random key into the key file as the rotation under way (`next`): the
    database records it next, and the file keeps it across a crash in between."""
    if not path.exists():
        raise AuditKeyMissing(f"the audit key file {path} does not exist: nothing to rotate")
    try:
        tighten(path, OWNER_ONLY)  # a key file copied in looser is made the owner's first
    except PermissionError as exc:
        raise AuditKeyMissing(f"cannot make the audit key file {path} private: {exc}") from None
    new = EpochKey(ring.epoch + 1, secrets.token_hex(32).encode())
    write_key_file(path, key_text(ring.with_pending(new)))
    return new
