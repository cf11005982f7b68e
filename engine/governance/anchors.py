"""External anchors: the signed heads of every chain, appended to a file outside the database.

Like CloudTrail's digest files: every so often (`vortos audit anchor`, or the built-in
`vortos.audit-anchor` schedule) one line per chain is appended to an append-only file (by
default `<db>.anchors.jsonl` beside the database, mode 0600), each naming the chain's newest
entry (seq and hash) and signed with Ed25519 by the database's current audit key. Whoever
later verifies the chain with that file catches a truncated tail: a chain that now ends before
an anchored seq, or holds another entry there, was cut or rewritten since. The lines are
checked with the public key alone (the key lineage names every epoch's public key).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.registry import database_of
from engine.backends.sql.audit import SqlAuditLog
from engine.domain.audit import AuditEntry, KeyRing, entry_message
from engine.domain.audit_keys import KeyLineage, verify_signed
from engine.domain.database import Database
from engine.domain.errors import InvalidInput

ANCHOR_FIELDS = ("database_id", "chain", "seq", "hash", "key_id", "at", "signature")


def head_message(database_id: str, chain: str, seq: int, digest: str, at: int) -> str:
    """What an external anchor's signature covers."""
    return f"head:{database_id}:{chain}:{seq}:{digest}:{at}"


@dataclass(frozen=True, slots=True)
class HeadAnchor:
    """One line of an anchors file: chain `chain` ended at entry `seq` (hash `hash`) at `at`."""

    database_id: str
    chain: str
    seq: int
    hash: str
    key_id: str
    at: int  # ms since the epoch, UTC
    signature: str  # Ed25519 of head_message by key `key_id`

    def message(self) -> str:
        return head_message(self.database_id, self.chain, self.seq, self.hash, self.at)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ANCHOR_FIELDS}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> HeadAnchor:
        if not isinstance(value, Mapping) or set(value) != set(ANCHOR_FIELDS):
            raise ValueError(f"an anchor holds exactly {', '.join(ANCHOR_FIELDS)}")
        seq, at = value["seq"], value["at"]
        if type(seq) is not int or type(at) is not int or seq < 1:
            raise ValueError("seq and at must be whole numbers")
        texts = [value[k] for k in ("database_id", "chain", "hash", "key_id", "signature")]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("database_id, chain, hash, key_id and signature must be text")
        return cls(texts[0], texts[1], seq, texts[2], texts[3], at, texts[4])

    def signed_by(self, lineage: KeyLineage) -> bool:
        """Its signature is valid under its key, a key of `lineage`'s database."""
        period = lineage.by_id().get(self.key_id)
        return (
            self.database_id == lineage.database_id
            and period is not None
            and verify_signed(period.public_key, self.message(), self.signature)
        )


def default_anchor_file(db: Database | Path | str) -> Path | None:
    """`<db>.anchors.jsonl` beside a SQLite file; None for a database on a server (give a
    file)."""
    path = database_of(db).path
    return None if path is None else path.with_name(path.name + ".anchors.jsonl")


def anchor_file_for(db: Database | Path | str, given: Path | str | None) -> Path:
    """The anchors file to write or read: `given`, else the default beside the database."""
    if given is not None:
        return Path(given)
    found = default_anchor_file(db)
    if found is None:
        raise InvalidInput(
            "a PostgreSQL database has no default anchors file: give one (-o FILE, or the "
            "`file` of the vortos.audit-anchor schedule's payload) on storage the database's "
            "administrators cannot rewrite"
        )
    return found


def _head_entry(log: SqlAuditLog[Any], chain: str) -> AuditEntry | None:
    head = log.head(chain)
    if head.seq == 0:
        return None
    found = log.entries(chain, after_seq=head.seq - 1, limit=1)
    return found[0] if found else None


