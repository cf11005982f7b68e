"""The control socket, served in this process and used as this process's own account: what it
accepts, what it refuses, and that a client cannot say who it is (the kernel does)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine import (
    Engine,
    IntervalTrigger,
    ManualClock,
    NotFound,
    ScheduleSpec,
    ScheduleStatus,
    open_engine,
)
from engine.control import (
    ControlClient,
    ControlServer,
    ControlUnavailable,
    RemoteService,
    ServerBusy,
)
from engine.control.server import ConnectionLimits
from engine.control.wire import MAX_LINE, decode, encode
from engine.domain.access import Grant, PermissionDenied, Role
from engine.domain.approvals import ApprovalRequired
from engine.domain.audit import tenant_chain
from engine.domain.errors import InvalidInput, StaleVersion, StorageError
from engine.domain.timeutil import MINUTE_MS
from tests.conftest import T0, run_cli

ME = pwd.getpwuid(os.getuid()).pw_name


def spec(name: str, tenant: str = "acme", *, sensitive: bool = False) -> ScheduleSpec:
    return ScheduleSpec(
        name, IntervalTrigger(MINUTE_MS, T0), "noop", tenant=tenant, sensitive=sensitive
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket's path has at most 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="vt-") as where:
        yield Path(where)


@pytest.fixture
def served(tmp_path: Path, short_dir: Path) -> Iterator[tuple[Engine, Path, Path]]:
    """A governed database (this account operates acme; 'boss' is admin) served on a socket."""
    db = tmp_path / "vortos.db"
    clock = ManualClock(T0)
    with open_engine(db, clock=clock) as trusted:
        trusted.service.create(spec("report"), actor="setup")
        trusted.service.create(spec("ledger", "globex"), actor="setup")
        trusted.service.create(spec("payroll", sensitive=True), actor="setup")
        trusted.storage.operators.grant(Grant("boss", Role.ADMIN), by="setup", at=T0)
        trusted.storage.operators.grant(Grant(ME, Role.OPERATOR, "acme"), by="setup", at=T0)
    path = short_dir / "control.sock"
    with (
        open_engine(db, clock=clock, enforce=True) as server_engine,
        server_engine.serve_control(path),
    ):
        yield server_engine, db, path


def client(db: Path, path: Path) -> Engine:
    return open_engine(db, create=False, control_socket=path)


def raw(path: Path, *lines: bytes) -> list[dict[str, object]]:
    """Send these lines on one connection; the answers, until the server closes."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(str(path))
    for line in lines:
        conn.sendall(line)
    conn.shutdown(socket.SHUT_WR)
    with conn.makefile("rb") as stream:
        answers = [decode(line) for line in stream]
    conn.close()
    return answers


def test_the_server_names_the_caller_by_its_account_and_the_socket_is_0660(
    served: tuple[Engine, Path, Path],
) -> None:
    _, db, path = served
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    with client(db, path) as engine:
        assert isinstance(engine.service, RemoteService)
        assert engine.service.whoami() == ME


def test_a_change_is_made_by_the_server_as_the_callers_account_whatever_actor_it_names(
    served: tuple[Engine, Path, Path],
) -> None:
    server_engine, db, path = served
    with client(db, path) as engine:
        paused = engine.service.pause("report", actor="boss", tenant="acme", note="maintenance")
        assert paused.status is ScheduleStatus.PAUSED
        assert paused.pause_note == "maintenance"
        newest = server_engine.storage.audit.latest(tenant_chain("acme"), limit=1)[0]
        assert (newest.event, newest.actor) == ("schedule.paused", ME)
        # 'boss' is an admin; this account is not, so naming boss gains nothing.
        with pytest.raises(PermissionDenied, match=f"{ME} may not pause in tenant globex"):
            engine.service.pause("ledger", actor="boss", tenant="globex")
        with pytest.raises(PermissionDenied, match="needs the admin role"):
            engine.service.grant_role(ME, Role.ADMIN, actor="boss")


def test_every_change_goes_through_and_comes_back_as_the_same_types(
    served: tuple[Engine, Path, Path],
) -> None:
    server_engine, db, path = served
    assert isinstance(server_engine.clock, ManualClock)
    server_engine.clock.advance(600)  # the server's clock decides what is past
    with client(db, path) as engine:
        service = engine.service
        made = service.create(spec("export"), actor=ME)
        assert made.name == "export"
        assert service.pause("export", actor=ME, tenant="acme").status is ScheduleStatus.PAUSED
        resumed = service.resume("export", actor=ME, tenant="acme")
        assert resumed.status is ScheduleStatus.ACTIVE
        run = service.trigger("export", actor=ME, tenant="acme")
        assert run.schedule_name == "export"
        report = service.backfill(
            "export", start_ms=T0, end_ms=T0 + 3 * MINUTE_MS, actor=ME, tenant="acme"
        )
        assert (report.slots, report.dispatched) == (3, 3)
        assert service.requeue(None, actor=ME, tenant="acme") == 0
        assert service.purge(None, actor=ME, tenant="acme") == 0
        with pytest.raises(StaleVersion):
            service.pause("export", actor=ME, tenant="acme", expected_version=1)
        deleted = service.delete("export", actor=ME, tenant="acme")
        assert deleted.id == made.id
        with pytest.raises(NotFound):
            service.get("export", tenant="acme", actor=ME)


