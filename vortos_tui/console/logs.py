"""Where the in-process engine's log goes while the console owns the terminal.

Writing to stderr would scribble over the screen, so the log goes to --log-file when given, and
warnings and errors also appear as notices in the console.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from textual.app import App
from textual.notifications import SeverityLevel

from engine.domain.redact import ScrubbingFormatter, scrub
from engine.file_modes import open_private_append


class NoticeHandler(logging.Handler):
    """Warnings and errors as console notices, from whichever thread logged them."""

    def __init__(self, app: App[None]) -> None:
        super().__init__(level=logging.WARNING)
        self.app = app
        self._app_thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.app.is_running:
            return
        severity: SeverityLevel = "error" if record.levelno >= logging.ERROR else "warning"
        message = scrub(record.getMessage())
        try:
            if threading.get_ident() == self._app_thread:
                self.app.notify(message, title=record.name, severity=severity)
            else:
                self.app.call_from_thread(
                    self.app.notify, message, title=record.name, severity=severity
                )
        except RuntimeError:
            pass  # the app is shutting down: the notice has nowhere to go


@contextmanager
def route_logs(app: App[None], log_file: Path | None) -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    for handler in saved[1]:
        root.removeHandler(handler)
    handlers: list[logging.Handler] = [NoticeHandler(app)]
    stream = None
    if log_file is not None:
        # 0600 whatever the umask, never through a symlink: log lines name schedules, errors.
        stream = open_private_append(log_file)
        file_handler = logging.StreamHandler(stream)
        file_handler.setFormatter(
            ScrubbingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
        handlers.append(file_handler)
    root.setLevel(logging.INFO if log_file is not None else logging.WARNING)
    for handler in handlers:
        root.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        if stream is not None:
            stream.close()
        root.setLevel(saved[0])
        for handler in saved[1]:
            root.addHandler(handler)
