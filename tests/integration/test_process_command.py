"""The built-in `process` command, with real subprocesses: the allowlist, refusals at creation,
literal arguments, output tails, exit codes, timeouts, cwd and env, and cancellation.

Small shell-free programs are used wherever they do; /bin/sh only where a test needs stderr, an
exit status or a child process, always as `sh -c SCRIPT` with the values as its arguments.
"""

from __future__ import annotations

import os
import pwd
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, ManualClock, open_engine
from engine.commands.builtins import builtin_commands
from engine.commands.context import CommandFailed, FireContext
from engine.commands.process import TAIL_BYTES, ProcessAllowlist, ProcessRunner, process_command
from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.run import RunKind, RunState
from engine.domain.schedule import ScheduleSpec
from engine.domain.triggers import IntervalTrigger
from engine.ports.fire_queue import Fire, Outcome, Settlement
from engine.runtime.executor import CancelReason, execute

ECHO = "/bin/echo"
SLEEP = "/bin/sleep"
SH = "/bin/sh"
PWD = "/bin/pwd"
PRINTF = "/usr/bin/printf"
PRINTENV = "/usr/bin/printenv"
SEQ = "/usr/bin/seq"
ENV = "/usr/bin/env"
YES = "/usr/bin/yes"
ALLOWED = (ECHO, SLEEP, SH, PWD, PRINTF, PRINTENV, SEQ, ENV, YES)
# What the tests' owner lets a payload set, and where it may run (tmp_path is under it).
ENV_ALLOWED = ("BACKUP_TARGET", "BACKUP_LABEL")
CWD_ALLOWED = (tempfile.gettempdir(),)
WAIT_S = 10.0  # the most a test waits for a condition; reached only when it fails

pytestmark = pytest.mark.skipif(
    not all(os.access(p, os.X_OK) for p in ALLOWED), reason="needs coreutils and /bin/sh"
)

# Whether a process is gone is read from /proc.
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


@pytest.fixture
def process_engine(db_path: Path, clock: ManualClock) -> Iterator[Engine]:
    commands = builtin_commands(_allowlist())
    with open_engine(db_path, clock=clock, commands=commands) as opened:
        yield opened


def _spec(payload: dict[str, Any]) -> ScheduleSpec:
    return ScheduleSpec(
        name="backup", trigger=IntervalTrigger(60_000, 0), command="process", payload=payload
    )


def _context(run_id: int = 1) -> FireContext:
    return FireContext(
        run_id=run_id,
        tenant="default",
        schedule_id="sched-1",
        schedule_name="backup",
        slot_key=f"sched-1@{run_id}",
        slot_at=0,
        kind=RunKind.SCHEDULED,
        attempt=1,
    )


def _allowlist(allowed: tuple[str, ...] = ALLOWED) -> ProcessAllowlist:
    return ProcessAllowlist.of(allowed, env=ENV_ALLOWED, cwd=CWD_ALLOWED)


def _runner() -> ProcessRunner:
    return ProcessRunner(_allowlist())


def _run(*argv: str, **options: Any) -> str:
    """Run a process that must succeed; its recorded output."""
    result = _runner()(list(argv), fire=_context(), **options)
    assert result.exit_code == 0
    assert result.output is not None
    return result.output


def _fails(*argv: str, **options: Any) -> CommandFailed:
    with pytest.raises(CommandFailed) as failed:
        _runner()(list(argv), fire=_context(), **options)
    return failed.value


def _stdout(text: str) -> str:
    return f"--- stdout (last {TAIL_BYTES} bytes) ---\n{text}"


def _stderr(text: str) -> str:
    return f"--- stderr (last {TAIL_BYTES} bytes) ---\n{text}"


def _execute(
    payload: dict[str, Any], ctx: FireContext | None = None, allowed: tuple[str, ...] = ALLOWED
) -> Settlement:
    """Run the process command as a consumer does."""
    fire = Fire(
        run_id=1,
        tenant="default",
        schedule_id="sched-1",
        schedule_name="backup",
        slot_key="sched-1@1",
        slot_at=0,
        kind=RunKind.SCHEDULED,
        command="process",
        payload=payload,
        available_at=0,
        created_at=0,
        attempts=1,
    )
    command = process_command(_allowlist(allowed))
    return execute(command, fire, ctx or _context(), RetryPolicy, ManualClock(0))


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- the allowlist, and refusals when a schedule is created ----------------------------------