def test_a_sensitive_change_waits_and_the_request_comes_back_readable(
    served: tuple[Engine, Path, Path],
) -> None:
    server_engine, db, path = served
    with client(db, path) as engine:
        with pytest.raises(ApprovalRequired) as waiting:
            engine.service.trigger("payroll", actor=ME, tenant="acme")
        assert waiting.value.approval.requested_by == ME
        assert waiting.value.exit_code == 6
        with pytest.raises(PermissionDenied, match="cannot approve it"):
            engine.service.approve(waiting.value.approval.id, actor="boss")
    server_engine.service.approve(waiting.value.approval.id, actor="boss")
    with client(db, path) as engine:
        assert engine.service.trigger("payroll", actor=ME, tenant="acme").kind.value == "manual"


def test_reads_stay_local_and_narrowed_to_the_callers_tenants(
    served: tuple[Engine, Path, Path],
) -> None:
    _, db, path = served
    with client(db, path) as engine:
        assert {s.tenant for s in engine.service.schedules(actor=ME)} == {"acme"}
        with pytest.raises(PermissionDenied):
            engine.service.get("ledger", tenant="globex", actor=ME)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"not json\n", "not JSON"),
        (b"[1, 2]\n", "not a JSON object"),
        (encode({"v": 99, "op": "hello"}), "protocol version 99"),
        (encode({"v": 1, "op": "format_disk"}), "unknown operation 'format_disk'"),
        (encode({"v": 1, "op": "pause", "args": []}), "'args' must be an object"),
        (encode({"v": 1, "op": "pause", "args": {"name": 7}}), "'name' must be text"),
        (encode({"v": 1, "op": "create", "args": {"spec": {"name": "x"}}}), "malformed schedule"),
        (
            encode(
                {
                    "v": 1,
                    "op": "pause",
                    "args": {"name": "report", "tenant": "acme", "expected_version": "1"},
                }
            ),
            "'expected_version' must be an integer",
        ),
        (
            encode({"v": 1, "op": "requeue", "args": {"run_ids": [1, "2"]}}),
            "'run_ids' must be a list of integers",
        ),
    ],
)
def test_a_bad_request_gets_an_error_that_says_what_is_wrong_and_changes_nothing(
    served: tuple[Engine, Path, Path], line: bytes, expected: str
) -> None:
    server_engine, _, path = served
    before = server_engine.storage.audit.head(tenant_chain("acme"))
    answers = raw(path, line)
    assert answers[0]["ok"] is False
    error = answers[0]["error"]
    assert isinstance(error, dict)
    assert expected in str(error["message"])
    assert server_engine.storage.audit.head(tenant_chain("acme")) == before


def test_an_oversized_request_is_refused_and_the_connection_closed(
    served: tuple[Engine, Path, Path],
) -> None:
    _, _, path = served
    answers = raw(path, b"x" * (MAX_LINE + 10) + b"\n", encode({"v": 1, "op": "hello"}))
    assert len(answers) == 1
    assert "more than" in str(answers[0]["error"])


def test_one_connection_may_ask_several_times(served: tuple[Engine, Path, Path]) -> None:
    _, _, path = served
    hello = encode({"v": 1, "op": "hello"})
    answers = raw(path, hello, hello, hello)
    assert [a["result"] for a in answers] == [{"operator": ME, "version": 1}] * 3


def test_nothing_serving_the_socket_is_a_clear_error(tmp_path: Path, short_dir: Path) -> None:
    db = tmp_path / "vortos.db"
    open_engine(db).close()
    with (
        client(db, short_dir / "absent.sock") as engine,
        pytest.raises(ControlUnavailable, match="the scheduler service is not running"),
    ):
        engine.service.pause("report", actor=ME)


