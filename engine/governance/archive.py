"""Archiving the audit chains: old entries sealed into files, verified, then pruned.

`archive` takes, chain by chain, the entries older than an instant (a whole prefix of the
chain after its current anchor, never its newest entry, which the next append links to) and
writes them to `DIR/<database_id>-<chain>-<first>-<last>.jsonl` (one `AuditEntry.to_json()`
per line) with a manifest beside it (`.manifest.json`): the range, its first previous hash and
last hash, the count and SHA-256 of the entries file, the chain's checkpoints in the range, the
database's key lineage, and an Ed25519 signature by the database's current key. The entries
are verified in the database before they are written (an archive must not launder a forgery),
the files are fsync'd, read back and walked again, and only then, in one transaction, the
chain's anchor is set to the archive's last entry (signed) and the archived entries and their
checkpoints are deleted (the append-only trigger lets exactly those go). A crash anywhere
leaves either the database untouched (and at most unanchored files, replaced by the next
run), or the archive anchored and pruned.

`verify_with_archive` walks a chain's archive files in order and then the database from the
anchor, with one ChainWalk: an edited, deleted, reordered or inserted entry, an edited
manifest, a missing or truncated file, an anchor that does not match the archive, or an edited
anchor is named. It needs only the root public key (`vortos audit public-key`): the lineage in
the manifests (or the database) names every later key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from engine.backends.sql import SqlPool
from engine.backends.sql.audit import Anchor, SqlAuditLog, anchor_message
from engine.domain.audit import (
    CHECKPOINT_EVERY,
    START,
    AuditEntry,
    ChainPoint,
    ChainProblem,
    ChainWalk,
    Checkpoint,
    KeyRing,
    canonical,
)
from engine.domain.audit_keys import KeyLineage, KeyPeriod, LineageBroken, verify_signed
from engine.domain.errors import InvalidInput, VortosError
from engine.domain.timeutil import iso_utc
from engine.governance.anchors import AnchorExpectations, HeadAnchor, load_expectations
from engine.governance.audit import period_from_json, period_json, verify
from engine.governance.ledger import LedgerCheck
from engine.ports.audit import AuditLog

ENTRIES_SUFFIX = ".jsonl"
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1
PAGE = 10_000
# One file holds at most this many entries: a backlog is archived as several files, each
# anchored (and pruned) as soon as it is written and verified.
FILE_ENTRIES = 100_000
# Archive files are ours when named <database id>-<chain>-<first>-<last>; temporaries are
# .<name>.<random>.tmp (removed when found).
_NAME = re.compile(r"^(?P<db>[0-9a-f]{8,64})-(?P<chain>.+)-(?P<first>\d{12})-(?P<last>\d{12})$")
_TEMP = re.compile(r"^\..+\.[0-9a-f]{8}\.tmp$")

# Called with a stage name ("verified", "written", "anchored") and the chain: tests stop a
# run there (a crash between writing and pruning).
Hook = Callable[[str, str], None]


# -- the manifest -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Manifest:
    """What an archive file holds, signed: an auditor checks it with the public key alone."""

    database_id: str
    chain: str
    first_seq: int
    first_prev_hash: str
    last_seq: int
    last_hash: str
    count: int
    sha256: str  # of the entries file's bytes
    entries_file: str
    # The key the chain is signed with after its last entry (where the next file, or the
    # database from the anchor, goes on).
    chain_key_id: str | None
    checkpoints: tuple[tuple[int, str, str, str], ...]  # (seq, hash, key id, signature)
    key_id: str  # the key that signed this manifest (the database's current one)
    public_key: str
    lineage: tuple[KeyPeriod, ...]
    created_at: int
    signature: str = ""
    version: int = MANIFEST_VERSION

    @property
    def name(self) -> str:
        return self.entries_file.removesuffix(ENTRIES_SUFFIX) + MANIFEST_SUFFIX

    def body(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "database_id": self.database_id,
            "chain": self.chain,
            "first_seq": self.first_seq,
            "first_prev_hash": self.first_prev_hash,
            "last_seq": self.last_seq,
            "last_hash": self.last_hash,
            "count": self.count,
            "sha256": self.sha256,
            "entries_file": self.entries_file,
            "chain_key_id": self.chain_key_id,
            "checkpoints": [list(cp) for cp in self.checkpoints],
            "key_id": self.key_id,
            "public_key": self.public_key,
            "lineage": [period_json(p) for p in self.lineage],
            "created_at": self.created_at,
        }

    def message(self) -> str:
        """What the signature covers: every field but the signature, canonical JSON."""
        return "archive:" + canonical(self.body())

    def to_json(self) -> dict[str, Any]:
        return {**self.body(), "signature": self.signature}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Manifest:
        return cls(
            database_id=str(value["database_id"]),
            chain=str(value["chain"]),
            first_seq=int(value["first_seq"]),
            first_prev_hash=str(value["first_prev_hash"]),
            last_seq=int(value["last_seq"]),
            last_hash=str(value["last_hash"]),
            count=int(value["count"]),
            sha256=str(value["sha256"]),
            entries_file=str(value["entries_file"]),
            chain_key_id=None if value["chain_key_id"] is None else str(value["chain_key_id"]),
            checkpoints=tuple(
                (int(cp[0]), str(cp[1]), str(cp[2]), str(cp[3])) for cp in value["checkpoints"]
            ),
            key_id=str(value["key_id"]),
            public_key=str(value["public_key"]),
            lineage=tuple(period_from_json(p) for p in value["lineage"]),
            created_at=int(value["created_at"]),
            signature=str(value["signature"]),
            version=int(value["version"]),
        )


def chain_in_name(chain: str) -> str:
    """A chain as it appears in a file name: its own spelling, any character outside
    [A-Za-z0-9._:-] as %XX (tenant names never hold one)."""
    return "".join(
        c if c.isascii() and (c.isalnum() or c in "._:-") else f"%{ord(c):02X}" for c in chain
    )


def archive_stem(database_id: str, chain: str, first: int, last: int) -> str:
    return f"{database_id}-{chain_in_name(chain)}-{first:012d}-{last:012d}"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- the archive directory ----------------------------------------------------------------


@dataclass(slots=True)
class ArchiveDir:
    """An archive directory's files of one database: manifests by chain (as named; read on
    demand), and whatever else is there."""

    path: Path
    manifests: dict[str, list[Path]] = field(default_factory=dict)
    entries: set[str] = field(default_factory=set)
    temporaries: list[Path] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    other_databases: set[str] = field(default_factory=set)

    @classmethod
    def scan(cls, path: Path, database_id: str | None) -> ArchiveDir:
        found = cls(path)
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            raise InvalidInput(
                f"the archive directory {path} cannot be read: {exc.strerror}"
            ) from None
        for name in names:
            if _TEMP.match(name):
                found.temporaries.append(path / name)
                continue
            if name.endswith(MANIFEST_SUFFIX):
                stem, kind = name.removesuffix(MANIFEST_SUFFIX), "manifest"
            elif name.endswith(ENTRIES_SUFFIX):
                stem, kind = name.removesuffix(ENTRIES_SUFFIX), "entries"
            else:
                found.foreign.append(name)
                continue
            matched = _NAME.match(stem)
            if matched is None or not (path / name).is_file():
                found.foreign.append(name)
                continue
            if database_id is not None and matched["db"] != database_id:
                found.other_databases.add(matched["db"])
                continue
            if kind == "entries":
                found.entries.add(name)
            else:
                found.manifests.setdefault(matched["chain"], []).append(path / name)
        for listed in found.manifests.values():
            listed.sort(key=lambda p: p.name)  # zero-padded first seq: numeric order
        return found


def prepare_directory(path: Path, database_id: str) -> ArchiveDir:
    """The archive directory, made (0700) if missing in an existing parent; refused
    (InvalidInput, nothing changed) when its parent is missing too, when it is not a writable
    directory, or when it holds files that are not this database's archive."""
    if path.exists() and not path.is_dir():
        raise InvalidInput(f"the archive directory {path} is not a directory")
    if not path.exists():
        if not path.parent.is_dir():
            # A mistyped path must not become a tree of directories the entries vanish into.
            raise InvalidInput(
                f"the archive directory {path} does not exist, nor does {path.parent}: create "
                "the directory (mode 0700) or correct the path"
            )
        try:
            path.mkdir(mode=0o700)
        except OSError as exc:
            raise InvalidInput(
                f"cannot create the archive directory {path}: {exc.strerror}"
            ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidInput(f"the archive directory {path} is not writable by this account")
    found = ArchiveDir.scan(path, database_id)
    if found.foreign or found.other_databases:
        named = (
            found.foreign[:5]
            + [f"{db}-… (another database's archive)" for db in sorted(found.other_databases)][:5]
        )
        raise InvalidInput(
            f"the archive directory {path} holds files that are not this database's archive "
            f"({', '.join(named)}): give a directory of its own (one per database)"
        )
    return found


def read_manifest(path: Path) -> Manifest:
    try:
        return Manifest.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path.name} is not an archive manifest ({exc})") from None


