"""An audit sink writing a JSON-lines file: one line per entry, every field of it.

Entries are appended and the file is flushed and fsynced before `deliver` returns, so an
acknowledged entry survives a crash. Delivery is at least once, so the sink remembers the last
sequence number it holds of each chain (read back from the file when it opens) and skips what
is at or below it.

A crash in the middle of a write can leave a torn last line; it was never acknowledged, so it
will be delivered again. Opening the file cuts such a line off, so the copy stays one whole
entry per line. Processes on one host may share the file (leadership, and with it the
shipping, can move between them): each write is made under an exclusive flock, after reading
whatever another process appended since.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from engine.extend import AuditEntry, PluginContext
from vortos_example_plugins._files import fsync_directory
from vortos_example_plugins._options import path_option


class DamagedCopy(Exception):
    """A line before the last is not an entry: the file was edited or corrupted."""


def encode(entry: AuditEntry) -> bytes:
    """One line of the file: every field of `entry`, as compact UTF-8 JSON."""
    text = json.dumps(entry.to_json(), ensure_ascii=False, separators=(",", ":"))
    return text.encode() + b"\n"


def read_copy(path: Path) -> list[AuditEntry]:
    """The entries the file holds, in the order they were stored; a torn last line is left
    out, as it was never acknowledged. An empty list when there is no file yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    entries, _ = _parse(data, path, 0)
    return entries


def _parse(data: bytes, path: Path, offset: int) -> tuple[list[AuditEntry], int]:
    """The entries in `data` (the file's bytes from `offset`) and the length of its whole
    lines; anything after that is a torn last line."""
    entries: list[AuditEntry] = []
    whole = 0
    # Split on b"\n" only: str.splitlines would also split inside an entry at U+2028 and
    # other characters JSON leaves unescaped.
    lines = data.split(b"\n")
    for line in lines[:-1]:  # the last piece has no newline: torn, or empty
        try:
            entries.append(AuditEntry.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            # A whole line was written in one piece before its delivery was acknowledged:
            # cutting it off would lose an entry that will never be delivered again.
            raise DamagedCopy(
                f"the audit copy {path} is damaged at byte {offset + whole} ({exc}); move it "
                "aside and let the sink write a new copy from the database"
            ) from None
        whole += len(line) + 1
    return entries, whole


class JsonlAuditSink:
    """Appends every delivered entry to the JSON-lines file `path` (created if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._guard = threading.Lock()  # deliveries of several chains may come on threads
        self._last_seq: dict[str, int] = {}
        self._known_size = 0  # the file's length as far as this sink has read it
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        # Unbuffered: a write that fails must leave nothing behind to be written later.
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if created:
                fsync_directory(path.parent)
            with self._exclusive():
                self._catch_up()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_context(cls, context: PluginContext) -> JsonlAuditSink:
        """The factory the `jsonl` entry point names: the file is the `path` option, or
        `audit.jsonl` in a SQLite database's directory."""
        path = path_option(
            context, "path", lambda db: db.parent / "audit.jsonl", "/var/log/vortos/audit.jsonl"
        )
        return cls(path)

    def deliver(self, entries: Sequence[AuditEntry]) -> None:
        if not entries:
            return
        with self._guard, self._exclusive():
            self._catch_up()
            last = dict(self._last_seq)
            lines = []
            for entry in entries:
                if entry.seq <= last.get(entry.chain, 0):
                    continue  # stored already: this is a redelivery
                lines.append(encode(entry))
                last[entry.chain] = entry.seq
            if not lines:
                return
            batch = b"".join(lines)
            fd = self._open_fd()
            try:
                written = 0
                while written < len(batch):
                    written += os.write(fd, batch[written:])
                os.fsync(fd)
            except BaseException:
                # Not acknowledged, so it comes again: leave no part of it to be appended to.
                with suppress(OSError):
                    os.ftruncate(fd, self._known_size)
                raise
            self._known_size += len(batch)
            self._last_seq = last

    def close(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"the audit sink on {self.path} is closed")
        return self._fd

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        fd = self._open_fd()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _catch_up(self) -> None:
        """Read what was appended since this sink last looked (everything, at open), and cut
        off a torn last line. Called holding the flock."""
        fd = self._open_fd()
        size = os.fstat(fd).st_size
        if size == self._known_size:
            return
        if size < self._known_size:  # replaced or cut short behind our back: start over
            self._known_size = 0
            self._last_seq.clear()
        with self.path.open("rb") as reader:
            reader.seek(self._known_size)
            data = reader.read(size - self._known_size)
        entries, whole = _parse(data, self.path, self._known_size)
        for entry in entries:
            self._last_seq[entry.chain] = max(entry.seq, self._last_seq.get(entry.chain, 0))
        self._known_size += whole
        if self._known_size < size:
            os.ftruncate(fd, self._known_size)
            os.fsync(fd)