def test_a_stale_socket_file_is_replaced_and_anything_else_is_refused(
    tmp_path: Path, short_dir: Path
) -> None:
    with open_engine(tmp_path / "vortos.db", enforce=True) as engine:
        stale = short_dir / "stale.sock"
        leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        leftover.bind(str(stale))
        leftover.close()  # bound, never listening: what a killed server leaves
        with engine.serve_control(stale):
            assert raw(stale, encode({"v": 1, "op": "hello"}))[0]["ok"] is True
            with pytest.raises(StorageError, match="another process serves"):
                engine.serve_control(stale)
        assert not stale.exists()  # removed on close
        regular = short_dir / "notes.txt"
        regular.write_text("keep me")
        with pytest.raises(InvalidInput, match="is not a socket"):
            engine.serve_control(regular)
        assert regular.read_text() == "keep me"


def test_an_unknown_group_is_refused_before_anything_is_created(
    tmp_path: Path, short_dir: Path
) -> None:
    with open_engine(tmp_path / "vortos.db", enforce=True) as engine:
        with pytest.raises(InvalidInput, match="no group 'no-such-group-xyz'"):
            engine.serve_control(short_dir / "c.sock", group="no-such-group-xyz")
        assert not (short_dir / "c.sock").exists()


def test_the_socket_takes_the_group_it_is_given(tmp_path: Path, short_dir: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    with (
        open_engine(tmp_path / "vortos.db", enforce=True) as engine,
        engine.serve_control(short_dir / "g.sock", group=group),
    ):
        assert (short_dir / "g.sock").stat().st_gid == os.getgid()


def test_a_trusted_engine_cannot_serve_a_socket(tmp_path: Path, short_dir: Path) -> None:
    with (
        open_engine(tmp_path / "vortos.db") as engine,
        pytest.raises(ValueError, match="must check access"),
    ):
        ControlServer(engine.service, short_dir / "t.sock")


# -- what one account and one connection may hold ---------------------------------------------


@contextmanager
def limited(served: tuple[Engine, Path, Path], limits: ConnectionLimits) -> Iterator[Path]:
    """The served database on a second socket, with these limits."""
    server_engine, _, path = served
    other = path.with_name("limited.sock")
    with ControlServer(server_engine.service, other, limits=limits):
        yield other


def _hold(path: Path, count: int) -> list[socket.socket]:
    """`count` connections that have sent half a request, as a flooder's."""
    held = []
    for _ in range(count):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(path))
        conn.sendall(b'{"v":1,')
        held.append(conn)
    return held


