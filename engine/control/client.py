"""The control socket's client, and a ScheduleService whose reads and changes all go through it.

With a control socket configured, operators' tools never open the database: every read and
every change is sent to the server, which makes it as the account the kernel reports for this
process and narrows every read to the tenants that account may view (see reads.py). So the
database's files can be private to the service account, and the narrowing is the server's,
not a courtesy of the client.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import socket
import time
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from engine.commands import CommandRegistry
from engine.control.codec import from_wire
from engine.control.protocol import LOCAL_ONLY, VERBS, Verb, not_remote, request_of, result_of
from engine.control.wire import (
    MAX_LINE,
    VERSION,
    ControlUnavailable,
    ProtocolError,
    decode,
    encode,
    error_from_json,
)
from engine.domain.access import Grant
from engine.domain.approvals import Approval, ApprovalRequired
from engine.domain.audit import AuditEntry, ChainPoint
from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput, StorageError, VortosError
from engine.domain.preview import PreviewSlot
from engine.domain.run import Run
from engine.domain.schedule import Schedule
from engine.governance.audit import ChainReport, Verification, export
from engine.governance.doctor import Finding, Report
from engine.ports.audit import AuditLog
from engine.ports.fire_queue import Fire
from engine.ports.retention import RetentionOverride
from engine.ports.runs import RunQuery
from engine.retention import PruneReport, RetentionSettings
from engine.service import RetentionView
from engine.service.audit_trail import AUDIT_PAGE_MAX

T = TypeVar("T")

CALL_TIMEOUT_S = 120.0  # a backfill of many slots takes a while; nothing legitimate takes this
VERIFY_TIMEOUT_S = 3600.0  # a full audit verification of millions of entries
CONNECT_WAIT_S = 10.0  # how long a full listen queue is tried again before giving up


class ControlClient:
    """Calls over the Unix socket at `path`, one connection per call."""

    def __init__(self, path: Path, *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s

    def call(
        self, op: str, args: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """The result of `op`, or the server's error raised as the same class here."""
        answer = self._exchange(
            {"v": VERSION, "op": op, "args": dict(args or {})}, timeout_s or self.timeout_s
        )
        if answer.get("ok") is True:
            result = answer.get("result")
            if not isinstance(result, dict):
                raise ProtocolError("the server's answer has no result")
            return result
        error = answer.get("error")
        if not isinstance(error, dict):
            raise ProtocolError("the server's answer has neither a result nor an error")
        if error.get("type") == "ApprovalRequired":
            raise _Waiting(str(error.get("message")), error.get("approval"))
        raise error_from_json(error)

    def _exchange(self, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        conn = self._connect(timeout_s)
        try:
            try:
                # A server that refuses a connection (ServerBusy) answers and closes before it
                # reads the request: its answer, already sent, says why.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.sendall(encode(request))
                with conn.makefile("rb") as stream:
                    line = stream.readline(MAX_LINE + 1)
            except TimeoutError:
                raise ControlUnavailable(
                    f"the control socket {self.path} did not answer within {timeout_s:.0f}s"
                ) from None
            except OSError as exc:
                raise ControlUnavailable(
                    f"the control socket {self.path} broke off: {exc}"
                ) from None
        finally:
            conn.close()
        if not line:
            raise ControlUnavailable(f"the control socket {self.path} closed without an answer")
        return decode(line)

    def _connect(self, timeout_s: float) -> socket.socket:
        """A connection to the server. A listen queue that is full (EAGAIN: connections
        arrive faster than the server takes them) is tried again for a while, since the
        server takes or refuses each at once."""
        deadline = time.monotonic() + min(timeout_s, CONNECT_WAIT_S)
        pause = 0.01
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            try:
                conn.connect(str(self.path))
            except OSError as exc:
                conn.close()
                if exc.errno == errno.EAGAIN and time.monotonic() + pause < deadline:
                    time.sleep(pause)  # a back-off between tries, not a wait for a state
                    pause = min(pause * 2, 0.25)
                    continue
                raise ControlUnavailable(_why_not(self.path, exc)) from None
            return conn


class _Waiting(VortosError):
    """ApprovalRequired as it comes over the wire, with the request as the server sent it."""

    exit_code = ApprovalRequired.exit_code

    def __init__(self, message: str, approval: Any) -> None:
        super().__init__(message)
        self.approval = approval


def _why_not(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
        return (
            f"the scheduler service is not running: nothing serves the control socket {path}; "
            "reads and changes go through it (ask whoever runs `vortos run --control-socket`), "
            "or unset VORTOS_CONTROL_SOCKET to read a database file you may read"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"you may not connect to the control socket {path}: your account must be in the "
            "socket's group (ask whoever runs the scheduler to add you)"
        )
    if exc.errno == errno.EAGAIN:
        return (
            f"the control socket {path} took no connection for {CONNECT_WAIT_S:.0f}s: its "
            "queue stayed full (the service is overloaded, or something floods it); try "
            "again, and tell whoever runs the scheduler if it persists"
        )
    return f"cannot reach the control socket {path}: {exc}"


class NoDatabase:
    """Where a socket engine's storage would be: this process opens no database, so anything
    that would read one directly says so instead (a read that bypassed the server would be
    a bug: the server is what narrows reads)."""

    readonly = True

    def __init__(self, socket_path: Path) -> None:
        self._socket_path = socket_path

    def close(self) -> None:
        """Nothing is open."""

    def __getattr__(self, name: str) -> Any:
        raise StorageError(
            f"with the control socket {self._socket_path}, this process opens no database: "
            f"{name!r} is read through the socket's server (this is a bug of vortos: report it)"
        )


if TYPE_CHECKING:
    # To the type checker a RemoteService offers every ScheduleService call, with its
    # signature (callers hold either as `engine.service`); at run time it inherits nothing:
    # what it does not define goes to __getattr__, a verb or NotRemote.
    from engine.service import ScheduleService as _ServiceCalls
else:
    _ServiceCalls = object


class RemoteService(_ServiceCalls):
    """The service's calls, made by the control socket's server as this process's account: it
    holds no storage. `actor` arguments are ignored: the server knows who is asking, and
    narrows every read to what that account may view.

    Composition, not inheritance: a change verb is the protocol's (engine.control.protocol),
    a read is one of the methods below, and any other ScheduleService call raises NotRemote
    instead of running here, against no database."""

    access = None  # the server checks access; this side trusts nothing it could decide

    def __init__(self, client: ControlClient, clock: Clock, commands: CommandRegistry) -> None:
        self.client = client
        self.clock = clock
        self.commands = commands

    def __getattr__(self, name: str) -> Any:
        verb = VERBS.get(name)
        if verb is not None:
            return functools.partial(self._change, verb)
        if name in LOCAL_ONLY:
            raise not_remote(name)
        raise AttributeError(name)

    def _change(self, verb: Verb, *args: Any, **kwargs: Any) -> Any:
        return result_of(verb, self._call(verb.name, **request_of(verb, args, kwargs)))

    def whoami(self) -> str:
        """The operator the server sees on this end."""
        return str(self.client.call("hello")["operator"])

    # -- reads ------------------------------------------------------------------------------
    # Each takes its ScheduleService method's own parameters (declared once, there: `_given`
    # binds them by that signature, defaults and all); `actor` is ignored.

    def get(self, *args: Any, **kwargs: Any) -> Schedule:
        a = _given("get", args, kwargs)
        done = self._call("schedule", name=a["name"], tenant=a["tenant"])
        return from_wire(Schedule, done["schedule"])

    def schedules(self, *args: Any, **kwargs: Any) -> list[Schedule]:
        a = _given("schedules", args, kwargs)
        status = a["status"]
        found = self._paged(
            "schedules",
            Schedule,
            tenant=a["tenant"],
            status=None if status is None else status.value,
            limit=a["offset"] + a["limit"],
        )
        return found[a["offset"] :]

    def runs(self, *args: Any, **kwargs: Any) -> list[Run]:
        query: RunQuery = _given("runs", args, kwargs)["query"]
        return self._paged(
            "runs",
            Run,
            tenant=query.tenant,
            schedule_id=query.schedule_id,
            state=None if query.state is None else query.state.value,
            since_ms=query.since_ms,
            until_ms=query.until_ms,
            limit=query.limit,
        )

    def run(self, *args: Any, **kwargs: Any) -> Run:
        a = _given("run", args, kwargs)
        return from_wire(Run, self._call("run", run_id=a["run_id"])["run"])

    def preview(self, *args: Any, **kwargs: Any) -> list[PreviewSlot]:
        a = _given("preview", args, kwargs)
        done = self._call("preview", **_without(a, "actor"))
        return from_wire(list[PreviewSlot], done["slots"])

    def dead_letters(self, *args: Any, **kwargs: Any) -> list[Fire]:
        a = _given("dead_letters", args, kwargs)
        return self._paged("dead_letters", Fire, tenant=a["tenant"], limit=a["limit"])

    def approvals(self, *args: Any, **kwargs: Any) -> list[Approval]:
        a = _given("approvals", args, kwargs)
        state = a["state"]
        chosen = None if state is None else state.value
        return self._paged(
            "approvals", Approval, tenant=a["tenant"], state=chosen, limit=a["limit"]
        )

    def approval(self, *args: Any, **kwargs: Any) -> Approval:
        a = _given("approval", args, kwargs)
        done = self._call("approval", approval_id=a["approval_id"], tenant=a["tenant"])
        return from_wire(Approval, done["approval"])

    def operators(self, *args: Any, **kwargs: Any) -> list[Grant]:
        return from_wire(list[Grant], self._call("operators")["grants"])

    def retention(self, *args: Any, **kwargs: Any) -> RetentionView:
        done = self._call("retention")
        overrides = from_wire(list[RetentionOverride], done["overrides"])
        return RetentionView(self._settings(done), str(done["source"]), overrides)

    def retention_settings(self) -> tuple[RetentionSettings, str]:
        done = self._call("retention")
        return self._settings(done), str(done["source"])

    def audit_chains(self, *args: Any, **kwargs: Any) -> list[str]:
        wanted = _given("audit_chains", args, kwargs)["wanted"]
        done = self._call("audit_chains", wanted=None if wanted is None else list(wanted))
        return from_wire(list[str], done["chains"])

    def audit_latest(self, *args: Any, **kwargs: Any) -> list[AuditEntry]:
        a = _given("audit_latest", args, kwargs)
        return self._paged("audit_tail", AuditEntry, chain=a["chain"], limit=a["limit"])

    def audit_entries(self, *args: Any, **kwargs: Any) -> list[AuditEntry]:
        a = _given("audit_entries", args, kwargs)
        done = self._call("audit_entries", **_without(a, "actor"))
        return from_wire(list[AuditEntry], done["entries"])

    def audit_export(self, *args: Any, **kwargs: Any) -> int:
        """The export, read from the server a page at a time, each chain after the last entry
        it sent (never one answer of every entry). Its heads are not signed: the key is the
        server's account's, not this one's."""
        a = _given("audit_export", args, kwargs)
        return export(
            # export reads nothing but entries() and identity() of the chains it is given.
            cast("AuditLog", _ServedEntries(self)),
            a["out"],
            chains=self.audit_chains(wanted=a["chains"]),
        )

    def database_info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return from_wire(dict[str, Any], self._call("db_info")["facts"])

    def doctor(self) -> Report:
        """Every health check, run by the server on its own view of the database."""
        done = self._call("doctor")["report"]
        if not isinstance(done, dict):
            raise ProtocolError("the server's doctor report is not an object")
        return Report(from_wire(list[Finding], done.get("findings")))

    # -- changes (the protocol's verbs, but for these two) ---------------------------------

    def prune(self, *args: Any, **kwargs: Any) -> PruneReport:
        """A sweep made by the server (with its sweeper's settings), which may take up to its
        time budget."""
        verb = VERBS["prune"]
        request = request_of(verb, args, kwargs)
        budget_s = self.retention_settings()[0].budget_s
        try:
            done = self.client.call(verb.name, request, timeout_s=budget_s + 60)
        except _Waiting as waiting:  # a prune asks no approval; keep the types honest
            raise InvalidInput(str(waiting)) from None
        return typing.cast("PruneReport", result_of(verb, done))

    def audit_verification(
        self,
        *,
        chains: Sequence[str] | None = None,
        full: bool = False,
        expect: Mapping[str, ChainPoint] | None = None,
        record: bool = True,
    ) -> Verification:
        """Verification by the server, which holds the key: what each chain trusted, and how
        many chains it did not check (this operator may not read them); with `record`, the
        server remembers how far each chain verified."""
        try:
            done = self.client.call(
                "audit_verify",
                {
                    "chains": None if chains is None else list(chains),
                    "full": full,
                    "expect": {k: v.spelled() for k, v in (expect or {}).items()},
                    "record": record,
                },
                # A full verification walks every entry: it may take far longer than a change.
                timeout_s=VERIFY_TIMEOUT_S if full else None,
            )
        except _Waiting as waiting:  # a verification asks no approval; keep the types honest
            raise InvalidInput(str(waiting)) from None
        reports = done.get("chains")
        unreadable = done.get("unreadable", 0)
        if not isinstance(reports, list) or not isinstance(unreadable, int):
            raise ProtocolError("the server's verification has no chains")
        try:
            return Verification([ChainReport.from_json(r) for r in reports], unreadable)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"the server's verification is malformed: {exc}") from None

    # -- helpers ----------------------------------------------------------------------------

    def _call(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return self.client.call(op, args)
        except _Waiting as waiting:
            raise ApprovalRequired(str(waiting), from_wire(Approval, waiting.approval)) from None

    def _paged(self, op: str, kind: type[T], **args: Any) -> list[T]:
        """Every row of a list the server sends in windows (see reads.window)."""
        found: list[T] = []
        offset = 0
        while True:
            done = self._call(op, **args, offset=offset)
            items, after = done.get("items"), done.get("next")
            if not isinstance(items, list):
                raise ProtocolError(f"the server's {op} has no items")
            found += [from_wire(kind, item) for item in items]
            if after is None:
                return found
            if not isinstance(after, int) or isinstance(after, bool) or after <= offset:
                raise ProtocolError(f"the server's {op} does not move on from row {offset}")
            offset = after

    @staticmethod
    def _settings(done: Mapping[str, Any]) -> RetentionSettings:
        settings = done.get("settings")
        if not isinstance(settings, dict):
            raise ProtocolError("the server's retention has no settings")
        return RetentionSettings.from_payload(settings)

    @staticmethod
    def _schedule(done: Mapping[str, Any]) -> Schedule:
        return from_wire(Schedule, done.get("schedule"))


def _given(method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of a call `method(*args, **kwargs)` of ScheduleService, by its own
    signature, its defaults filled in."""
    bound = _signature(method).bind(None, *args, **kwargs)
    bound.apply_defaults()
    given = dict(bound.arguments)
    del given["self"]
    return given


@functools.cache
def _signature(method: str) -> inspect.Signature:
    from engine.service import ScheduleService  # noqa: PLC0415 - the client's own dependency

    return inspect.signature(getattr(ScheduleService, method))


def _without(found: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in found.items() if k not in names}


class _ServedEntries:
    """The pages of audit entries the server sends, as engine.governance.audit.export reads a
    log."""

    def __init__(self, service: RemoteService) -> None:
        self._service = service

    def identity(self) -> None:
        """The socket serves no key lineage: the export carries none (verify it with the
        secret key, or export as the service account for an auditor)."""
        return

    def anchor(self, chain: str) -> None:
        """Nor archive anchors: an archived chain's export through the socket starts after
        its anchor and does not verify offline (export as the service account)."""
        return

    def entries(self, chain: str, *, after_seq: int = 0, limit: int = 1000) -> list[AuditEntry]:
        return self._service.audit_entries(
            chain, after_seq=after_seq, limit=min(limit, AUDIT_PAGE_MAX)
        )
