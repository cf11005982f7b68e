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
import grp
import logging
import os
import pwd
import socket
import socketserver
import stat
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.control.wire import (
    MAX_LINE,
    VERSION,
    ProtocolError,
    decode,
    encode,
    error_to_json,
    spec_from_json,
)
from engine.domain.access import parse_role, validate_operator
from engine.domain.audit import KeyRing, parse_point
from engine.domain.errors import InvalidInput, StorageError, VortosError
from engine.governance.audit import verify
from engine.ports.audit import AuditLog
from engine.service import ScheduleService

log = logging.getLogger("vortos.control")

# After refusing a malformed request: how much more of it, and how long, to read before closing.
DISCARD_MAX = 16 * 1024 * 1024
DISCARD_TIMEOUT_S = 2.0

SOCKET_MODE = 0o660
IDLE_TIMEOUT_S = 60.0  # a connection that sends nothing for this long is closed
MAX_CONNECTIONS = 32  # at once; more wait in the listen backlog

Args = Mapping[str, Any]
Handler = Callable[["ControlContext", Args], dict[str, Any]]


class ControlContext:
    """One request: the service, who asked (as the kernel says), and the audit log and keys
    (for verification, which needs the key the operators cannot read)."""

    def __init__(
        self,
        service: ScheduleService,
        actor: str,
        audit: AuditLog | None,
        keys: Callable[[], KeyRing] | None,
    ) -> None:
        self.service = service
        self.actor = actor
        self.audit = audit
        self.keys = keys


