"""Files the CLI writes for an operator (`audit export -o`): private, complete or absent, and
never written through a symlink or over an existing file unless told to (--force)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from engine.domain.errors import Conflict, InvalidInput
from engine.file_modes import current_file_access, written_privately


@contextmanager
def private_output(path: Path, *, force: bool) -> Iterator[TextIO]:
    """`path`, written whole at the private mode (0600, or 0640 for the control group in the
    shared-read layout) whatever the umask. An existing `path` is refused (exit 5) unless
    `force`, which replaces it atomically: a symlink there is replaced, never followed."""
    if path.is_dir():
        raise InvalidInput(
            f"{path} is a directory: give a file name such as {path / 'audit.jsonl'}"
        )
    if not path.parent.is_dir():
        raise InvalidInput(f"directory {path.parent} does not exist: create it first")
    exists = Conflict(f"{path} exists: choose a new file name, or --force to replace it")
    if not force and (path.exists() or path.is_symlink()):
        raise exists
    try:
        with written_privately(path, current_file_access(), replace=force) as handle:
            yield handle
    except FileExistsError:
        raise Conflict(f"{path} exists: choose a new file name, or --force to replace it") from None
    except PermissionError as exc:
        raise InvalidInput(
            f"cannot write {path}: {exc.strerror}; choose a writable place"
        ) from None
