"""A lease driver on plain files: for processes on one host that share a directory.

Each key's lease is a small JSON file in the directory. Every change (acquire, renew, release)
reads the file, decides and rewrites it while holding an exclusive `fcntl.flock` on the
directory's lock file, so no two processes (or threads: each call opens the lock file anew, and
flock excludes separate opens within one process too) ever decide on the same state. A file is
replaced atomically (written to a temporary file, fsynced, renamed over), so a reader never
sees half a lease and a crash never leaves one.

Expiry is judged on the injected Clock, as the LeasePort contract demands, never on the files'
modification times: every contender on the host shares the system clock.

flock excludes processes on one host only. Several hosts need a lease they all reach (the
database row, a PostgreSQL advisory lock, Redis): a directory on a network file system is not
enough, as flock there is either local to each client or not supported at all.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

from engine.extend import Clock, Lease, LeaseError, LeaseExpired, LeaseNotOwned, PluginContext
from vortos_example_plugins._files import fsync_directory
from vortos_example_plugins._options import path_option

LOCK_FILE = ".lock"
STATE_SUFFIX = ".lease.json"


class FileLockLease:
    """Leases as JSON files in `directory` (created if missing), expiry judged on `clock`."""

    def __init__(self, directory: Path, clock: Clock) -> None:
        self.directory = directory
        self._clock = clock
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_path = directory / LOCK_FILE

    @classmethod
    def from_context(cls, context: PluginContext) -> FileLockLease:
        """The factory the `filelock` entry point names: the directory is the `directory`
        option, or `<db file>.leases` beside a SQLite database."""
        directory = path_option(
            context,
            "directory",
            lambda db: db.with_name(db.name + ".leases"),
            "/var/lib/vortos/leases",
        )
        return cls(directory, context.clock)

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        with self._locked():
            now = self._clock.now_ms()
            held = self._read(key)
            live = held is not None and held.expires_at > now
            if held is not None and live and held.token != token:
                return None
            # The holding token taking it again keeps the instant it first took it.
            acquired_at = held.acquired_at if held is not None and live else now
            lease = Lease(key, token, holder, acquired_at, now, now + ttl_ms)
            self._write(lease)
            return lease

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        with self._locked():
            now = self._clock.now_ms()
            held = self._read(key)
            if held is None:
                raise LeaseNotOwned(f"lease {key} is not held by anyone")
            if held.token != token:
                raise LeaseNotOwned(f"lease {key} is held by {held.holder}, not by this token")
            if held.expires_at <= now:
                raise LeaseExpired(f"lease {key} expired {now - held.expires_at} ms ago")
            lease = Lease(key, token, held.holder, held.acquired_at, now, now + ttl_ms)
            self._write(lease)
            return lease

    def release(self, key: str, token: str) -> None:
        with self._locked():
            held = self._read(key)
            if held is None:
                return
            if held.token == token:
                # Expired or not: the file is this token's, and nobody else's to remove.
                self._state_path(key).unlink()
                fsync_directory(self.directory)
                return
            if held.expires_at > self._clock.now_ms():
                raise LeaseNotOwned(f"lease {key} is held by {held.holder}, not by this token")

    def current(self, key: str) -> Lease | None:
        # No lock: a file is only ever replaced whole, so a read sees one lease or another.
        held = self._read(key)
        if held is None or held.expires_at <= self._clock.now_ms():
            return None
        return held

    def close(self) -> None:
        """Nothing to release: no file stays open between calls."""

    def _state_path(self, key: str) -> Path:
        # Keys hold colons ("scheduler:leader:shard-0-of-2"); quoting keeps any key one
        # plain file name in the directory.
        return self.directory / (quote(key, safe="") + STATE_SUFFIX)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock_path.open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self, key: str) -> Lease | None:
        path = self._state_path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            state: dict[str, Any] = json.loads(text)
            return Lease(
                key=key,
                token=str(state["token"]),
                holder=str(state["holder"]),
                acquired_at=int(state["acquired_at"]),
                renewed_at=int(state["renewed_at"]),
                expires_at=int(state["expires_at"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            # Never written by this driver (it replaces files whole): someone edited it.
            raise LeaseError(
                f"the lease file {path} is not a lease ({type(exc).__name__}: {exc}); delete "
                "it to free the lease"
            ) from None

    def _write(self, lease: Lease) -> None:
        path = self._state_path(lease.key)
        state = {
            "key": lease.key,
            "token": lease.token,
            "holder": lease.holder,
            "acquired_at": lease.acquired_at,
            "renewed_at": lease.renewed_at,
            "expires_at": lease.expires_at,
        }
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(state, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(temporary)
            raise
        # The rename itself is durable only once the directory is.
        fsync_directory(self.directory)