def peer_account(conn: socket.socket) -> tuple[str, int]:
    """The account name and uid of the process on the other end, from the kernel."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        raise PermissionError(f"uid {uid} has no account name on this host") from None
    return validate_operator(name), uid


# -- arguments ----------------------------------------------------------------------------------


def _text(args: Args, key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str):
        raise InvalidInput(f"the request's {key!r} must be text")
    return value


def _maybe_text(args: Args, key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"the request's {key!r} must be text")
    return value


def _maybe_int(args: Args, key: str) -> int | None:
    value = args.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidInput(f"the request's {key!r} must be an integer")
    return value


def _int(args: Args, key: str) -> int:
    value = _maybe_int(args, key)
    if value is None:
        raise InvalidInput(f"the request needs {key!r}")
    return value


def _flag(args: Args, key: str) -> bool:
    value = args.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"the request's {key!r} must be true or false")
    return value


def _run_ids(args: Args) -> list[int] | None:
    value = args.get("run_ids")
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise InvalidInput("the request's 'run_ids' must be a list of integers")
    return value


# -- operations ---------------------------------------------------------------------------------


def _hello(c: ControlContext, a: Args) -> dict[str, Any]:
    return {"operator": c.actor, "version": VERSION}


def _create(c: ControlContext, a: Args) -> dict[str, Any]:
    made = c.service.create(spec_from_json(a.get("spec")), actor=c.actor)
    return {"schedule_id": made.id}


def _update(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.update(
        spec_from_json(a.get("spec")),
        actor=c.actor,
        expected_version=_maybe_int(a, "expected_version"),
    )
    return {"schedule_id": done.id}


def _pause(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.pause(
        _text(a, "name"),
        actor=c.actor,
        tenant=_text(a, "tenant"),
        note=_maybe_text(a, "note"),
        expected_version=_maybe_int(a, "expected_version"),
    )
    return {"schedule_id": done.id}


def _resume(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.resume(
        _text(a, "name"),
        actor=c.actor,
        tenant=_text(a, "tenant"),
        expected_version=_maybe_int(a, "expected_version"),
        catch_up=_flag(a, "catch_up"),
    )
    return {"schedule_id": done.id}


def _clear_override(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.clear_override(
        _text(a, "name"),
        actor=c.actor,
        tenant=_text(a, "tenant"),
        expected_version=_maybe_int(a, "expected_version"),
    )
    return {"schedule_id": done.id}


def _delete(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.delete(
        _text(a, "name"),
        actor=c.actor,
        tenant=_text(a, "tenant"),
        expected_version=_maybe_int(a, "expected_version"),
    )
    return {"schedule_id": done.id}


def _trigger(c: ControlContext, a: Args) -> dict[str, Any]:
    run = c.service.trigger(
        _text(a, "name"),
        actor=c.actor,
        tenant=_text(a, "tenant"),
        expected_version=_maybe_int(a, "expected_version"),
    )
    return {"run_id": run.id}


def _backfill(c: ControlContext, a: Args) -> dict[str, Any]:
    report = c.service.backfill(
        _text(a, "name"),
        start_ms=_int(a, "start_ms"),
        end_ms=_int(a, "end_ms"),
        actor=c.actor,
        tenant=_text(a, "tenant"),
        confirmed=_flag(a, "confirmed"),
    )
    return asdict(report)


def _requeue(c: ControlContext, a: Args) -> dict[str, Any]:
    count = c.service.requeue(_run_ids(a), actor=c.actor, tenant=_maybe_text(a, "tenant"))
    return {"count": count}


def _purge(c: ControlContext, a: Args) -> dict[str, Any]:
    count = c.service.purge(_run_ids(a), actor=c.actor, tenant=_maybe_text(a, "tenant"))
    return {"count": count}


def _approve(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.approve(
        _text(a, "approval_id"), actor=c.actor, tenant=_maybe_text(a, "tenant")
    )
    return {"approval_id": done.id}


def _reject(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.reject(
        _text(a, "approval_id"),
        actor=c.actor,
        reason=_text(a, "reason"),
        tenant=_maybe_text(a, "tenant"),
    )
    return {"approval_id": done.id}


def _grant(c: ControlContext, a: Args) -> dict[str, Any]:
    changed = c.service.grant_role(
        validate_operator(_text(a, "operator")),
        parse_role(_text(a, "role")),
        actor=c.actor,
        tenant=_text(a, "tenant"),
    )
    return {"changed": changed}


def _revoke(c: ControlContext, a: Args) -> dict[str, Any]:
    c.service.revoke_role(
        validate_operator(_text(a, "operator")),
        parse_role(_text(a, "role")),
        actor=c.actor,
        tenant=_text(a, "tenant"),
    )
    return {}


def _set_retention(c: ControlContext, a: Args) -> dict[str, Any]:
    done = c.service.set_retention(
        _text(a, "tenant"), _int(a, "days"), actor=c.actor, reason=_maybe_text(a, "reason")
    )
    return {"tenant": done.tenant}


def _remove_retention(c: ControlContext, a: Args) -> dict[str, Any]:
    before = c.service.remove_retention(_text(a, "tenant"), actor=c.actor)
    return {
        "tenant": before.tenant,
        "days": before.days,
        "reason": before.reason,
        "set_by": before.set_by,
        "set_at": before.set_at,
    }


def _prune(c: ControlContext, a: Args) -> dict[str, Any]:
    return c.service.prune(actor=c.actor, dry_run=_flag(a, "dry_run")).to_json()


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
    c.service.audit_chains(actor=c.actor, wanted=list(expect))  # each exists and is readable
    chains = c.service.audit_chains(actor=c.actor, wanted=wanted)
    record = a.get("record", True)
    if not isinstance(record, bool):
        raise InvalidInput("the request's 'record' must be true or false")
    result = verify(
        c.audit, c.keys(), chains=chains, full=_flag(a, "full"), expect=expect, record=record
    )
    return {"chains": [report.to_json() for report in result.chains]}


OPERATIONS: dict[str, Handler] = {
    "hello": _hello,
    "create": _create,
    "update": _update,
    "pause": _pause,
    "resume": _resume,
    "clear_override": _clear_override,
    "delete": _delete,
    "trigger": _trigger,
    "backfill": _backfill,
    "requeue": _requeue,
    "purge": _purge,
    "approve": _approve,
    "reject": _reject,
    "grant_role": _grant,
    "revoke_role": _revoke,
    "set_retention": _set_retention,
    "remove_retention": _remove_retention,
    "prune": _prune,
    "audit_verify": _audit_verify,
}


def _route(request: Mapping[str, Any]) -> tuple[Handler, Args]:
    """The handler and arguments of a request, or the error that says what is wrong."""
    if request.get("v") != VERSION:
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
        self.request.settimeout(IDLE_TIMEOUT_S)
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
        context = ControlContext(control.service, actor, control.audit, control.keys)
        while True:
            try:
                line = self.rfile.readline(MAX_LINE + 1)
            except (TimeoutError, OSError):
                return
            if not line:
                return
            try:
                request = decode(line)
            except ProtocolError as exc:
                if self._send({"ok": False, "error": error_to_json(exc)}):
                    self._discard_rest()
                return  # the stream may be out of step: close it
            op = request.get("op")
            if op != "hello":
                log.info("control: %s (uid %d) asks %s", actor, uid, op)
            if not self._send(answer(context, request)):
                return

    def _discard_rest(self) -> None:
        """Read what the client still sends, up to its end (or a bound), before closing:
        closing a socket with unread input resets it, and the client would lose the error
        just sent instead of reading it."""
        with contextlib.suppress(OSError):
            self.request.shutdown(socket.SHUT_WR)
            self.request.settimeout(DISCARD_TIMEOUT_S)
            left = DISCARD_MAX
            while left > 0 and (chunk := self.rfile.read1(min(left, 65_536))):
                left -= len(chunk)

    def _send(self, message: Mapping[str, Any]) -> bool:
        try:
            self.wfile.write(encode(message))
            self.wfile.flush()
        except OSError:
            return False
        return True


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, path: str, control: ControlServer) -> None:
        self.control = control
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(path, _Connection, bind_and_activate=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


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
    ) -> None:
        if service.access is None:
            raise ValueError("a control socket serves operators: its service must check access")
        self.service = service
        self.path = Path(path)
        self.audit = audit
        self.keys = keys
        gid = _group_id(group)
        _clear_stale(self.path)
        self._server = _UnixServer(str(self.path), self)
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


def _group_id(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise InvalidInput(
            f"no group {group!r} on this host: create it (`groupadd {group}`) and add the "
            "operators to it, or name another with --control-group"
        ) from None


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
