"""The control socket's client, and a ScheduleService whose changes go through it.

With a control socket configured, operators' tools open the database read-only and send every
change to the server, which makes it as the account the kernel reports for this process. Reads
stay local (narrowed to what the operator may view); a change's result is read back from the
database once the server has committed it.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.commands import CommandRegistry
from engine.control.wire import (
    MAX_LINE,
    VERSION,
    ProtocolError,
    decode,
    encode,
    error_from_json,
    spec_to_json,
)
from engine.domain.access import Role
from engine.domain.approvals import Approval, ApprovalRequired
from engine.domain.audit import ChainPoint
from engine.domain.clock import Clock
from engine.domain.errors import InvalidInput, NotFound, VortosError
from engine.domain.run import Run
from engine.domain.schedule import DEFAULT_TENANT, Schedule, ScheduleSpec
from engine.governance.policy import AccessControl
from engine.ports.retention import RetentionOverride
from engine.ports.storage import Storage
from engine.retention import PruneReport, RetentionSettings
from engine.retention.sweeper import Wait
from engine.service import BackfillReport, ScheduleService

CALL_TIMEOUT_S = 120.0  # a backfill of many slots takes a while; nothing legitimate takes this


class ControlUnavailable(VortosError):
    """The control socket cannot be reached."""

    exit_code = 1


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
            raise _Waiting(str(error.get("message")), str(error.get("approval_id")))
        raise error_from_json(error)

    def _exchange(self, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout_s)
        try:
            try:
                conn.connect(str(self.path))
            except OSError as exc:
                raise ControlUnavailable(_why_not(self.path, exc)) from None
            try:
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


class _Waiting(VortosError):
    """ApprovalRequired as it comes over the wire (the request is read back locally)."""

    exit_code = ApprovalRequired.exit_code

    def __init__(self, message: str, approval_id: str) -> None:
        super().__init__(message)
        self.approval_id = approval_id


def _why_not(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
        return (
            f"nothing serves the control socket {path}: is `vortos run --control-socket {path}` "
            "running? (or unset VORTOS_CONTROL_SOCKET to work on the database directly)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"you may not connect to the control socket {path}: your account must be in the "
            "socket's group (ask whoever runs the scheduler to add you)"
        )
    return f"cannot reach the control socket {path}: {exc}"


class RemoteService(ScheduleService):
    """ScheduleService whose changes are made by the control socket's server, as this
    process's account; its reads are local (read-only, narrowed by access control). `actor`
    arguments are ignored for changes: the server knows who is asking."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        commands: CommandRegistry,
        access: AccessControl,
        client: ControlClient,
    ) -> None:
        super().__init__(storage, clock, commands, access)
        self.client = client

    def whoami(self) -> str:
        """The operator the server sees on this end."""
        return str(self.client.call("hello")["operator"])

    # -- changes ----------------------------------------------------------------------------

    def create(self, spec: ScheduleSpec, *, actor: str) -> Schedule:
        return self._schedule(self._call("create", spec=spec_to_json(spec)))

    def update(
        self, spec: ScheduleSpec, *, actor: str, expected_version: int | None = None
    ) -> Schedule:
        return self._schedule(
            self._call("update", spec=spec_to_json(spec), expected_version=expected_version)
        )

    def pause(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        note: str | None = None,
        expected_version: int | None = None,
    ) -> Schedule:
        return self._schedule(
            self._call(
                "pause", name=name, tenant=tenant, note=note, expected_version=expected_version
            )
        )

    def resume(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
        catch_up: bool = False,
    ) -> Schedule:
        return self._schedule(
            self._call(
                "resume",
                name=name,
                tenant=tenant,
                expected_version=expected_version,
                catch_up=catch_up,
            )
        )

    def clear_override(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Schedule:
        return self._schedule(
            self._call(
                "clear_override", name=name, tenant=tenant, expected_version=expected_version
            )
        )

    def delete(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Schedule:
        # What was deleted, as this side last saw it (the server does not send it back).
        seen = self._storage.schedules.find_by_name(tenant, name)
        self._call("delete", name=name, tenant=tenant, expected_version=expected_version)
        if seen is None:
            raise NotFound(f"schedule {name!r} was deleted, but could not be read beforehand")
        return seen

    def trigger(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Run:
        done = self._call("trigger", name=name, tenant=tenant, expected_version=expected_version)
        run = self._storage.runs.get(int(done["run_id"]))
        if run is None:
            raise NotFound(f"run {done['run_id']} was made but cannot be read back")
        return run

    def backfill(
        self,
        name: str,
        *,
        start_ms: int,
        end_ms: int,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        confirmed: bool = False,
    ) -> BackfillReport:
        done = self._call(
            "backfill",
            name=name,
            start_ms=start_ms,
            end_ms=end_ms,
            tenant=tenant,
            confirmed=confirmed,
        )
        return BackfillReport(**done)

    def requeue(
        self, run_ids: Sequence[int] | None, *, actor: str, tenant: str | None = None
    ) -> int:
        ids = None if run_ids is None else list(run_ids)
        return int(self._call("requeue", run_ids=ids, tenant=tenant)["count"])

    def purge(self, run_ids: Sequence[int] | None, *, actor: str, tenant: str | None = None) -> int:
        ids = None if run_ids is None else list(run_ids)
        return int(self._call("purge", run_ids=ids, tenant=tenant)["count"])

    def approve(self, approval_id: str, *, actor: str, tenant: str | None = None) -> Approval:
        return self._approval(self._call("approve", approval_id=approval_id, tenant=tenant))

    def reject(
        self, approval_id: str, *, actor: str, reason: str, tenant: str | None = None
    ) -> Approval:
        return self._approval(
            self._call("reject", approval_id=approval_id, reason=reason, tenant=tenant)
        )

    def grant_role(self, operator: str, role: Role, *, actor: str, tenant: str = "*") -> bool:
        done = self._call("grant_role", operator=operator, role=role.value, tenant=tenant)
        return bool(done["changed"])

    def revoke_role(self, operator: str, role: Role, *, actor: str, tenant: str = "*") -> None:
        self._call("revoke_role", operator=operator, role=role.value, tenant=tenant)

    def set_retention(
        self, tenant: str, days: int, *, actor: str, reason: str | None = None
    ) -> RetentionOverride:
        self._call("set_retention", tenant=tenant, days=days, reason=reason)
        found = self._storage.retention.override(tenant)
        if found is None:
            raise NotFound(f"the retention of tenant {tenant!r} was set but cannot be read back")
        return found

    def remove_retention(self, tenant: str, *, actor: str) -> RetentionOverride:
        before = self._call("remove_retention", tenant=tenant)
        return RetentionOverride(
            tenant=str(before["tenant"]),
            days=int(before["days"]),
            reason=before.get("reason"),
            set_by=str(before["set_by"]),
            set_at=int(before["set_at"]),
        )

    def prune(
        self,
        *,
        actor: str,
        dry_run: bool = False,
        settings: RetentionSettings | None = None,
        wait: Wait | None = None,
    ) -> PruneReport:
        """A sweep made by the server (with its sweeper's settings), which may take up to its
        time budget."""
        if settings is not None or wait is not None:
            raise InvalidInput("a prune through the control socket uses the server's settings")
        budget_s = self.retention_settings()[0].budget_s
        try:
            done = self.client.call("prune", {"dry_run": dry_run}, timeout_s=budget_s + 60)
        except _Waiting as waiting:  # a prune asks no approval; keep the types honest
            raise InvalidInput(str(waiting)) from None
        return PruneReport.from_json(done)

    def audit_verify(
        self,
        *,
        chains: Sequence[str] | None = None,
        full: bool = False,
        expect: Mapping[str, ChainPoint] | None = None,
        record: bool = True,
    ) -> list[dict[str, Any]]:
        """Verification by the server, which holds the key (the reports as JSON); with
        `record`, the server remembers how far each chain verified."""
        done = self._call(
            "audit_verify",
            chains=None if chains is None else list(chains),
            full=full,
            expect={k: v.spelled() for k, v in (expect or {}).items()},
            record=record,
        )
        reports = done.get("chains")
        if not isinstance(reports, list):
            raise ProtocolError("the server's verification has no chains")
        return reports

    # -- helpers ----------------------------------------------------------------------------

    def _call(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return self.client.call(op, args)
        except _Waiting as waiting:
            request = self._storage.approvals.get(waiting.approval_id)
            if request is None:
                raise NotFound(
                    f"{waiting} (the request {waiting.approval_id} cannot be read back)"
                ) from None
            raise ApprovalRequired(str(waiting), request) from None

    def _schedule(self, done: Mapping[str, Any]) -> Schedule:
        found = self._storage.schedules.get(str(done["schedule_id"]))
        if found is None:
            raise NotFound(f"schedule {done['schedule_id']} changed, but is gone already")
        return found

    def _approval(self, done: Mapping[str, Any]) -> Approval:
        found = self._storage.approvals.get(str(done["approval_id"]))
        if found is None:
            raise NotFound(f"approval {done['approval_id']} was decided but cannot be read")
        return found