# -- archiving --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArchivedFile:
    chain: str
    first_seq: int
    last_seq: int
    count: int
    entries_file: str
    manifest_file: str


@dataclass(slots=True)
class ArchiveReport:
    directory: Path
    before_ms: int
    files: list[ArchivedFile] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # chains kept whole: a legal hold
    untouched: list[str] = field(default_factory=list)  # chains with nothing old enough
    replaced: list[str] = field(default_factory=list)  # unanchored files of a crashed run

    @property
    def archived(self) -> int:
        return sum(f.count for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "before": self.before_ms,
            "archived": self.archived,
            "files": [
                {
                    "chain": f.chain,
                    "first_seq": f.first_seq,
                    "last_seq": f.last_seq,
                    "count": f.count,
                    "entries": f.entries_file,
                    "manifest": f.manifest_file,
                }
                for f in self.files
            ],
            "held": self.held,
            "untouched": self.untouched,
            "replaced": self.replaced,
        }


class ArchiveRefused(VortosError):
    """The database's entries cannot be archived as they are (they do not verify, or changed
    while being archived): nothing was pruned."""

    exit_code = 1


def _pool(log: SqlAuditLog[Any]) -> SqlPool[Any]:
    # The prune transaction runs on the log's own pool: anchoring and deleting the archived
    # entries is this module's work, not one of the audit log's methods.
    pool: SqlPool[Any] = log._pool
    return pool


def current_lineage(log: SqlAuditLog[Any]) -> KeyLineage | None:
    identity = log.identity()
    if identity is None:
        return None
    try:
        return KeyLineage.checked(identity[0], identity[1], root_public_key=None)
    except LineageBroken as exc:
        raise ArchiveRefused(f"the database's audit key lineage does not hold: {exc}") from None


def signing_ring(log: SqlAuditLog[Any], now_ms: int) -> KeyRing:
    """The database's current key (caught up, or refused with both fingerprints)."""
    with _pool(log).transaction() as conn:
        return log.signing_keys(conn, now_ms)


def held_chains(tenants_on_hold: Iterable[str]) -> set[str]:
    return {f"tenant:{t}" for t in tenants_on_hold}