def _refusal(path: Path, within_s: float = 60.0) -> tuple[ServerBusy, float]:
    """The ServerBusy a call gets once the server has counted the held connections (it
    takes them in its accept loop, after their connect returned), and how long it took."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            ControlClient(path).call("hello")
        except ServerBusy as busy:
            return busy, time.monotonic() - start
    pytest.fail(f"no call was refused within {within_s:.0f}s")


def _served_again(path: Path, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            answer = ControlClient(path).call("hello")
        except ServerBusy:
            if time.monotonic() > deadline:
                raise
        else:
            assert answer["operator"] == ME
            return


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        pytest.param(
            ConnectionLimits(total=64, per_account=2, request_s=120),
            "too many connections from your account (2 open): close some and retry",
            id="per-account",  # this account is root: root is not exempt
        ),
        pytest.param(
            ConnectionLimits(total=2, per_account=16, request_s=120),
            "the server is busy: it serves 2 connections at once, its most; retry in a moment",
            id="total",
        ),
    ],
)
def test_a_connection_over_the_limit_is_refused_at_once_in_one_line_not_queued(
    served: tuple[Engine, Path, Path], limits: ConnectionLimits, expected: str
) -> None:
    """Promise: the accept loop never waits for a slot. Held connections would keep a queued
    call waiting for their request deadline (120s); a refused one is answered at once."""
    with limited(served, limits) as path:
        held = _hold(path, 2)
        busy, took = _refusal(path)
        assert str(busy) == expected
        assert took < 30, took
        result = run_cli("schedule", "list", env={"VORTOS_CONTROL_SOCKET": str(path)})
        assert result.code == 1, result.stderr
        assert result.stderr.strip() == f"error: {expected}"
        for conn in held:
            conn.close()
        _served_again(path)


def test_the_request_deadline_runs_from_the_previous_answer_however_the_bytes_trickle(
    served: tuple[Engine, Path, Path],
) -> None:
    """Promise: a connection that sends a byte now and then (each well within a receive's
    timeout) is cut off once its request has not arrived whole within the deadline."""
    with limited(served, ConnectionLimits(request_s=2)) as path:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30)
        conn.connect(str(path))
        conn.sendall(encode({"v": 1, "op": "hello"}))
        with conn.makefile("rb") as stream:
            assert decode(stream.readline())["ok"] is True
        answered = time.monotonic()
        conn.settimeout(0.25)
        last = b""
        for byte in b'{"v":1,"op":"hello"' + b" " * 1000:
            try:
                last = conn.recv(65_536)  # the answer is one small line: one receive
            except TimeoutError:
                conn.sendall(bytes([byte]))
                continue
            break
        cut_after = time.monotonic() - answered
        conn.close()
    assert 1.5 <= cut_after <= 30, cut_after
    assert "no whole request within 2s" in decode(last)["error"]["message"]


# -- the CLI through the socket ---------------------------------------------------------------


def test_the_cli_sends_its_changes_through_the_socket(
    served: tuple[Engine, Path, Path],
) -> None:
    server_engine, db, path = served
    env = {"VORTOS_CONTROL_SOCKET": str(path)}
    paused = run_cli("schedule", "pause", "report", "--tenant", "acme", db=db, env=env)
    assert paused.code == 0, paused.stderr
    newest = server_engine.storage.audit.latest(tenant_chain("acme"), limit=1)[0]
    assert (newest.event, newest.actor) == ("schedule.paused", ME)
    refused = run_cli("schedule", "pause", "ledger", "--tenant", "globex", db=db, env=env)
    assert refused.code == 4
    assert "may not pause in tenant globex" in refused.stderr
    waiting = run_cli("schedule", "trigger", "payroll", "--tenant", "acme", db=db, env=env)
    assert waiting.code == 6, waiting.stderr
    verified = run_cli("audit", "verify", db=db, env=env)
    assert verified.code == 0, verified.stderr
    assert "tenant:acme" in verified.stdout
    # The doctor is the server's, on its view of every tenant: not for an operator of one.
    checked = run_cli("doctor", "--json", db=db, env=env)
    assert checked.code == 4, checked.stderr
    assert "needs the viewer role in every tenant" in checked.stderr
    held = run_cli("retention", "set", "--tenant", "acme", "--days", "0", db=db, env=env)
    assert held.code == 4, held.stderr  # through the socket, as this account: not an admin
    assert f"{ME} may not manage-retention in tenant acme" in held.stderr
    rotate = run_cli("audit", "rotate-key", db=db, env=env)
    assert rotate.code == 2
    assert "belongs to the account" in rotate.stderr


def test_the_cli_says_clearly_when_nothing_serves_the_socket(
    tmp_path: Path, short_dir: Path
) -> None:
    db = tmp_path / "vortos.db"
    with open_engine(db) as engine:
        engine.service.create(spec("report"), actor="setup")
    before = db.read_bytes()
    env = {"VORTOS_CONTROL_SOCKET": str(short_dir / "gone.sock")}
    result = run_cli("schedule", "pause", "report", "--tenant", "acme", db=db, env=env)
    assert result.code == 1
    assert "nothing serves the control socket" in result.stderr
    assert "Traceback" not in result.stderr
    assert db.read_bytes() == before


def test_a_prune_through_the_socket_is_made_by_the_server(
    served: tuple[Engine, Path, Path],
) -> None:
    server_engine, db, path = served
    env = {"VORTOS_CONTROL_SOCKET": str(path)}
    refused = run_cli("prune", db=db, env=env)
    assert refused.code == 4, refused.stderr  # a real prune needs admin in every tenant
    server_engine.storage.operators.grant(Grant(ME, Role.ADMIN), by="setup", at=T0)
    done = run_cli("prune", "--json", db=db, env=env)
    assert done.code == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["dry_run"], report["trigger"]) == (False, "manual")


def _create_line(payload_json: str) -> bytes:
    """A create request whose spec's payload is this JSON text, as a raw client may send it."""
    message = json.dumps({"v": 1, "op": "create", "args": {"spec": spec("odd").to_json()}})
    return message.replace('"payload": {}', f'"payload": {payload_json}', 1).encode() + b"\n"


@pytest.mark.parametrize(
    ("payload_json", "expected"),
    [
        pytest.param('{"a": "\\ud800"}', 'payload["a"] holds a lone surrogate', id="surrogate"),
        pytest.param('{"a": ' + "[" * 100 + "]" * 100 + "}", "more than 64 levels deep", id="deep"),
        pytest.param(
            '{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deep", id="past-json-guard"
        ),
        pytest.param('{"a": 1, "a": 2}', 'the key "a" twice', id="duplicate-key"),
    ],
)
def test_the_server_refuses_a_payload_the_cli_refuses(
    served: tuple[Engine, Path, Path], payload_json: str, expected: str
) -> None:
    """A client that skips the CLI's checks gets the same refusal from the server, which
    stores nothing and keeps serving."""
    server_engine, _, path = served
    before = server_engine.storage.audit.head(tenant_chain("acme"))
    answers = raw(path, _create_line(payload_json))
    assert answers[0]["ok"] is False, answers
    assert expected in str(answers[0]["error"])
    assert server_engine.storage.audit.head(tenant_chain("acme")) == before
    assert raw(path, encode({"v": 1, "op": "hello"}))[0]["ok"] is True
