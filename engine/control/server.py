"""The control socket's server: service calls over a Unix domain socket, each made as the
account the kernel says is on the other end.

`vortos run --control-socket PATH` runs one beside the daemon, as the service account that owns
the database and the audit key. Operators' CLI and console connect to it; the socket's file
mode (0660) and group decide who may connect at all, and SO_PEERCRED decides who they are:
nothing a client sends, no environment variable and no flag, can name another operator.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import pwd
import socket
import socketserver
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.control.codec import to_wire
from engine.control.protocol import VERBS, handler
from engine.control.reads import READS
from engine.control.request import Args, ControlContext, Handler, flag
from engine.control.wire import (
    MAX_LINE,
    VERSION,
    ProtocolError,
    ServerBusy,
    decode,
    encode,
    error_to_json,
)
from engine.domain.access import validate_operator
from engine.domain.approvals import ApprovalRequired
from engine.domain.audit import KeyRing, parse_point
from engine.domain.errors import InvalidInput, StorageError, VortosError
from engine.file_modes import group_id
from engine.governance.audit import verify
from engine.governance.doctor import Report
from engine.ports.audit import AuditLog
from engine.ports.read_model import ReadModel
from engine.service import ScheduleService

log = logging.getLogger("vortos.control")

# After refusing a malformed request: how much more of it, and how long (each read), to read
# before closing; the whole discard also ends at the connection's request deadline.
DISCARD_MAX = 16 * 1024 * 1024
DISCARD_TIMEOUT_S = 2.0

SOCKET_MODE = 0o660


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection, and one account, may hold of the server: so that no account can
    take the socket from the others by holding connections open (root is not exempt: it
    needs no socket to reach the service, and a root process can flood by mistake too).

    Over either count a connection is answered at once with ServerBusy and closed: the
    accept loop never waits for a slot, so the listen queue never fills with the waiting.
    """

    total: int = 128  # connections served at once, all accounts together
    # One account's (by SO_PEERCRED uid). A console holds at most four at once (a refresh's
    # read, a verb, an audit verification, the doctor); the rest is for its CLI and scripts.
    per_account: int = 16
    request_s: float = 10.0  # for a whole request line: from the connection's start or the
    # previous answer, however the bytes trickle in (a client sends its line at once)
    answer_s: float = 30.0  # for the client to take a whole answer


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process on the other end, from the kernel."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def peer_account(conn: socket.socket) -> tuple[str, int]:
    """The account name and uid of the process on the other end, from the kernel."""
    uid = peer_uid(conn)
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        raise PermissionError(f"uid {uid} has no account name on this host") from None
    return validate_operator(name), uid


# -- operations ---------------------------------------------------------------------------------


def _hello(c: ControlContext, a: Args) -> dict[str, Any]:
    return {"operator": c.actor, "version": VERSION}


def _audit_verify(c: ControlContext, a: Args) -> dict[str, Any]:
    if c.keys is None or c.audit is None:
        raise StorageError("this server has no audit key: it cannot verify")
    wanted = a.get("chains")
    if wanted is not None and (
        not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted)
    ):
        raise InvalidInput("the request's 'chains' must be a list of chain names")
    expect_raw = a.get("expect") or {}
    if not isinstance(expect_raw, dict):
        raise InvalidInput("the request's 'expect' must map chains to SEQ:HASH")
    try:
        expect = {str(k): parse_point(str(v)) for k, v in expect_raw.items()}
    except ValueError as exc:
        raise InvalidInput(f"--expect-head: {exc}") from None
    # Each expected chain exists and is readable; one who may read none is refused.
    chains, unreadable = c.service.audit_chains_to_verify(
        actor=c.actor, wanted=wanted, expected=list(expect)
    )
    record = a.get("record", True)
    if not isinstance(record, bool):
        raise InvalidInput("the request's 'record' must be true or false")
    # Every chain (None) for whoever may read every one: a chain deleted whole is then named.
    every = None if wanted is None and unreadable == 0 else chains
    result = verify(
        c.audit, c.keys(), chains=every, full=flag(a, "full"), expect=expect, record=record
    )
    # What was checked and what was trusted from a mark travel in each report.
    return {
        "chains": [report.to_json() for report in result.chains],
        "unreadable": unreadable,
    }


# The change verbs come from the protocol's table (one handler each, derived from the
# service method); the reads from reads.py; two more are the socket's own.
OPERATIONS: dict[str, Handler] = {
    "hello": _hello,
    **{name: handler(verb) for name, verb in VERBS.items()},
    "audit_verify": _audit_verify,
    **READS,
}


