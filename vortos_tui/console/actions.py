"""The console's verbs: pause, resume, trigger and edit a schedule, through ScheduleService.

A verb acts on the row the operator saw. The schedule is read again before acting and the
change is made only if it is still that row at that version: a schedule paused, changed,
deleted or re-created by someone else meanwhile is refused as stale, and nothing is done.
These calls block (they write); the console runs them on thread workers.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from engine import Engine, NotFound, Schedule, ScheduleStatus, StaleVersion, VortosError
from engine.control import RemoteService
from engine.domain.access import Operation
from engine.domain.errors import InvalidInput
from engine.domain.schedule import changed_fields
from engine.governance.audit import Progress, Verification, verify
from vortos_tui.cli.schedule import edit_patch

# Entries per read in the console's verification: progress moves every page.
VERIFY_PAGE = 2_000


class Verb(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"
    EDIT = "edit"  # the options of `vortos schedule edit`, typed in its dialog

    @property
    def operation(self) -> Operation:
        """What the policy is asked before the verb is offered."""
        return VERB_OPERATION[self]


VERB_OPERATION = {
    Verb.PAUSE: Operation.PAUSE,
    Verb.RESUME: Operation.RESUME,
    Verb.TRIGGER: Operation.TRIGGER,
    Verb.EDIT: Operation.UPDATE,
}


@dataclass(slots=True)
class VerifyRun:
    """A verification the console is running: in full or not, how far, and how to stop it."""

    full: bool
    cancel: threading.Event = field(default_factory=threading.Event)
    checked: int = 0  # entries checked so far
    total: int | None = None  # to check in all; None until known (never, over a socket)

    @property
    def label(self) -> str:
        return "full verify" if self.full else "verify"


class StaleRow(VortosError):
    """The row changed or vanished between selection and confirmation."""


@dataclass(frozen=True, slots=True)
class ScheduleRef:
    """A schedule as the operator selected it."""

    id: str
    tenant: str
    name: str
    version: int
    status: ScheduleStatus

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleRef:
        return cls(schedule.id, schedule.tenant, schedule.name, schedule.version, schedule.status)

    @property
    def label(self) -> str:
        return f"{self.tenant}/{self.name}"


def not_applicable(verb: Verb, ref: ScheduleRef) -> str | None:
    """Why `verb` makes no sense for the row as seen, or None when it does."""
    if verb is Verb.PAUSE and ref.status is not ScheduleStatus.ACTIVE:
        return f"{ref.label} is {ref.status.value}, not active: nothing to pause"
    if verb is Verb.RESUME and ref.status is ScheduleStatus.ACTIVE:
        return f"{ref.label} is already active"
    return None


class ConsoleActions:
    """Verbs as one operator. The engine is opened on first use (an attached console that
    never acts never opens the database for writing)."""

    def __init__(
        self, engine: Callable[[], Engine], operator: str, *, owns_engine: bool = True
    ) -> None:
        self._open = engine
        self._owns = owns_engine
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self.operator = operator

    def _service_engine(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = self._open()
            return self._engine

    def perform(self, verb: Verb, ref: ScheduleRef, note: str | None = None) -> str:
        """Do `verb` on the schedule `ref` names, if it is still as seen. Returns what was done;
        raises StaleRow, or the service's own errors (InvalidInput, StorageError, ...)."""
        service = self._service_engine().service
        try:
            current = service.get(ref.name, tenant=ref.tenant, actor=self.operator)
        except NotFound:
            raise StaleRow(
                f"{ref.label} no longer exists: it was deleted; nothing was done"
            ) from None
        if current.id != ref.id:
            raise StaleRow(
                f"{ref.label} was deleted and created again since you selected it; "
                "nothing was done: look at it again"
            )
        if current.version != ref.version:
            raise StaleRow(
                f"{ref.label} changed since you selected it (it is now "
                f"{current.status.value}); nothing was done: look at it again"
            )
        try:
            if verb is Verb.EDIT:
                return self._edit(current, ref, note or "")
            if verb is Verb.PAUSE:
                service.pause(
                    ref.name,
                    actor=self.operator,
                    tenant=ref.tenant,
                    note=note or None,
                    expected_version=ref.version,
                )
                return f"paused {ref.label}"
            if verb is Verb.RESUME:
                service.resume(
                    ref.name, actor=self.operator, tenant=ref.tenant, expected_version=ref.version
                )
                return f"resumed {ref.label}"
            run = service.trigger(
                ref.name, actor=self.operator, tenant=ref.tenant, expected_version=ref.version
            )
        except StaleVersion as exc:
            raise StaleRow(f"{exc}; nothing was done") from None
        return f"triggered {ref.label}: run {run.id}"

    def _edit(self, current: Schedule, ref: ScheduleRef, typed: str) -> str:
        """The changes typed as `vortos schedule edit` takes them, at the version seen."""
        try:
            words = shlex.split(typed)
        except ValueError as exc:  # an unclosed quote
            raise InvalidInput(f"the changes cannot be read: {exc}") from None
        changes = edit_patch(words, current.timezone)
        done = self._service_engine().service.patch(
            ref.name, changes, actor=self.operator, tenant=ref.tenant, expected_version=ref.version
        )
        if done.version == current.version:
            return f"{ref.label} already is so: nothing changed"
        changed = changed_fields(current.spec.to_json(), done.spec.to_json())
        return f"edited {ref.label} (version {done.version}): {', '.join(changed)}"

    def decide(self, verb: str, approval_id: str, reason: str | None = None) -> str:
        """Approve or reject a four-eyes request as this operator (through the service, which
        refuses the requester and operators without the approver role)."""
        service = self._service_engine().service
        if verb == "approve":
            done = service.approve(approval_id, actor=self.operator)
            return f"approved {done.id}: {done.operation.value} of {done.tenant}/{done.schedule}"
        done = service.reject(approval_id, actor=self.operator, reason=reason or "")
        return f"rejected {done.id}: {done.operation.value} of {done.tenant}/{done.schedule}"

    def verify_audit(
        self,
        *,
        full: bool = False,
        progress: Progress | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Verification:
        """Verify the audit chains this operator may read (refused if none), each from its
        last verification or, with `full`, from its start with its checkpoints and mark; and
        record how far. `progress` hears entries checked / total (not through a control
        socket, whose server verifies in one call)."""
        engine = self._service_engine()
        if isinstance(engine.service, RemoteService):
            # The key is the service account's: the control socket's server verifies.
            return engine.service.audit_verification(full=full)
        audit = engine.storage.audit
        chains, unreadable = engine.service.audit_chains_to_verify(actor=self.operator)
        result = verify(
            audit,
            audit.keys(),
            # Every chain for whoever may read every one: a chain deleted whole is named.
            chains=None if unreadable == 0 else chains,
            full=full,
            progress=progress,
            cancelled=cancelled,
            page=VERIFY_PAGE,
        )
        result.unreadable = unreadable
        return result

    def close(self) -> None:
        with self._lock:
            if self._engine is not None and self._owns:
                self._engine.close()
                self._engine = None
