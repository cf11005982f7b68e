"""The built-in `process` command: run an allowlisted executable, never through a shell.

The service's owner lists the executables that may run (absolute paths, in
VORTOS_PROCESS_ALLOW, separated by the OS path separator, or `--allow-exec`). A schedule names
one of them as `argv[0]`; every argument is passed as it is written, so shell metacharacters
mean nothing. Every argument is the operator's to choose: allowlist only programs whose every
argument you would let an operator choose (not /bin/sh, not an interpreter, not /usr/bin/env).

The child gets a clean environment (engine.commands.process_env): a minimal base, the fire's
VORTOS_IDEMPOTENCY_KEY, and only the payload variables the owner allows (process_env_allow),
never the service's own; it runs in
`/` or in a directory inside process_cwd_allow; its stdin is /dev/null, no other descriptor
of the service is open in it, its umask is 077, and it leads its own process group.
"""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.commands.context import CommandFailed, CommandResult, FireContext
from engine.commands.process_env import (
    CHILD_UMASK,
    check_allowed_name,
    check_env_name,
    child_environment,
    cwd_allow_from_env,
    env_allow_from_env,
    working_directory,
)
from engine.commands.registry import Command, command_from
from engine.domain.errors import InvalidInput
from engine.domain.timeutil import DAY_MS, format_duration, parse_duration

ALLOW_ENV = "VORTOS_PROCESS_ALLOW"
# The child's copy of FireContext.idempotency_key.
IDEMPOTENCY_ENV = "VORTOS_IDEMPOTENCY_KEY"
MAX_TIMEOUT_MS = 7 * DAY_MS
TAIL_BYTES = 4096
# After SIGTERM on timeout or cancellation, the process group has this long before SIGKILL.
KILL_GRACE_S = 2.0
# After the kill, how long the output pipes may stay open (a grandchild that left the group
# holds them) before the run stops reading them.
DRAIN_S = 2 * KILL_GRACE_S
_READ_CHUNK = 64 * 1024
_SERVER_DECIDES = (
    "this process only relays process schedules to its control socket's server, whose "
    "allowlists decide; it runs none"
)


@dataclass(frozen=True, slots=True)
class ProcessAllowlist:
    """What the service's owner lets a process payload name: the executables (absolute,
    normalised paths), the environment variables it may set (process_env_allow) and the
    directories it may run in (process_cwd_allow).

    `server_decides` is a control socket's client's: it checks what needs no owner's list and
    leaves the lists to the server, whose own settings decide (the operator's do not)."""

    executables: frozenset[str] = frozenset()
    env_names: frozenset[str] = frozenset()
    cwd_dirs: tuple[str, ...] = ()
    server_decides: bool = False

    @classmethod
    def of(
        cls, paths: Iterable[str], *, env: Iterable[str] = (), cwd: Iterable[str] = ()
    ) -> ProcessAllowlist:
        """`env` and `cwd` as the settings parse them (engine.commands.process_env)."""
        names = frozenset(env)
        for name in names:
            check_env_name(name)  # a name that can never be allowed is refused, not dropped
        dirs = tuple(cwd)
        for directory in dirs:
            if not os.path.isabs(directory):
                raise InvalidInput(
                    f"process cwd allowlist entry {directory!r} is not an absolute path"
                )
        return cls(cls._executables(paths), names, dirs)

    @classmethod
    def for_control_client(cls) -> ProcessAllowlist:
        return cls(server_decides=True)

    @staticmethod
    def _executables(paths: Iterable[str]) -> frozenset[str]:
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
        return frozenset(checked)

    @classmethod
    def from_env(
        cls,
        extra: Iterable[str] = (),
        *,
        env: Iterable[str] | None = None,
        cwd: Iterable[str] | None = None,
    ) -> ProcessAllowlist:
        """The executables of VORTOS_PROCESS_ALLOW and `extra`; `env` and `cwd` as given (the
        settings'), else from VORTOS_PROCESS_ENV_ALLOW and VORTOS_PROCESS_CWD_ALLOW."""
        listed = os.environ.get(ALLOW_ENV, "").split(os.pathsep)
        return cls.of(
            [*listed, *extra],
            env=env_allow_from_env() if env is None else env,
            cwd=cwd_allow_from_env() if cwd is None else cwd,
        )

    def check(self, program: str) -> str:
        normal = os.path.normpath(program) if os.path.isabs(program) else program
        if normal in self.executables:
            return normal
        if not self.executables:
            raise InvalidInput(
                f"{program!r} is not on the process allowlist, which is empty: the service's "
                f"owner allows executables with {ALLOW_ENV}=/full/path (or --allow-exec "
                "/full/path)"
            )
        hint = "" if os.path.isabs(program) else " (give the full path)"
        raise InvalidInput(
            f"{program!r} is not on the process allowlist{hint}; allowed: "
            f"{', '.join(sorted(self.executables))}; the service's owner adds executables with "
            f"{ALLOW_ENV} or --allow-exec"
        )