def archive(
    log: SqlAuditLog[Any],
    directory: Path,
    *,
    before_ms: int,
    now_ms: int,
    held_tenants: Iterable[str] = (),
    chains: Sequence[str] | None = None,
    hook: Hook | None = None,
    file_entries: int = FILE_ENTRIES,
) -> ArchiveReport:
    """Archive and prune, chain by chain, the entries made before `before_ms` (see the module
    docstring). Chains of `held_tenants` (legal holds) stay whole. Running it again with the
    same instant changes nothing."""
    report = ArchiveReport(directory, before_ms)
    lineage = current_lineage(log)
    if lineage is None:
        return report  # no key recorded: no entry either
    folder = prepare_directory(directory, lineage.database_id)
    for temporary in folder.temporaries:
        temporary.unlink(missing_ok=True)  # a crashed run's half-written file
    ring = signing_ring(log, now_ms)
    lineage = current_lineage(log) or lineage  # signing_keys may have evolved the key
    held = held_chains(held_tenants)
    for chain in chains if chains is not None else log.chains():
        if chain in held:
            report.held.append(chain)
            continue
        # The whole chain as `verify --full` sees it, run rows against their batches too: an
        # archive never carries away (and so hides) a chain or a ledger that does not verify.
        as_log = cast("AuditLog", log)  # each backend's log adds `append`
        checked = verify(as_log, ring, chains=[chain], full=True, record=False).chains[0]
        if checked.problem is not None:
            raise ArchiveRefused(
                f"audit chain {chain} does not verify (entry {checked.problem.seq}: "
                f"{checked.problem.reason}): nothing of it was archived; find out why first"
            )
        wrote = False
        while True:
            done = _archive_one(
                log, folder, chain, lineage, ring, before_ms, now_ms, report, hook, file_entries
            )
            if done is None:
                break
            wrote = True
            report.files.append(done)
        if not wrote:
            report.untouched.append(chain)
    return report


def _stale(folder: ArchiveDir, chain: str, anchored_to: int) -> list[Path]:
    """This chain's files past its anchor: written by a run that crashed before it pruned
    (their entries are still in the database)."""
    stale = []
    for manifest in folder.manifests.get(chain_in_name(chain), []):
        matched = _NAME.match(manifest.name.removesuffix(MANIFEST_SUFFIX))
        assert matched is not None
        if int(matched["first"]) > anchored_to:
            stale.append(manifest)
    return stale


def _previous_key(folder: ArchiveDir, anchor: Anchor | None) -> str | None:
    if anchor is None:
        return None
    path = folder.path / anchor.archive
    with contextlib.suppress(ValueError):
        return read_manifest(path).chain_key_id
    return None


def _archive_one(
    log: SqlAuditLog[Any],
    folder: ArchiveDir,
    chain: str,
    lineage: KeyLineage,
    ring: KeyRing,
    before_ms: int,
    now_ms: int,
    report: ArchiveReport,
    hook: Hook | None,
    file_entries: int,
) -> ArchivedFile | None:
    """Archive the next file of `chain` (at most `file_entries` entries made before
    `before_ms`, after its anchor): verified, written, read back, then anchored and pruned.
    None when nothing of the chain is old enough (or only its head is left)."""
    anchor = log.anchor(chain)
    start = START if anchor is None else ChainPoint(anchor.seq, anchor.hash)
    head = log.head(chain)
    _remove_stale(folder, chain, start.seq, report)
    if head.seq <= start.seq + 1:
        return None
    walk = ChainWalk(chain, ring, lineage=lineage)
    walk.start_at(start, _previous_key(folder, anchor))
    checkpoints = {cp.seq: cp for cp in log.checkpoints(chain, after_seq=start.seq)}
    limit = min(file_entries, head.seq - 1 - start.seq)  # never the head itself
    taken, last = _collect(log, walk, checkpoints, before_ms, limit)
    if last is None:
        return None
    chain_key_id = _key_after(walk, last)
    _prove_rest(log, chain, walk, checkpoints, head)
    if hook is not None:
        hook("verified", chain)
    data = ("\n".join(taken) + "\n").encode()
    manifest = _signed_manifest(
        lineage, ring, chain, start, last, data, len(taken), checkpoints, chain_key_id, now_ms
    )
    _write_and_reread(folder, manifest, data, lineage, start, anchor)
    if hook is not None:
        hook("written", chain)
    _anchor_and_prune(log, chain, anchor, manifest, ring, now_ms)
    if hook is not None:
        hook("anchored", chain)
    return ArchivedFile(
        chain, manifest.first_seq, last.seq, len(taken), manifest.entries_file, manifest.name
    )


def _remove_stale(folder: ArchiveDir, chain: str, anchored_to: int, report: ArchiveReport) -> None:
    """Delete the chain's files past its anchor (see _stale): this run writes them anew."""
    for stale in _stale(folder, chain, anchored_to):
        folder.manifests[chain_in_name(chain)].remove(stale)
        stale.unlink(missing_ok=True)
        (folder.path / (stale.name.removesuffix(MANIFEST_SUFFIX) + ENTRIES_SUFFIX)).unlink(
            missing_ok=True
        )
        report.replaced.append(stale.name)


def _signed_manifest(
    lineage: KeyLineage,
    ring: KeyRing,
    chain: str,
    start: ChainPoint,
    last: AuditEntry,
    data: bytes,
    count: int,
    checkpoints: Mapping[int, Checkpoint],
    chain_key_id: str | None,
    now_ms: int,
) -> Manifest:
    """The manifest of the entries file `data` (the chain's entries after `start` through
    `last`), with the chain's checkpoints in that range, signed by the database's key."""
    first_seq = start.seq + 1
    stem = archive_stem(lineage.database_id, chain, first_seq, last.seq)
    in_range = tuple(
        (cp.seq, cp.hash, cp.key_id, cp.signature)
        for seq, cp in sorted(checkpoints.items())
        if seq <= last.seq
    )
    manifest = Manifest(
        database_id=lineage.database_id,
        chain=chain,
        first_seq=first_seq,
        first_prev_hash=start.hash,
        last_seq=last.seq,
        last_hash=last.hash,
        count=count,
        sha256=hashlib.sha256(data).hexdigest(),
        entries_file=stem + ENTRIES_SUFFIX,
        chain_key_id=chain_key_id,
        checkpoints=in_range,
        key_id=ring.active_id,
        public_key=ring.public_key,
        lineage=lineage.periods,
        created_at=now_ms,
    )
    return _signed(manifest, ring)