def test_a_program_on_the_allowlist_can_be_scheduled(process_engine: Engine) -> None:
    created = process_engine.service.create(
        _spec({"argv": [ECHO, "hello"], "timeout": "30s"}), actor="t"
    )
    assert created.command == "process"
    assert dict(created.payload) == {"argv": [ECHO, "hello"], "timeout": "30s"}


def test_a_program_outside_the_allowlist_is_refused_at_creation_and_nothing_is_stored(
    process_engine: Engine,
) -> None:
    with pytest.raises(InvalidInput) as refused:
        process_engine.service.create(_spec({"argv": ["/bin/rm", "-rf", "/tmp/x"]}), actor="t")
    message = str(refused.value)
    assert "'/bin/rm' is not on the process allowlist" in message
    assert ECHO in message  # it says what is allowed
    assert process_engine.service.schedules() == []


def test_a_program_named_without_its_path_is_refused_asking_for_the_full_path(
    process_engine: Engine,
) -> None:
    with pytest.raises(InvalidInput, match=r"'echo' is not on the process allowlist \(give the"):
        process_engine.service.create(_spec({"argv": ["echo", "hi"]}), actor="t")
    assert process_engine.service.schedules() == []


def test_a_path_that_normalises_to_an_allowed_program_is_accepted() -> None:
    assert ProcessAllowlist.of([ECHO]).check("/bin/../bin/./echo") == ECHO


def test_with_an_empty_allowlist_every_program_is_refused_saying_how_to_allow_one() -> None:
    with pytest.raises(InvalidInput, match=r"allowlist, which is empty.*VORTOS_PROCESS_ALLOW="):
        ProcessAllowlist.of([]).check(ECHO)


@pytest.mark.parametrize("entry", ["bin/echo", "echo", "./backup.sh"])
def test_a_relative_path_in_the_allowlist_is_refused(entry: str) -> None:
    with pytest.raises(InvalidInput, match=f"entry '{entry}' is not an absolute path"):
        ProcessAllowlist.of([ECHO, entry])


def test_blank_allowlist_entries_are_ignored() -> None:
    assert ProcessAllowlist.of(["", "  ", f" {ECHO} "]).executables == frozenset({ECHO})


def test_the_allowlist_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VORTOS_PROCESS_ALLOW", os.pathsep.join([ECHO, SLEEP]))
    assert ProcessAllowlist.from_env().executables == frozenset({ECHO, SLEEP})


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"argv": []}, "process argv is empty"),
        ({"argv": [ECHO], "cwd": "relative/dir"}, "cwd 'relative/dir' must be an absolute path"),
        ({"argv": [ECHO], "env": {"1ST": "x"}}, "env name '1ST' is not allowed"),
        ({"argv": [ECHO], "env": {"A-B": "x"}}, "env name 'A-B' is not allowed"),
        ({"argv": [ECHO], "env": {"A B": "x"}}, "env name 'A B' is not allowed"),
        ({"argv": [ECHO], "env": {"A=B": "x"}}, "env name 'A=B' is not allowed"),
        ({"argv": [ECHO], "env": {"": "x"}}, "env name '' is not allowed"),
        ({"argv": [ECHO], "env": {"OK": 1}}, "field 'env' of command 'process' must be"),
        ({"argv": [ECHO], "timeout": "0s"}, "timeout 0s is out of range"),
        (
            {"argv": [ECHO], "timeout": "8d"},
            "timeout 8d is out of range: use more than 0 and at most 7d",
        ),
        ({"argv": [ECHO], "timeout": "soon"}, "'soon' is not a duration"),
        ({"argv": [ECHO], "shell": True}, r"unknown field\(s\) shell"),
        ({"argv": ECHO}, "field 'argv' of command 'process' must be a list"),
    ],
)
def test_a_payload_the_process_command_cannot_run_is_refused_at_creation(
    process_engine: Engine, payload: dict[str, Any], expected: str
) -> None:
    with pytest.raises(InvalidInput, match=expected):
        process_engine.service.create(_spec(payload), actor="t")
    assert process_engine.service.schedules() == []


def test_a_program_dropped_from_the_allowlist_after_creation_does_not_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    payload = {"argv": [SH, "-c", 'echo ran > "$1"', "sh", str(marker)]}
    settlement = _execute(payload, allowed=(ECHO,))
    assert settlement.run_state is RunState.FAILED
    assert "not on the process allowlist" in (settlement.error or "")
    assert not marker.exists()


# --- running ---------------------------------------------------------------------------------


