"""Who may read the files Vortos writes, whatever the umask: the SQLite database and its
-wal/-shm, the audit key, audit exports, the console's log file.

Two layouts (the `operator_file_access` setting, with a `control_group`):
- shared-read (`read`, the default): the database files are 0640 and the control group's, so
  operators may read them (and never write them); everything else is 0600;
- socket-only (`none`), or no control group: every file is 0600, the writing account's alone;
  operators read through the control socket.
The audit key is 0600 in both: it is the service account's alone.

A file is created at its mode with no window (os.open with 0600, which a umask can only narrow,
then fchown/fchmod on the open descriptor before anything is written), never through a symlink
(O_NOFOLLOW) and never over an existing file (O_EXCL). An existing file looser than its layout
is tightened by its owner (`vortos run` does, and logs it) and reported by the doctor
(storage.file_modes); a file is never made more open than it is.
"""

from __future__ import annotations

import grp
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from engine.domain.errors import InvalidInput

PRIVATE = 0o600
GROUP_READ = 0o640
READ = "read"  # operator_file_access values
NONE = "none"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class FileAccess:
    """The database files' readers: the owner alone (group None), or also `group`."""

    group: str | None = None

    @property
    def mode(self) -> int:
        return PRIVATE if self.group is None else GROUP_READ

    def gid(self) -> int | None:
        return None if self.group is None else group_id(self.group)

    def describe(self) -> str:
        return f"{self.mode:04o}" + ("" if self.group is None else f", group {self.group}")


OWNER_ONLY = FileAccess()


def group_id(group: str) -> int:
    """The id of the control group `group`, refused with what to do when there is none."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise InvalidInput(
            f"no group {group!r} on this host: create it (`groupadd {group}`) and add the "
            "operators to it, or name another with --control-group"
        ) from None


def file_access(control_group: str | None, operator_file_access: str = READ) -> FileAccess:
    """The database files' layout for these settings."""
    if control_group is None or operator_file_access == NONE:
        return OWNER_ONLY
    return FileAccess(control_group)


# The layout of the files this process writes: set once from the settings by the CLI (and by
# `vortos run` with its --control-group); owner-only for any other caller of the library.
_current = OWNER_ONLY


def use_file_access(access: FileAccess) -> None:
    global _current  # noqa: PLW0603 - one process, one layout: see above
    _current = access


def current_file_access() -> FileAccess:
    return _current


# -- creating -------------------------------------------------------------------------------


def create_private(path: Path, access: FileAccess = OWNER_ONLY) -> int:
    """A new file at `path`, open for writing, already at `access`'s mode and group; raises
    FileExistsError when anything (a symlink too) is there."""
    fd = os.open(path, _CREATE, PRIVATE)
    try:
        _settle(fd, access)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd


def _settle(fd: int, access: FileAccess) -> None:
    gid = access.gid()
    if gid is not None and os.fstat(fd).st_gid != gid:
        os.fchown(fd, -1, gid)  # before any group bit is set: no other group ever reads it
    os.fchmod(fd, access.mode)  # exactly: a umask such as 0277 must not leave it 0400


@contextmanager
def written_privately(
    path: Path, access: FileAccess = OWNER_ONLY, *, replace: bool = False
) -> Iterator[TextIO]:
    """Write a whole file that appears at `path` complete or not at all: written aside (a new
    private file in the same directory) and then linked into place, which refuses an existing
    `path` (FileExistsError), or, with `replace`, renamed over it: a symlink at `path` is then
    replaced itself, never followed, so whatever it points to is untouched."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = create_private(aside, access)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(aside, path)
        else:
            os.link(aside, path, follow_symlinks=False)
    finally:
        aside.unlink(missing_ok=True)


def open_private_append(path: Path, access: FileAccess = OWNER_ONLY) -> TextIO:
    """A log file to append to: created at `access`'s mode, or the existing one (made 0600
    when it is looser); never through a symlink."""
    try:
        try:
            fd = create_private(path, access)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & ~PRIVATE:
                os.fchmod(fd, mode & PRIVATE)  # an existing log of ours, made private
    except OSError as exc:
        raise InvalidInput(
            f"cannot open {path} to append to: {exc.strerror}; give a regular file this "
            "account may write (a symlink is refused)"
        ) from None
    return os.fdopen(fd, "a", encoding="utf-8")


# -- existing files -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LooseFile:
    """A file more open than its layout allows."""

    path: Path
    mode: int
    group: str
    expected: FileAccess
    world: bool  # others may read or write it

    def describe(self) -> str:
        return (
            f"{self.path} is {self.mode:04o} (group {self.group}); it should be "
            f"{self.expected.describe()}"
        )

    def fix(self) -> str:
        mode = self.mode & self.expected.mode
        if self.expected.group is None or not mode & 0o070:
            return f"chmod {mode & 0o700:04o} {self.path}"
        return f"chgrp {self.expected.group} {self.path} && chmod {mode:04o} {self.path}"


def database_files(db: Path) -> list[Path]:
    """The SQLite database and the files SQLite keeps beside it."""
    return [db, *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


def loose(path: Path, access: FileAccess) -> LooseFile | None:
    """What is wrong with `path`'s mode for `access` (None: nothing, or no such file)."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    mode = stat.S_IMODE(st.st_mode)
    wrong_group = bool(mode & 0o070) and (
        access.group is None or st.st_gid != _gid_or_none(access.group)
    )
    if not mode & ~access.mode & 0o7777 and not wrong_group:
        return None
    return LooseFile(path, mode, _group_name(st.st_gid), access, world=bool(mode & 0o007))


def tighten(path: Path, access: FileAccess) -> LooseFile | None:
    """Make `path` no more open than `access` (never more open than it is). Returns what was
    wrong (None: nothing); raises PermissionError when this account may not change it."""
    found = loose(path, access)
    if found is None:
        return None
    gid = access.gid()
    keep = found.mode & access.mode
    if gid is not None and keep & 0o070 and path.stat().st_gid != gid:
        os.chmod(path, keep & 0o700)  # owner-only while the group changes
        os.chown(path, -1, gid)
    os.chmod(path, keep)
    return found


def _gid_or_none(group: str) -> int | None:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def vortos_files(
    db: Path | None, key_file: Path | None, access: FileAccess
) -> list[tuple[Path, FileAccess]]:
    """Each file of a deployment with the access it may have: the SQLite database's files
    (`access`) and the audit key file (the owner's alone)."""
    files = [(path, access) for path in database_files(db)] if db is not None else []
    return files + ([(key_file, OWNER_ONLY)] if key_file is not None else [])


def tighten_all(files: list[tuple[Path, FileAccess]]) -> list[str]:
    """Tighten each of `files` that is looser than its access; one line per file said."""
    said = []
    for path, access in files:
        try:
            found = tighten(path, access)
        except (PermissionError, InvalidInput) as exc:
            problem = loose(path, access)
            fix = f": run `{problem.fix()}` as its owner" if problem is not None else ""
            said.append(f"cannot make {path} private ({exc}){fix}")
            continue
        if found is not None:
            now = stat.S_IMODE(path.stat().st_mode)
            said.append(f"made {path} private: it was {found.mode:04o}, it is now {now:04o}")
    return said
