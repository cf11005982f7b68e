"""The command the PostgreSQL chaos test schedules (`vortos run --app tests.integration.chaos_app`):
each execution appends a line to the journal named by VORTOS_TEST_JOURNAL, so the test can count
how often each run's command ran, on which attempt and in which process."""

from __future__ import annotations

import os
import time

from engine import FireContext, schedulable

JOURNAL_ENV = "VORTOS_TEST_JOURNAL"


def note(text: str) -> None:
    # One write(2) of a short line with O_APPEND: lines from several processes never interleave.
    fd = os.open(os.environ[JOURNAL_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def stamp(word: str, fire: FireContext) -> None:
    note(f"{word} {fire.run_id} {fire.attempt} {os.getpid()} {time.time_ns() // 1_000_000}")


@schedulable("chaos-mark")
def chaos_mark(*, fire: FireContext) -> None:
    """Record this execution (`start RUN_ID ATTEMPT PID UNIX_MS`), work a little, so that kills
    land mid-command too, and record its end (`done ...`). It never fails."""
    stamp("start", fire)
    fire.wait_cancelled(0.1)
    stamp("done", fire)