def test_the_program_runs_and_its_stdout_is_recorded() -> None:
    assert _run(ECHO, "hello", "world") == _stdout("hello world\n")


@pytest.mark.parametrize(
    "argument",
    [
        ";",
        "a; rm -rf /tmp/nothing",
        "$(id)",
        "`id`",
        "$HOME",
        "a | tee x",
        "*",
        "/*",
        "true && false",
        "a || b",
        "'single'",
        '"double"',
        "line one\nline two",
        "> out.txt",
        "~",
        "",
    ],
)
def test_shell_metacharacters_in_arguments_are_passed_literally(
    tmp_path: Path, argument: str
) -> None:
    assert _run(ECHO, "[", argument, "]", cwd=str(tmp_path)) == _stdout(f"[ {argument} ]\n")
    assert list(tmp_path.iterdir()) == []  # nothing redirected, nothing created


def test_each_argument_reaches_the_program_as_one_argument() -> None:
    arguments = ["a b", "", "*", "$(id)", "x;y", "new\nline", "'q'"]
    expected = "".join(f"<{a}>\n" for a in arguments)
    assert _run(PRINTF, "<%s>\\n", *arguments) == _stdout(expected)


def test_stdout_and_stderr_are_both_recorded() -> None:
    output = _run(SH, "-c", "echo to-out; echo to-err >&2")
    assert output == _stdout("to-out\n") + "\n" + _stderr("to-err\n")


def test_a_large_output_is_cut_to_its_last_bytes() -> None:
    full = "".join(f"{n}\n" for n in range(1, 3001)).encode()
    assert len(full) > TAIL_BYTES
    assert _run(SEQ, "1", "3000") == _stdout("…" + full[-TAIL_BYTES:].decode())


def test_a_non_zero_exit_fails_with_its_status_and_output() -> None:
    failed = _fails(SH, "-c", "echo partial; echo 'no space left' >&2; exit 3")
    assert str(failed).startswith("sh exited with status 3 after ")
    assert failed.exit_code == 3
    assert failed.output == _stdout("partial\n") + "\n" + _stderr("no space left\n")


def test_a_non_zero_exit_is_a_failed_attempt_with_the_exit_code_recorded() -> None:
    settlement = _execute({"argv": [SH, "-c", "echo oops >&2; exit 4"]})
    assert settlement.outcome is Outcome.FAIL
    assert settlement.exit_code == 4
    assert (settlement.error or "").startswith("sh exited with status 4")
    assert settlement.output == _stderr("oops\n")


def test_a_successful_run_records_exit_code_zero() -> None:
    settlement = _execute({"argv": [ECHO, "fine"]})
    assert (settlement.run_state, settlement.exit_code, settlement.output) == (
        RunState.COMPLETED,
        0,
        _stdout("fine\n"),
    )


def test_a_program_that_cannot_start_fails_saying_so(tmp_path: Path) -> None:
    missing = str(tmp_path / "not-there")
    runner = ProcessRunner(ProcessAllowlist.of([missing]))
    with pytest.raises(CommandFailed, match=f"cannot start {missing}: No such file"):
        runner([missing], fire=_context())


def test_the_working_directory_is_honoured(tmp_path: Path) -> None:
    assert _run(PWD, cwd=str(tmp_path)) == _stdout(f"{tmp_path.resolve()}\n")


def test_without_a_cwd_the_program_runs_in_the_root_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # the service's own directory (where its database may be)
    assert _run(PWD) == _stdout("/\n")


def test_allowed_env_entries_reach_the_program_as_written() -> None:
    env = {"BACKUP_TARGET": "with spaces; and $(symbols)", "BACKUP_LABEL": ""}
    output = _run(PRINTENV, "BACKUP_TARGET", "BACKUP_LABEL", env=env)
    assert output == _stdout("with spaces; and $(symbols)\n\n")


def test_the_child_inherits_nothing_of_the_service_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VORTOS_AUDIT_KEY", "k" * 64)
    monkeypatch.setenv("VORTOS_DB", "postgresql://svc:secret@db/prod")
    monkeypatch.setenv("BACKUP_TARGET", "the service's own value")
    monkeypatch.setenv("PATH", "/root/.local/bin:.:/usr/bin")
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    monkeypatch.delenv("TZ", raising=False)
    output = _run(ENV, env={"BACKUP_LABEL": "nightly"})
    seen = dict(line.split("=", 1) for line in output.splitlines()[1:])
    assert seen == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "de_DE.UTF-8",
        "HOME": pwd.getpwuid(os.geteuid()).pw_dir,
        "BACKUP_LABEL": "nightly",
        # The fire's own, not the service's: its stable key (FireContext.idempotency_key).
        "VORTOS_IDEMPOTENCY_KEY": _context().idempotency_key,
    }
    assert "secret" not in output