def _route(request: Mapping[str, Any]) -> tuple[Handler, Args]:
    """The handler and arguments of a request, or the error that says what is wrong."""
    stray = sorted(set(request) - {"v", "op", "args"})
    if stray:  # a request never says who sends it: an "actor" here is refused, not ignored
        raise InvalidInput(f"a request holds v, op and args only, not {stray[0]!r}")
    version = request.get("v")
    if type(version) is not int or version != VERSION:  # not True, not 1.0
        raise ProtocolError(
            f"protocol version {request.get('v')!r} is not {VERSION}: use a `vortos` of "
            "the same release as the server"
        )
    op = request.get("op")
    handler = OPERATIONS.get(op) if isinstance(op, str) else None
    if handler is None:
        raise InvalidInput(f"unknown operation {op!r}: one of {', '.join(sorted(OPERATIONS))}")
    args = request.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidInput("the request's 'args' must be an object")
    return handler, args


def answer(context: ControlContext, request: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to one decoded request (never raises for a request's fault)."""
    try:
        handler, args = _route(request)
        return {"ok": True, "result": handler(context, args)}
    except ApprovalRequired as exc:  # with the request, which the client cannot read itself
        return {"ok": False, "error": {**error_to_json(exc), "approval": to_wire(exc.approval)}}
    except VortosError as exc:
        return {"ok": False, "error": error_to_json(exc)}
    except Exception as exc:  # a bug of ours: say so, keep serving
        log.exception("control request %r failed", request.get("op"))
        return {
            "ok": False,
            "error": {
                "type": "InternalError",
                "message": f"the server failed: {type(exc).__name__}: {exc} (see its log)",
                "exit_code": 1,
            },
        }


# -- the server ---------------------------------------------------------------------------------


class _Connection(socketserver.StreamRequestHandler):
    server: _UnixServer

    def setup(self) -> None:
        self.limits = self.server.limits
        self.request.settimeout(self.limits.request_s)
        super().setup()

    def handle(self) -> None:
        control = self.server.control
        try:
            actor, uid = peer_account(self.request)
        except (OSError, VortosError) as exc:
            self._send(
                {
                    "ok": False,
                    "error": {"type": "PermissionDenied", "message": str(exc), "exit_code": 4},
                }
            )
            return
        context = ControlContext(
            control.service, actor, control.audit, control.keys, control.read_model, control.doctor
        )
        while True:
            # Wall time, not the service's Clock: this bounds what a socket holds of the
            # server, and a scheduler's clock may stand still.
            deadline = time.monotonic() + self.limits.request_s
            try:
                line = self._read_line(deadline)
            except TimeoutError:
                late = ProtocolError(
                    f"no whole request within {self.limits.request_s:.0f}s: a request is one "
                    "line, sent at once"
                )
                self._send({"ok": False, "error": error_to_json(late)})
                return
            except OSError:
                return
            if not line:
                return
            try:
                request = decode(line)
            except ProtocolError as exc:
                if self._send({"ok": False, "error": error_to_json(exc)}):
                    self._discard_rest(deadline)
                return  # the stream may be out of step: close it
            op = request.get("op")
            if op != "hello":
                log.info("control: %s (uid %d) asks %s", actor, uid, op)
            if not self._send(answer(context, request)):
                return

    def _read_line(self, deadline: float) -> bytes:
        """The next request line with its newline (at most MAX_LINE + 1 bytes: decode refuses
        more), what came before the end of input, or b"" at its end. TimeoutError once
        `deadline` passes, however slowly the bytes trickle in: a socket's timeout bounds
        only each wait, and a byte now and then would hold the connection for ever."""
        parts: list[bytes] = []
        room = MAX_LINE + 1
        while room > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.request.settimeout(left)
            # What is buffered, or one receive's worth (rfile is buffered: rbufsize -1).
            ready = cast("io.BufferedReader", self.rfile).peek(1)
            if not ready:
                break
            end = ready.find(b"\n", 0, room)
            take = end + 1 if end >= 0 else min(len(ready), room)
            parts.append(self.rfile.read(take))  # from the buffer: no wait
            room -= take
            if end >= 0:
                break
        return b"".join(parts)

    def _discard_rest(self, deadline: float) -> None:
        """Read what the client still sends, up to its end (or a bound, or the request's
        deadline), before closing: closing a socket with unread input resets it, and the
        client would lose the error just sent instead of reading it."""
        with contextlib.suppress(OSError):
            self.request.shutdown(socket.SHUT_WR)
            left = DISCARD_MAX
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.request.settimeout(min(wait, DISCARD_TIMEOUT_S))
                if not (chunk := self.rfile.read1(min(left, 65_536))):
                    return
                left -= len(chunk)

    def _send(self, message: Mapping[str, Any]) -> bool:
        try:
            # sendall's timeout bounds the whole answer: a client that reads nothing frees
            # its thread then.
            self.request.settimeout(self.limits.answer_s)
            self.wfile.write(encode(message))
            self.wfile.flush()
        except OSError:
            return False
        return True


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128  # connections the kernel queues until the accept loop takes them

    def __init__(self, path: str, control: ControlServer, limits: ConnectionLimits) -> None:
        self.control = control
        self.limits = limits
        self._lock = threading.Lock()
        self._served = 0  # connections with a thread, all accounts
        self._by_uid: dict[int, int] = {}  # the same, by account
        self._holder: dict[socket.socket, int] = {}  # each served connection's account
        self._warned: set[int | None] = set()  # logged until under the cap again (None: total)
        super().__init__(path, _Connection, bind_and_activate=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        # In the accept loop: nothing here waits for a client (or a name service).
        try:
            uid = peer_uid(request)
        except OSError:
            uid = -1  # answered in handle(), which asks again; counted as one account
        refusal = self._admit(request, uid)
        if refusal is not None:
            self._refuse(request, refusal)
            return
        try:
            super().process_request(request, client_address)
        except Exception:  # no thread: the caller closes the connection
            self._leave(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._leave(request)

    def _admit(self, request: socket.socket, uid: int) -> ServerBusy | None:
        """Count the connection in, or say why not."""
        with self._lock:
            held = self._by_uid.get(uid, 0)
            if held >= self.limits.per_account:
                self._warn(uid, "uid %d holds %d control connections: refusing more", uid, held)
                return ServerBusy(
                    f"too many connections from your account ({held} open): close some and retry"
                )
            if self._served >= self.limits.total:
                self._warn(None, "%d control connections open: refusing more", self._served)
                return ServerBusy(
                    f"the server is busy: it serves {self._served} connections at once, its "
                    "most; retry in a moment"
                )
            self._served += 1
            self._by_uid[uid] = held + 1
            self._holder[request] = uid
        return None

    def _leave(self, request: socket.socket) -> None:
        with self._lock:
            uid = self._holder.pop(request, None)
            if uid is None:
                return
            self._served -= 1
            left = self._by_uid[uid] - 1
            if left:
                self._by_uid[uid] = left
            else:
                del self._by_uid[uid]
            self._warned.discard(uid)
            self._warned.discard(None)

    def _warn(self, key: int | None, message: str, *args: object) -> None:
        # Once per flood, not once per refused connection: a flooder reconnects in a loop.
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _refuse(self, request: socket.socket, busy: ServerBusy) -> None:
        """One error line, then close, without waiting: a new connection's send buffer takes
        the line whole, and the kernel keeps it for the client to read after the close."""
        with contextlib.suppress(OSError):
            request.settimeout(0.0)  # never wait: a client that reads nothing gets nothing
            request.send(encode({"ok": False, "error": error_to_json(busy)}))
        self.shutdown_request(request)


class ControlServer:
    """Serves `service` on the Unix socket at `path` (file mode 0660, group `group` if given)."""

    def __init__(
        self,
        service: ScheduleService,
        path: Path,
        *,
        group: str | None = None,
        audit: AuditLog | None = None,
        keys: Callable[[], KeyRing] | None = None,
        read_model: Callable[[str], ReadModel] | None = None,
        doctor: Callable[[], Report] | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        """`read_model(operator)`: the console's read model narrowed to that operator (for the
        console's reads; None: not served). `doctor`: the service's own health checks.
        `limits`: what one account and one connection may hold (ConnectionLimits())."""
        if service.access is None:
            raise ValueError("a control socket serves operators: its service must check access")
        self.service = service
        self.path = Path(path)
        self.audit = audit
        self.keys = keys
        self.read_model = read_model
        self.doctor = doctor
        gid = None if group is None else group_id(group)
        _clear_stale(self.path)
        self._server = _UnixServer(str(self.path), self, limits or ConnectionLimits())
        # Bind under a umask that already gives 0660, so there is no moment in which the
        # socket is open to everyone; then set the group and the mode exactly.
        old = os.umask(0o117)
        try:
            self._server.server_bind()
        except OSError as exc:
            self._server.server_close()
            raise StorageError(f"cannot create the control socket {self.path}: {exc}") from None
        finally:
            os.umask(old)
        try:
            if gid is not None:
                os.chown(self.path, -1, gid)
            os.chmod(self.path, SOCKET_MODE)
            self._server.server_activate()
        except OSError as exc:
            self.close()
            raise StorageError(f"cannot set up the control socket {self.path}: {exc}") from None
        self._thread: threading.Thread | None = None

    def start(self) -> ControlServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="vortos-control"
        )
        self._thread.daemon = True
        self._thread.start()
        log.info("control socket %s (mode %o)", self.path, SOCKET_MODE)
        return self

    def close(self) -> None:
        """Stop accepting, and remove the socket file (if it is still ours)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()

    def __enter__(self) -> ControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clear_stale(path: Path) -> None:
    """Remove a socket file left by a server that is gone; refuse anything else at `path`."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise InvalidInput(f"{path} exists and is not a socket: choose another --control-socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink()  # nobody listens: a crashed server's leftover
        return
    except OSError as exc:
        if exc.errno in (errno.ENOENT,):
            return
        raise StorageError(f"cannot check the existing control socket {path}: {exc}") from None
    finally:
        probe.close()
    raise StorageError(
        f"another process serves the control socket {path}: stop it, or choose another path"
    )
