"""The built-in `process` command: run an allowlisted executable, never through a shell.

The operator lists the executables that may run (absolute paths, in VORTOS_PROCESS_ALLOW,
separated by the OS path separator, or `--allow-exec`). A schedule names one of them as
`argv[0]`; every argument is passed as it is written, so shell metacharacters mean nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.commands.context import CommandFailed, CommandResult, FireContext
from engine.commands.registry import Command, command_from
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import DAY_MS, format_duration, parse_duration

ALLOW_ENV = "VORTOS_PROCESS_ALLOW"
DEFAULT_TIMEOUT_MS = 60 * 60 * 1000
MAX_TIMEOUT_MS = 7 * DAY_MS
TAIL_BYTES = 4096
# After SIGTERM on timeout or cancellation, the process group has this long before SIGKILL.
KILL_GRACE_S = 2.0
_ENV_NAME_OK = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True, slots=True)
class ProcessAllowlist:
    """The executables the process command may run, as absolute, normalised paths."""

    executables: frozenset[str] = frozenset()

    @classmethod
    def of(cls, paths: Iterable[str]) -> ProcessAllowlist:
        checked: set[str] = set()
        for raw in paths:
            entry = raw.strip()
            if not entry:
                continue
            if not os.path.isabs(entry):
                raise InvalidInput(
                    f"process allowlist entry {entry!r} is not an absolute path: list "
                    "executables by full path, e.g. /usr/local/bin/backup"
                )
            checked.add(os.path.normpath(entry))
        return cls(frozenset(checked))

    @classmethod
    def from_env(cls, extra: Iterable[str] = ()) -> ProcessAllowlist:
        listed = os.environ.get(ALLOW_ENV, "").split(os.pathsep)
        return cls.of([*listed, *extra])

    def check(self, program: str) -> str:
        normal = os.path.normpath(program) if os.path.isabs(program) else program
        if normal in self.executables:
            return normal
        if not self.executables:
            raise InvalidInput(
                f"{program!r} is not on the process allowlist, which is empty: an operator "
                f"allows executables with {ALLOW_ENV}=/full/path (or --allow-exec /full/path)"
            )
        hint = "" if os.path.isabs(program) else " (give the full path)"
        raise InvalidInput(
            f"{program!r} is not on the process allowlist{hint}; allowed: "
            f"{', '.join(sorted(self.executables))}; an operator adds executables with "
            f"{ALLOW_ENV} or --allow-exec"
        )


def _timeout_ms(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        raise InvalidInput("process timeout must be a duration such as '30s' or '5m'")
    ms = (
        round(value * 1000)
        if isinstance(value, int | float)
        else parse_duration(str(value), what="process timeout")
    )
    if not 0 < ms <= MAX_TIMEOUT_MS:
        raise InvalidInput(
            f"process timeout {format_duration(abs(ms))} is out of range: use more than 0 "
            "and at most 7d"
        )
    return ms


class ProcessRunner:
    """The process command itself: validated payloads in, exit code and output tails out."""

    def __init__(self, allowlist: ProcessAllowlist) -> None:
        self.allowlist = allowlist

    def check(self, payload: dict[str, Any]) -> dict[str, Any]:
        argv = payload["argv"]
        if not argv:
            raise InvalidInput("process argv is empty: give the program and its arguments")
        texts = [*argv, payload.get("cwd") or "", *(payload.get("env") or {}).items()]
        if any("\x00" in (t if isinstance(t, str) else "".join(t)) for t in texts):
            raise InvalidInput(
                "process argv, cwd and env cannot contain a NUL character: remove it"
            )
        self.allowlist.check(argv[0])
        if "timeout" in payload:
            _timeout_ms(payload["timeout"])
        cwd = payload.get("cwd")
        if cwd is not None and not os.path.isabs(cwd):
            raise InvalidInput(f"process cwd {cwd!r} must be an absolute path")
        for name in payload.get("env") or {}:
            if not name or not set(name) <= _ENV_NAME_OK or name[0].isdigit():
                raise InvalidInput(
                    f"process env name {name!r} is not allowed: letters, digits and '_'"
                )
        return payload

    def __call__(
        self,
        argv: list[str],
        timeout: str | int | float = "1h",
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        fire: FireContext,
    ) -> CommandResult:
        """Runs an allowlisted executable with an argv list, a timeout, a cwd and env."""
        program = self.allowlist.check(argv[0])  # the allowlist may have shrunk since
        limit_s = _timeout_ms(timeout) / 1000
        started = time.monotonic()
        try:
            child = subprocess.Popen(
                [program, *argv[1:]],
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill takes its children too
            )
        except OSError as exc:
            raise CommandFailed(f"cannot start {program}: {exc.strerror or exc}") from None
        stopped: list[str] = []

        def stop(why: str) -> None:
            stopped.append(why)
            _kill_group(child)

        fire.on_cancel(lambda: stop("cancelled"))
        try:
            out, err = child.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stop(f"timed out after {format_duration(round(limit_s * 1000))}")
            out, err = child.communicate()
        took = format_duration(max(0, round((time.monotonic() - started) * 1000)))
        output = _tails(out, err)
        code = child.returncode
        if stopped:
            raise CommandFailed(
                f"{Path(program).name} {stopped[0]}: killed (exit {code}) after {took}",
                output=output,
                exit_code=code,
            )
        if code != 0:
            raise CommandFailed(
                f"{Path(program).name} exited with status {code} after {took}",
                output=output,
                exit_code=code,
            )
        return CommandResult(output=output, exit_code=code)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after a grace."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def _tails(out: bytes, err: bytes) -> str:
    parts = []
    for label, data in (("stdout", out), ("stderr", err)):
        if data:
            text = data[-TAIL_BYTES:].decode("utf-8", errors="replace")
            cut = "…" if len(data) > TAIL_BYTES else ""
            parts.append(f"--- {label} (last {TAIL_BYTES} bytes) ---\n{cut}{text}")
    return "\n".join(parts)


def process_command(allowlist: ProcessAllowlist) -> Command:
    runner = ProcessRunner(allowlist)
    return command_from(
        "process",
        runner.__call__,
        "runs an allowlisted executable (argv list, no shell)",
        check=runner.check,
    )