# --- timeouts and cancellation ---------------------------------------------------------------


def test_a_timeout_kills_the_process_and_fails_saying_it_timed_out() -> None:
    started = time.monotonic()
    failed = _fails(SLEEP, "30", timeout="1s")
    took = time.monotonic() - started
    assert took < 10
    assert str(failed).startswith("sleep timed out after 1s: killed (exit -15) after ")
    assert failed.exit_code == -signal.SIGTERM


def test_a_program_that_closes_its_output_is_still_killed_at_its_timeout() -> None:
    started = time.monotonic()
    failed = _fails(SH, "-c", "exec >&- 2>&-; exec sleep 30", timeout="1s")
    assert time.monotonic() - started < 10
    assert str(failed).startswith("sh timed out after 1s: killed")


def test_a_program_writing_without_end_is_kept_to_its_tail_and_killed_at_its_timeout() -> None:
    failed = _fails(YES, "vortos", timeout="1s")
    assert str(failed).startswith("yes timed out after 1s: killed")
    assert failed.output is not None
    assert failed.output.startswith(_stdout("…"))
    assert len(failed.output) < 2 * TAIL_BYTES


def test_a_timed_out_run_records_the_exit_code_in_its_settlement() -> None:
    settlement = _execute({"argv": [SLEEP, "30"], "timeout": "1s"})
    assert settlement.outcome is Outcome.FAIL
    assert settlement.exit_code == -signal.SIGTERM
    assert "timed out" in (settlement.error or "")


@needs_proc
def test_cancelling_kills_the_process_group_with_the_programs_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = 'sleep 30 & echo $! > "$1.tmp" && mv "$1.tmp" "$1"; wait'
    ctx = _context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(_execute, {"argv": [SH, "-c", script, "sh", str(pid_file)]}, ctx)
        _wait_for(pid_file.exists, "the program started its child")
        child = int(pid_file.read_text())
        try:
            assert _alive(child)
            started = time.monotonic()
            ctx.cancel(CancelReason.OVERLAP)
            settlement = running.result(timeout=WAIT_S)
            assert time.monotonic() - started < 5
            _wait_for(lambda: not _alive(child), "the child of the program is gone")
        finally:
            if _alive(child):
                os.kill(child, signal.SIGKILL)
    assert settlement.outcome is Outcome.COMPLETE
    assert settlement.run_state is RunState.CANCELLED
    assert settlement.exit_code == -signal.SIGTERM
    assert settlement.error == f"cancelled: {CancelReason.OVERLAP}"


@needs_proc
def test_a_process_stopped_by_shutdown_is_killed_and_its_fire_given_back(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "program.pid"
    script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 30'
    ctx = _context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(_execute, {"argv": [SH, "-c", script, "sh", str(pid_file)]}, ctx)
        _wait_for(pid_file.exists, "the program started")
        program = int(pid_file.read_text())
        ctx.cancel(CancelReason.SHUTDOWN)
        settlement = running.result(timeout=WAIT_S)
    assert settlement == Settlement(1, Outcome.RELEASE, RunState.DISPATCHED)
    assert not _alive(program)


def test_a_process_whose_run_was_cancelled_before_it_started_is_killed_at_once() -> None:
    ctx = _context()
    ctx.cancel(CancelReason.OVERLAP)
    started = time.monotonic()
    settlement = _execute({"argv": [SLEEP, "30"]}, ctx)
    assert time.monotonic() - started < 5
    assert settlement.run_state is RunState.CANCELLED


# --- known defects ---------------------------------------------------------------------------


def test_a_run_with_large_stdout_and_stderr_records_both_tails() -> None:
    settlement = _execute({"argv": [SH, "-c", "seq 1 3000; seq 1 3000 >&2"]})
    assert settlement.run_state is RunState.COMPLETED
    output = settlement.output or ""
    assert "--- stdout" in output
    assert "--- stderr" in output


def test_an_argument_with_a_nul_byte_is_refused_at_creation(process_engine: Engine) -> None:
    with pytest.raises(InvalidInput):
        process_engine.service.create(_spec({"argv": [ECHO, "a\x00b"]}), actor="t")