def _timeout_ms(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        raise InvalidInput("process timeout must be a duration such as '30s' or '5m'")
    if isinstance(value, int | float):
        ms = round(value * 1000) if math.isfinite(value) else 0  # inf and nan: out of range
    else:
        ms = parse_duration(str(value), what="process timeout")
    if not 0 < ms <= MAX_TIMEOUT_MS:
        # As given: -1 shown as a duration read "1s", and 0.0001 as "0s".
        given = value if isinstance(value, str) else repr(value)
        raise InvalidInput(
            f"process timeout {given} is out of range: use more than 0 and at most 7d"
        )
    return ms


class ProcessRunner:
    """The process command itself: validated payloads in, exit code and output tails out."""

    def __init__(self, allowlist: ProcessAllowlist) -> None:
        self.allowlist = allowlist

    def check(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Refuses what cannot run (InvalidInput): at `schedule add`/`edit`, and again by the
        consumer before each run, when the owner's lists may have changed."""
        argv = payload["argv"]
        if not argv:
            raise InvalidInput("process argv is empty: give the program and its arguments")
        env = payload.get("env") or {}
        texts = [*argv, payload.get("cwd") or "", *env, *env.values()]
        if any("\x00" in t for t in texts):
            raise InvalidInput(
                "process argv, cwd and env cannot contain a NUL character: remove it"
            )
        if "timeout" in payload:
            _timeout_ms(payload["timeout"])
        cwd = payload.get("cwd")
        if cwd is not None and not os.path.isabs(cwd):
            raise InvalidInput(f"process cwd {cwd!r} must be an absolute path")
        for name in env:
            check_env_name(name)
        if self.allowlist.server_decides:
            return payload
        self.allowlist.check(argv[0])
        for name in env:
            check_allowed_name(name, self.allowlist.env_names)
        working_directory(cwd, self.allowlist.cwd_dirs)
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
        if self.allowlist.server_decides:
            raise CommandFailed(_SERVER_DECIDES)
        # Each checked again, here: the lists may have shrunk, a symlink may have been swapped.
        program = self.allowlist.check(argv[0])
        environment = child_environment(env or {}, self.allowlist.env_names)
        # The fire's stable key (see FireContext): a payload cannot set a VORTOS_* name.
        environment[IDEMPOTENCY_ENV] = fire.idempotency_key
        directory = working_directory(cwd, self.allowlist.cwd_dirs)
        limit_s = _timeout_ms(timeout) / 1000
        started = time.monotonic()
        child = _start(program, argv[1:], directory, environment)
        stopped: list[str] = []

        def stop(why: str) -> None:
            stopped.append(why)
            _kill_group(child)

        fire.on_cancel(lambda: stop("cancelled"))
        deadline = started + limit_s
        timed_out = f"timed out after {format_duration(round(limit_s * 1000))}"
        out, err = _read_tails(
            child, deadline, on_timeout=lambda: stop(timed_out), stopped=lambda: bool(stopped)
        )
        if not stopped:  # it closed its output and may still run: the timeout holds
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop(timed_out)
        child.wait()
        return _result(program, child, out, err, stopped, started)


def _start(
    program: str, args: list[str], directory: str, environment: dict[str, str]
) -> subprocess.Popen[bytes]:
    """The child, started with nothing of the service's but what was checked."""
    try:
        return subprocess.Popen(
            [program, *args],
            cwd=directory,  # resolved: what was checked is what the child gets
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,  # none of the service's descriptors (the database's) leak in
            umask=CHILD_UMASK,
            start_new_session=True,  # its own process group: a kill takes its children too
        )
    except OSError as exc:
        raise CommandFailed(f"cannot start {program}: {exc.strerror or exc}") from None


def _result(
    program: str,
    child: subprocess.Popen[bytes],
    out: _Tail,
    err: _Tail,
    stopped: list[str],
    started: float,
) -> CommandResult:
    """The ended child's result: its output tails, or CommandFailed when it was stopped (the
    first reason why) or exited non-zero."""
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


class _Tail:
    """The last TAIL_BYTES of a stream, and how much it wrote in all: a program that writes
    without end costs the service TAIL_BYTES of memory, not what it wrote."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.kept += chunk
        del self.kept[:-TAIL_BYTES]


def _read_tails(
    child: subprocess.Popen[bytes],
    deadline: float,
    *,
    on_timeout: Callable[[], None],
    stopped: Callable[[], bool],
) -> tuple[_Tail, _Tail]:
    """Read the child's stdout and stderr until both close, keeping their tails; past
    `deadline`, call `on_timeout` once. Once the child was stopped (timed out or cancelled),
    the pipes get DRAIN_S more: a grandchild that left the group does not hold the run."""
    assert child.stdout is not None
    assert child.stderr is not None
    tails = {child.stdout.fileno(): _Tail(), child.stderr.fileno(): _Tail()}
    drained_by: float | None = None
    with selectors.DefaultSelector() as selector:
        for fd in tails:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if drained_by is None and stopped():
                drained_by = now + DRAIN_S
            if drained_by is not None and now >= drained_by:
                break
            if drained_by is None and now >= deadline:
                on_timeout()
                continue
            # Woken at least every KILL_GRACE_S to notice a cancel made by another thread.
            until = deadline if drained_by is None else drained_by
            for key, _ in selector.select(min(KILL_GRACE_S, max(0.0, until - now))):
                chunk = os.read(key.fd, _READ_CHUNK)
                if chunk:
                    tails[key.fd].add(chunk)
                else:
                    selector.unregister(key.fd)
    child.stdout.close()
    child.stderr.close()
    out, err = tails.values()
    return out, err


def _tails(out: _Tail, err: _Tail) -> str:
    parts = []
    for label, tail in (("stdout", out), ("stderr", err)):
        if tail.total:
            text = bytes(tail.kept).decode("utf-8", errors="replace")
            cut = "…" if tail.total > TAIL_BYTES else ""
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