def signed_heads(log: SqlAuditLog[Any], keys: KeyRing, now_ms: int) -> list[HeadAnchor]:
    """Each chain's head, signed by `keys` (the database's current key). A head entry whose
    own hash or signature does not hold is refused: an anchor must not vouch for a forgery."""
    identity = log.identity()
    if identity is None:
        return []
    database_id = identity[0]
    heads: list[HeadAnchor] = []
    for chain in log.chains():
        entry = _head_entry(log, chain)
        if entry is None:
            continue
        message = entry_message(chain, entry.seq, entry.hash)
        if (
            entry.computed_hash() != entry.hash
            or keys.valid(message, entry.key_id, entry.signature) is False
        ):
            raise InvalidInput(
                f"the head of chain {chain} (entry {entry.seq}) does not hold its own hash or "
                "signature: nothing anchored; run `vortos audit verify --full`"
            )
        at = now_ms
        signature = keys.seal(head_message(database_id, chain, entry.seq, entry.hash, at))
        heads.append(
            HeadAnchor(database_id, chain, entry.seq, entry.hash, keys.active_id, at, signature)
        )
    return heads


def append_anchors(path: Path, anchors: Iterable[HeadAnchor]) -> int:
    """Append the lines in one write to `path` (created 0600; opened O_APPEND, never through
    a symlink), fsync'd (and its directory, when the file is new). How many were written."""
    lines = [json.dumps(a.to_json(), sort_keys=True, separators=(",", ":")) for a in anchors]
    if not lines:
        return 0
    data = ("\n".join(lines) + "\n").encode()
    existed = path.exists()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise InvalidInput(
            f"cannot append to the anchors file {path}: {exc.strerror} (give a regular file "
            "this account may write; a symlink is refused)"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"the anchors file {path} is not a regular file")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    if not existed:
        _fsync_dir(path.parent)
    return len(lines)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class AnchorLine:
    """A line of an anchors file as read: the anchor, or why the line is not one."""

    number: int
    anchor: HeadAnchor | None
    problem: str | None = None


def read_anchor_lines(path: Path) -> Iterator[AnchorLine]:
    """Every non-blank line of an anchors file, parsed (a bad line is reported, not raised)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"the anchors file {path} cannot be read: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield AnchorLine(number, HeadAnchor.from_json(json.loads(line)))
            except (ValueError, TypeError) as exc:
                yield AnchorLine(number, None, f"not an anchor ({exc})")


def newest_anchor_at(path: Path) -> int | None:
    """When the newest anchor of the file was made (None: no file, or no anchor in it)."""
    if not path.is_file():
        return None
    newest: int | None = None
    for line in read_anchor_lines(path):
        if line.anchor is not None:
            newest = line.anchor.at if newest is None else max(newest, line.anchor.at)
    return newest


@dataclass(slots=True)
class AnchorExpectations:
    """What an anchors file says each chain held: {chain: {seq: anchor}}, and the lines that
    are not validly signed anchors of this database."""

    points: dict[str, dict[int, HeadAnchor]]
    problems: list[str]
    lines: int = 0


def load_expectations(path: Path, lineage: KeyLineage) -> AnchorExpectations:
    """The anchors of `path` checked against `lineage` (signature, database id)."""
    found = AnchorExpectations({}, [])
    for line in read_anchor_lines(path):
        found.lines += 1
        anchor = line.anchor
        if anchor is None:
            found.problems.append(f"{path.name} line {line.number}: {line.problem} (edited)")
            continue
        if anchor.database_id != lineage.database_id:
            found.problems.append(
                f"{path.name} line {line.number} anchors database {anchor.database_id}, not "
                f"this one ({lineage.database_id})"
            )
            continue
        if not anchor.signed_by(lineage):
            found.problems.append(
                f"{path.name} line {line.number} (chain {anchor.chain}, entry {anchor.seq}) is "
                "not validly signed by a key of this database (edited or forged)"
            )
            continue
        points = found.points.setdefault(anchor.chain, {})
        earlier = points.get(anchor.seq)
        if earlier is not None and earlier.hash != anchor.hash:
            found.problems.append(
                f"{path.name}: two signed anchors of chain {anchor.chain} name different hashes "
                f"for entry {anchor.seq}: the chain was rewritten between them"
            )
        points[anchor.seq] = anchor
    return found