def _write_and_reread(
    folder: ArchiveDir,
    manifest: Manifest,
    data: bytes,
    lineage: KeyLineage,
    start: ChainPoint,
    anchor: Anchor | None,
) -> None:
    """Write the entries file and its manifest durably, then read back what is on disk and
    walk it again with only what an auditor has: nothing is pruned on the strength of bytes
    that never reached the disk intact."""
    _write(folder.path / manifest.entries_file, data)
    _write(folder.path / manifest.name, (json.dumps(manifest.to_json(), indent=1) + "\n").encode())
    _fsync_dir(folder.path)
    problem = check_files(
        folder.path, manifest.name, lineage, start, walk_key=_previous_key(folder, anchor)
    )
    if problem is not None:
        raise ArchiveRefused(
            f"the archive just written does not verify ({problem}): nothing pruned"
        )


def _collect(
    log: SqlAuditLog[Any],
    walk: ChainWalk,
    checkpoints: Mapping[int, Checkpoint],
    before_ms: int,
    limit: int,
) -> tuple[list[str], AuditEntry | None]:
    """The entries after the walk's start made before `before_ms` (at most `limit`), checked
    on the way, as JSON lines; and the last of them."""
    chain = walk.chain
    taken: list[str] = []
    last: AuditEntry | None = None
    after = walk.at.seq
    while len(taken) < limit:
        page = log.entries(chain, after_seq=after, limit=min(PAGE, limit - len(taken)))
        if not page:
            break
        for entry in page:
            if entry.at >= before_ms:
                return taken, last
            _feed_checked(walk, entry, checkpoints)
            if walk.problem is not None:
                raise ArchiveRefused(
                    f"chain {chain} does not verify at entry {walk.problem.seq} "
                    f"({walk.problem.reason}): nothing archived; run `vortos audit verify --full`"
                )
            taken.append(json.dumps(entry.to_json(), sort_keys=True, ensure_ascii=False))
            last = entry
        after = page[-1].seq
    return taken, last


def _key_after(walk: ChainWalk, last: AuditEntry) -> str | None:
    return walk.key_id if walk.key_id is not None else last.key_id


def _feed_checked(
    walk: ChainWalk, entry: AuditEntry, checkpoints: Mapping[int, Checkpoint]
) -> None:
    if not walk.feed(entry):
        return
    checkpoint = checkpoints.get(entry.seq)
    if checkpoint is None:
        if entry.seq % CHECKPOINT_EVERY == 0:
            walk.problem = ChainProblem(
                entry.seq, "the checkpoint signed at this sequence is missing"
            )
        return
    if checkpoint.hash != entry.hash:
        walk.problem = ChainProblem(entry.seq, "the entry differs from its signed checkpoint")
        return
    walk.check_point(checkpoint)


def _prove_rest(
    log: SqlAuditLog[Any],
    chain: str,
    walk: ChainWalk,
    checkpoints: Mapping[int, Checkpoint],
    head: ChainPoint,
) -> None:
    """Entries of the range signed with a key no longer held are vouched for by a later seal
    or checkpoint: walk on through the database until one does (or refuse)."""
    after = walk.at.seq
    while walk.unproven_from is not None and walk.problem is None and after < head.seq:
        page = log.entries(chain, after_seq=after, limit=PAGE)
        if not page:
            break
        for entry in page:
            _feed_checked(walk, entry, checkpoints)
            if _stuck(walk) or walk.unproven_from is None:
                break
        after = head.seq if _stuck(walk) else walk.at.seq
    if walk.problem is not None or walk.unproven_from is not None:
        why = walk.problem.reason if walk.problem is not None else "nothing signed vouches for them"
        raise ArchiveRefused(
            f"chain {chain}: its entries from {walk.unproven_from or walk.at.seq} cannot be "
            f"proven before archiving ({why}): nothing archived"
        )


def _problem_of(walk: ChainWalk) -> ChainProblem | None:
    """The walk's problem now (its methods set it: a plain read, for the type checker)."""
    return walk.problem


def _stuck(walk: ChainWalk) -> bool:
    return _problem_of(walk) is not None


def _signed(manifest: Manifest, ring: KeyRing) -> Manifest:
    return Manifest(**{**_fields(manifest), "signature": ring.seal(manifest.message())})


def _fields(manifest: Manifest) -> dict[str, Any]:
    return {name: getattr(manifest, name) for name in Manifest.__dataclass_fields__}


def _write(path: Path, data: bytes) -> None:
    """`path` complete or not at all: written aside, fsync'd, renamed into place (0600)."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(aside, path)
    finally:
        if fd >= 0:
            os.close(fd)
        aside.unlink(missing_ok=True)


def _anchor_and_prune(
    log: SqlAuditLog[Any],
    chain: str,
    before: Anchor | None,
    manifest: Manifest,
    ring: KeyRing,
    now_ms: int,
) -> None:
    """One transaction: the chain's anchor moved to the archive's end (only if it is still
    where this run found it: a concurrent archive of the chain wins), then the archived
    entries and their checkpoints deleted."""
    pool = _pool(log)
    m = pool.dialect.mark
    signature = ring.seal(
        anchor_message(chain, manifest.last_seq, manifest.last_hash, manifest.name)
    )
    values = (
        chain,
        manifest.last_seq,
        manifest.last_hash,
        ring.active_id,
        now_ms,
        signature,
        manifest.name,
    )
    with pool.transaction() as conn:
        found = conn.execute(
            f"SELECT hash FROM audit_entries WHERE chain = {m} AND seq = {m}",
            (chain, manifest.last_seq),
        ).fetchone()
        if found is None or str(found[0]) != manifest.last_hash:
            raise ArchiveRefused(
                f"chain {chain}'s entry {manifest.last_seq} changed while it was archived: "
                "nothing pruned; run `vortos audit verify --full`"
            )
        if not _move_anchor(pool, conn, before, values):
            raise ArchiveRefused(
                f"chain {chain} was archived by another run meanwhile: nothing pruned"
            )
        conn.execute(
            f"DELETE FROM audit_checkpoints WHERE chain = {m} AND seq <= {m}",
            (chain, manifest.last_seq),
        )
        conn.execute(
            f"DELETE FROM audit_entries WHERE chain = {m} AND seq <= {m}",
            (chain, manifest.last_seq),
        )


def _move_anchor(
    pool: SqlPool[Any], conn: Any, before: Anchor | None, values: tuple[Any, ...]
) -> bool:
    """Set the chain's anchor row to `values`, only if it is still `before` (no row, or the
    row at `before`'s entry); whether it was set."""
    if before is None:
        cursor = conn.execute(
            "INSERT INTO audit_anchors (chain, seq, hash, key_id, at, signature, archive) "
            f"VALUES ({pool.dialect.marks(7)}) ON CONFLICT (chain) DO NOTHING",
            values,
        )
    else:
        cursor = conn.execute(
            "INSERT INTO audit_anchors (chain, seq, hash, key_id, at, signature, archive) "
            f"VALUES ({pool.dialect.marks(7)}) ON CONFLICT (chain) DO UPDATE SET "
            "seq = excluded.seq, hash = excluded.hash, key_id = excluded.key_id, "
            "at = excluded.at, signature = excluded.signature, archive = excluded.archive "
            f"WHERE audit_anchors.seq = {pool.dialect.mark}",
            (*values, before.seq),
        )
    return _changes(conn, cursor) == 1


def _changes(conn: Any, cursor: Any) -> int:
    rowcount = getattr(cursor, "rowcount", None)
    if isinstance(rowcount, int) and rowcount >= 0:
        return rowcount  # psycopg
    return int(conn.changes())  # apsw


# -- verification -----------------------------------------------------------------------------


def _read_entries(path: Path) -> Iterator[tuple[int, AuditEntry | None, str | None]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, AuditEntry.from_json(json.loads(raw)), None
            except (ValueError, KeyError, TypeError) as exc:
                yield number, None, f"line {number} is not an audit entry ({exc})"


def _sha256_count(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    lines = 0
    with path.open("rb") as handle:
        for raw in handle:
            digest.update(raw)
            lines += 1
    return digest.hexdigest(), lines


@dataclass(slots=True)
class _FileWalk:
    """The walk of one chain across its archive files."""

    walk: ChainWalk
    lineage: KeyLineage
    anchors: Mapping[int, HeadAnchor] = field(default_factory=dict)
    anchored_seen: set[int] = field(default_factory=set)
    entries: int = 0
    # With the database at hand: archived and live batch entries against their run rows.
    ledger: LedgerCheck | None = None

    def problem(self, seq: int, reason: str) -> ChainProblem:
        self.walk.problem = ChainProblem(seq, reason)
        return self.walk.problem

    def feed(self, entry: AuditEntry, where: str, checkpoints: Mapping[int, Checkpoint]) -> bool:
        _feed_checked(self.walk, entry, checkpoints)
        if self.walk.problem is not None:
            self.walk.problem = ChainProblem(
                self.walk.problem.seq, f"{where}: {self.walk.problem.reason}"
            )
            return False
        self.entries += 1
        if self.ledger is not None:
            problem = self.ledger.feed(entry)
            if problem is not None:
                self.problem(problem.seq, f"{where}: {problem.reason}")
                return False
        expected = self.anchors.get(entry.seq)
        if expected is not None:
            self.anchored_seen.add(entry.seq)
            if expected.hash != entry.hash:
                self.problem(
                    entry.seq,
                    f"{where}: entry {entry.seq} differs from the head anchored externally on "
                    f"{iso_utc(expected.at)} (rewritten since)",
                )
                return False
            # A signed head vouches for every entry up to it (public key only).
            self.walk.cover(
                entry.seq, expected.hash, expected.key_id, expected.signature, expected.message()
            )
            broken = _problem_of(self.walk)
            if broken is not None:
                self.problem(entry.seq, f"external anchor of entry {entry.seq}: {broken.reason}")
                return False
        return True


def _manifest_problem(manifest: Manifest, lineage: KeyLineage, name: str) -> str | None:
    period = lineage.by_id().get(manifest.key_id)
    if manifest.database_id != lineage.database_id:
        return f"manifest {name} belongs to database {manifest.database_id}, not to this one"
    if period is None or period.public_key != manifest.public_key:
        return f"manifest {name} is signed with key {manifest.key_id}, which is not this database's"
    if not verify_signed(period.public_key, manifest.message(), manifest.signature):
        return f"manifest {name} is not validly signed (edited or forged)"
    if manifest.name != name:
        return f"manifest {name} describes {manifest.name} (renamed)"
    own = {p.epoch: p for p in lineage.periods}
    if any(own.get(p.epoch) != p for p in manifest.lineage):
        return f"manifest {name} names a key lineage that is not this database's"
    return None


def check_files(
    directory: Path,
    manifest_name: str,
    lineage: KeyLineage,
    start: ChainPoint,
    *,
    walk_key: str | None,
) -> str | None:
    """One archive file against its manifest, walked from `start`: None when it holds."""
    manifest = read_manifest(directory / manifest_name)
    walk = _FileWalk(ChainWalk(manifest.chain, None, lineage=lineage), lineage)
    walk.walk.start_at(start, walk_key)
    problem = _walk_file(walk, directory, manifest_name, manifest)
    return None if problem is None else problem.reason


def _walk_file(
    walk: _FileWalk, directory: Path, name: str, manifest: Manifest
) -> ChainProblem | None:
    """Feed one archive file's entries (after checking its manifest); its problem, if any."""
    bad = _manifest_problem(manifest, walk.lineage, name)
    if bad is not None:
        return walk.problem(manifest.first_seq, bad)
    problem = _out_of_place(walk, manifest)
    if problem is not None:
        return problem
    path = directory / manifest.entries_file
    if not path.is_file():
        return walk.problem(
            manifest.first_seq,
            f"the archive file {manifest.entries_file} (entries {manifest.first_seq}.."
            f"{manifest.last_seq}) is missing",
        )
    problem = _feed_file(walk, path, manifest)
    if problem is not None:
        return problem
    return _close_file(walk, path, manifest)


def _out_of_place(walk: _FileWalk, manifest: Manifest) -> ChainProblem | None:
    """Whether the file does not start right after where the walk is: a file missing before
    it, an overlap, or another chain's (or a replaced) file before it."""
    at = walk.walk.at
    if manifest.first_seq != at.seq + 1:
        if manifest.first_seq > at.seq + 1:
            return walk.problem(
                at.seq + 1,
                f"entries {at.seq + 1}..{manifest.first_seq - 1} are in no archive file "
                f"before {manifest.entries_file} (a file is missing)",
            )
        return walk.problem(
            manifest.first_seq,
            f"{manifest.entries_file} starts at entry {manifest.first_seq}, inside the "
            f"archive before it (which ends at {at.seq})",
        )
    if manifest.first_prev_hash != at.hash:
        return walk.problem(
            manifest.first_seq,
            f"{manifest.entries_file} does not follow the entry before it (another chain's "
            "archive, or the one before was replaced)",
        )
    return None


def _feed_file(walk: _FileWalk, path: Path, manifest: Manifest) -> ChainProblem | None:
    """Feed the entries file line by line, with the manifest's checkpoints."""
    checkpoints = {
        seq: Checkpoint(manifest.chain, seq, digest, key_id, signature)
        for seq, digest, key_id, signature in manifest.checkpoints
        if key_id in walk.lineage.by_id()  # legacy HMAC checkpoints: only the key checks them
    }
    for number, entry, unreadable in _read_entries(path):
        if entry is None:
            return walk.problem(
                walk.walk.at.seq + 1, f"{manifest.entries_file}: {unreadable} (edited)"
            )
        if entry.seq > manifest.last_seq:
            return walk.problem(
                entry.seq,
                f"{manifest.entries_file} line {number}: entry {entry.seq} is past the "
                f"manifest's last entry {manifest.last_seq} (inserted)",
            )
        if not walk.feed(entry, f"{manifest.entries_file} line {number}", checkpoints):
            return walk.walk.problem
    return None


def _close_file(walk: _FileWalk, path: Path, manifest: Manifest) -> ChainProblem | None:
    """The file walked: it must end where its manifest does, match its count and SHA-256, and
    its manifest's signature vouches for every entry up to its last."""
    end = walk.walk.at
    if end.seq != manifest.last_seq:
        return walk.problem(
            end.seq + 1,
            f"{manifest.entries_file} ends at entry {end.seq}, its manifest at "
            f"{manifest.last_seq} (truncated)",
        )
    digest, lines = _sha256_count(path)
    if lines != manifest.count or digest != manifest.sha256:
        return walk.problem(
            manifest.last_seq,
            f"{manifest.entries_file} does not match its manifest's count and SHA-256 (edited)",
        )
    if not walk.walk.cover(
        manifest.last_seq,
        manifest.last_hash,
        manifest.key_id,
        manifest.signature,
        manifest.message(),
    ):
        problem = walk.walk.problem
        assert problem is not None
        return walk.problem(problem.seq, f"{manifest.entries_file}: {problem.reason}")
    if manifest.chain_key_id is not None and walk.walk.key_id is None:
        walk.walk.key_id = manifest.chain_key_id
    return None


@dataclass(slots=True)
class ArchiveChainReport:
    """One chain across archive and database."""

    chain: str
    files: int = 0
    archived: int = 0  # entries walked in archive files
    in_database: int = 0  # entries walked in the database
    end: ChainPoint = START  # the last entry walked
    head: ChainPoint | None = None  # the database's head (None: archive only)
    anchor: int | None = None  # the database's anchor seq
    problem: ChainProblem | None = None
    notes: list[str] = field(default_factory=list)
    anchored_externally: int = 0  # external anchors compared

    @property
    def intact(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "intact": self.intact,
            "files": self.files,
            "archived": self.archived,
            "in_database": self.in_database,
            "end": self.end.spelled(),
            "head": None if self.head is None else self.head.spelled(),
            "anchor": self.anchor,
            "first_bad_seq": None if self.problem is None else self.problem.seq,
            "problem": None if self.problem is None else self.problem.reason,
            "anchored_externally": self.anchored_externally,
            "notes": self.notes,
        }


@dataclass(slots=True)
class ArchiveVerification:
    database_id: str
    chains: list[ArchiveChainReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # not of one chain: files, anchors file

    @property
    def intact(self) -> bool:
        return not self.problems and all(c.intact for c in self.chains)

    def to_json(self) -> dict[str, Any]:
        return {
            "database_id": self.database_id,
            "intact": self.intact,
            "problems": self.problems,
            "chains": [c.to_json() for c in self.chains],
        }


def read_public_key(path: Path) -> tuple[str, str, str]:
    """(database id, root key id, root public key) from `vortos audit public-key -o FILE`:
    JSON holding exactly database_id, root_key_id and root_public_key."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"--public-key {path} cannot be read: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidInput(f"--public-key {path} is not JSON ({exc})") from None
    keys = {"database_id", "root_key_id", "root_public_key"}
    if (
        not isinstance(value, dict)
        or set(value) != keys
        or not all(isinstance(value[k], str) for k in keys)
    ):
        raise InvalidInput(
            f"--public-key {path} must hold exactly database_id, root_key_id and "
            "root_public_key (as `vortos audit public-key -o FILE` writes)"
        )
    return value["database_id"], value["root_key_id"], value["root_public_key"]


def trusted_lineage(
    database_id: str,
    candidates: Iterable[Sequence[KeyPeriod]],
    root_public_key: str | None,
) -> KeyLineage:
    """The longest of the lineages given (the database's, each manifest's), checked from the
    root public key (None: the database's own root is trusted). The others must be prefixes."""
    listed = [tuple(sorted(c, key=lambda p: p.epoch)) for c in candidates if c]
    if not listed:
        raise InvalidInput("no key lineage to verify with: neither a database nor a manifest")
    longest = max(listed, key=len)
    lineage = KeyLineage.checked(database_id, longest, root_public_key=root_public_key)
    for other in listed:
        if other != longest[: len(other)]:
            raise LineageBroken("two key lineages disagree (a manifest's and the database's)")
    return lineage


# An archive file as read: (file name, its manifest or None, why it could not be read).
_ListedFile = tuple[str, Manifest | None, str | None]


def verify_with_archive(
    directory: Path | None,
    *,
    log: SqlAuditLog[Any] | None,
    keys: KeyRing | None = None,
    public_key: tuple[str, str, str] | None = None,
    anchors_file: Path | None = None,
    chains: Sequence[str] | None = None,
) -> ArchiveVerification:
    """Walk each chain's archive files in order, then (with `log`) the database from its
    anchor to its head, as one chain. `public_key` (database id, root key id, root public key)
    makes the root trusted instead of the database's own (what an auditor does: no secret
    needed; `keys` adds HMAC checks for whoever holds the key). `anchors_file` adds the
    external anchors: every anchored head must be there, unchanged."""
    identity = log.identity() if log is not None else None
    folder = ArchiveDir.scan(directory, None) if directory is not None else ArchiveDir(Path("."))
    manifests, databases = _read_manifests(folder)
    result_problems = [
        f"{name} in the archive directory is not an archive file" for name in folder.foreign
    ]
    database_id = _database_of(public_key, identity, databases)
    candidates: list[Sequence[KeyPeriod]] = [identity[1]] if identity is not None else []
    candidates += [
        m.lineage for entries in manifests.values() for _, m, _ in entries if m is not None
    ]
    root = public_key[2] if public_key is not None else None
    if root is None and identity is None:
        raise InvalidInput(
            "give --public-key FILE: without the database, only the root public key can be trusted"
        )
    result = ArchiveVerification(database_id, problems=result_problems)
    try:
        lineage = trusted_lineage(database_id, candidates, root)
    except (LineageBroken, InvalidInput) as exc:
        result.problems.append(f"the key lineage does not hold: {exc}")
        return result
    expectations = (
        load_expectations(anchors_file, lineage)
        if anchors_file is not None
        else AnchorExpectations({}, [])
    )
    result.problems += expectations.problems
    wanted = set(manifests) | set(expectations.points)
    if log is not None:
        wanted |= set(log.chains())
    for chain in sorted(wanted) if chains is None else chains:
        result.chains.append(
            _verify_chain(
                chain,
                folder.path,
                manifests.get(chain, []),
                log,
                keys,
                lineage,
                expectations.points.get(chain, {}),
            )
        )
    return result


def _read_manifests(folder: ArchiveDir) -> tuple[dict[str, list[_ListedFile]], set[str]]:
    """The folder's manifests by chain, an unreadable one under the chain its name spells
    (it is that chain's problem, named when the walk reaches it); and the databases they name."""
    manifests: dict[str, list[_ListedFile]] = {}
    databases: set[str] = set()
    for listed in folder.manifests.values():
        for path in listed:
            try:
                manifest = read_manifest(path)
            except ValueError as exc:
                named = _NAME.match(path.name.removesuffix(MANIFEST_SUFFIX))
                assert named is not None
                manifests.setdefault(_chain_of(named["chain"]), []).append(
                    (path.name, None, str(exc))
                )
                continue
            databases.add(manifest.database_id)
            manifests.setdefault(manifest.chain, []).append((path.name, manifest, None))
    return manifests, databases


def _database_of(
    public_key: tuple[str, str, str] | None,
    identity: tuple[str, list[KeyPeriod]] | None,
    databases: set[str],
) -> str:
    """Which database the archive is verified as: the public key file's, else the database's,
    else the one every manifest names (refused when they name several, or none)."""
    database_id = (
        public_key[0] if public_key is not None else identity[0] if identity is not None else None
    )
    if database_id is None:
        if len(databases) != 1:
            raise InvalidInput(
                "cannot tell which database the archive is of: give --public-key FILE "
                "(`vortos audit public-key -o FILE`)"
            )
        database_id = next(iter(databases))
    if identity is not None and identity[0] != database_id:
        raise InvalidInput(
            f"the database is {identity[0]}, the public key file is of database {database_id}"
        )
    return database_id


def _chain_of(spelled: str) -> str:
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m[1], 16)), spelled)


def _verify_chain(
    chain: str,
    directory: Path,
    listed: Sequence[_ListedFile],
    log: SqlAuditLog[Any] | None,
    keys: KeyRing | None,
    lineage: KeyLineage,
    anchored: Mapping[int, HeadAnchor],
) -> ArchiveChainReport:
    report = ArchiveChainReport(chain)
    walk = _FileWalk(
        ChainWalk(chain, keys, lineage=lineage),
        lineage,
        anchored,
        ledger=None if log is None else LedgerCheck(log.fired_runs),
    )
    anchor = log.anchor(chain) if log is not None else None
    report.anchor = None if anchor is None else anchor.seq
    if anchor is not None and not _anchor_signed(anchor, lineage):
        report.problem = ChainProblem(
            anchor.seq, "the database's anchor is not validly signed (edited or forged)"
        )
        return report
    report.problem = _walk_archive(report, walk, directory, listed, anchor, log is not None)
    if report.problem is not None:
        return _done(report, walk)
    report.archived = walk.entries
    if log is not None:
        _walk_database(report, walk, log, anchor, lineage)
    return _done(report, walk)


def _walk_archive(
    report: ArchiveChainReport,
    walk: _FileWalk,
    directory: Path,
    listed: Sequence[_ListedFile],
    anchor: Anchor | None,
    with_database: bool,
) -> ChainProblem | None:
    """Walk the chain's archive files in order, up to the database's anchor (files past it, or
    all of them while nothing is anchored, are left by an archive that stopped before pruning:
    their entries are still in the database); the first problem, if any."""
    ordered = sorted(listed, key=lambda item: (item[1].first_seq if item[1] else 0, item[0]))
    for name, manifest, unreadable in ordered:
        if manifest is None:
            return ChainProblem(walk.walk.at.seq + 1, f"{unreadable} (edited)")
        if anchor is not None and manifest.first_seq > anchor.seq:
            report.notes.append(
                f"{manifest.entries_file} is past the database's anchor (left by an archive "
                "that stopped before pruning; its entries are still in the database): not walked"
            )
            continue
        if anchor is None and with_database:
            report.notes.append(
                f"{manifest.entries_file} is not anchored in the database (an archive that "
                "stopped before pruning): not walked"
            )
            continue
        problem = _walk_file(walk, directory, name, manifest)
        report.files += 1
        if problem is not None:
            return problem
        if anchor is not None and manifest.last_seq >= anchor.seq:  # noqa: SIM102
            if (manifest.last_seq, manifest.last_hash, name) != (
                anchor.seq,
                anchor.hash,
                anchor.archive,
            ):
                return ChainProblem(
                    anchor.seq,
                    f"the database's anchor (entry {anchor.seq}, archive {anchor.archive}) does "
                    f"not match the archive's last entry ({manifest.last_seq} in {name})",
                )
    return None


def _anchor_signed(anchor: Anchor, lineage: KeyLineage) -> bool:
    period = lineage.by_id().get(anchor.key_id)
    message = anchor_message(anchor.chain, anchor.seq, anchor.hash, anchor.archive)
    return period is not None and verify_signed(period.public_key, message, anchor.signature)


def _walk_database(
    report: ArchiveChainReport,
    walk: _FileWalk,
    log: SqlAuditLog[Any],
    anchor: Anchor | None,
    lineage: KeyLineage,
) -> None:
    chain = report.chain
    head = log.head(chain)
    report.head = head
    if anchor is not None and walk.walk.at.seq < anchor.seq:
        report.problem = ChainProblem(
            walk.walk.at.seq + 1,
            f"entries {walk.walk.at.seq + 1}..{anchor.seq} were archived (the anchor is at "
            f"{anchor.seq}, archive {anchor.archive}) and are not in the archive given",
        )
        return
    before = walk.entries
    checkpoints = {cp.seq: cp for cp in log.checkpoints(chain, after_seq=walk.walk.at.seq)}
    after = walk.walk.at.seq
    while walk.walk.problem is None:
        page = log.entries(chain, after_seq=after, limit=PAGE)
        if not page:
            break
        for entry in page:
            if not walk.feed(entry, "database", checkpoints):
                break
        after = page[-1].seq
    report.in_database = walk.entries - before
    if walk.walk.problem is None and walk.walk.at != head:
        walk.problem(walk.walk.at.seq + 1, "the database's chain ends before its head")
    if walk.walk.problem is None:
        walk.walk.finish()


def _done(report: ArchiveChainReport, walk: _FileWalk) -> ArchiveChainReport:
    report.end = walk.walk.at
    if report.archived == 0 and report.in_database == 0:
        report.archived = walk.entries
    if report.problem is None:
        report.problem = walk.walk.problem
    if report.problem is None and walk.ledger is not None and report.head is not None:
        report.problem = walk.ledger.finish()
    if report.problem is None and report.head is not None:
        # The database was walked to its head: an anchored entry past it was cut off.
        for seq in sorted(walk.anchors):
            if seq > report.end.seq:
                report.problem = ChainProblem(
                    report.end.seq + 1,
                    f"the chain ends at entry {report.end.seq}, but its head was anchored at "
                    f"entry {seq} on {iso_utc(walk.anchors[seq].at)} (truncated since)",
                )
                break
    report.anchored_externally = len(walk.anchored_seen)
    skipped = [s for s in walk.anchors if s not in walk.anchored_seen and s <= report.end.seq]
    if skipped and report.problem is None:
        report.notes.append(
            f"{len(skipped)} external anchor(s) name entries before the walk's start (not compared)"
        )
    return report
