"""The control socket's reads: every read an operator's CLI or console makes, answered by the
service as the account the kernel reports, narrowed by the service's access control to what
that account may view. With a control socket configured the operators' tools never open the
database: these are what they see.

Every request is bounded: list sizes within the CLI's own limits, and no answer longer than
half of MAX_LINE; a list that would be longer comes in windows (`{"items", "next"}`: ask
again with `offset` = next), a page of the console's read model is cut short (`more` set).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from engine.control.codec import to_wire
from engine.control.request import (
    Args,
    ControlContext,
    Handler,
    bounded,
    maybe_int,
    maybe_text,
    names,
    text,
)
from engine.control.wire import MAX_LINE
from engine.domain.access import Operation, PermissionDenied
from engine.domain.approvals import ApprovalState
from engine.domain.errors import InvalidInput, StorageError
from engine.domain.preview import PREVIEW_MAX
from engine.domain.run import RunState
from engine.domain.schedule import DEFAULT_TENANT, ScheduleStatus
from engine.ports.fire_queue import Fire
from engine.ports.read_model import PAGE_MAX, FireListQuery, ReadModel, ScheduleListQuery
from engine.ports.runs import RunQuery
from engine.service.audit_trail import AUDIT_PAGE_MAX
from engine.service.queue import DEAD_LETTER_PAGE_MAX

ANSWER_BUDGET = MAX_LINE // 2  # bytes of rows in one answer (the rest: room for the envelope)
LIST_MAX = 100_000  # rows one list may ask for (the CLI's own --limit bound)

T = TypeVar("T")


# -- windows ------------------------------------------------------------------------------------


def window(items: Sequence[Any], offset: int) -> dict[str, Any]:
    """The rows of `items` from `offset` that fit one answer; `next` is where the following
    window starts (None: this one ends the list)."""
    rows, taken = fit([to_wire(item) for item in items[offset:]])
    after = offset + taken
    return {"items": rows, "next": after if after < len(items) else None}


def fit(encoded: list[Any]) -> tuple[list[Any], int]:
    """As many of these encoded rows, from the first, as fit one answer (at least one), and
    how many. Rows are measured one by one only when all of them do not fit at once: most
    answers are far under the budget, and measuring each row cost as much as encoding it."""
    if len(json.dumps(encoded, ensure_ascii=False)) <= ANSWER_BUDGET:
        return encoded, len(encoded)
    used = 0
    for taken, row in enumerate(encoded):
        size = len(json.dumps(row, ensure_ascii=False))
        if taken and used + size > ANSWER_BUDGET:
            return encoded[:taken], taken
        used += size
    return encoded, len(encoded)


def _offset(a: Args) -> int:
    return bounded(a, "offset", 0, LIST_MAX, 0)


def _choice(a: Args, key: str, kind: type[T]) -> T | None:
    value = maybe_text(a, key)
    if value is None:
        return None
    try:
        return kind(value)  # type: ignore[call-arg]
    except ValueError:
        options = ", ".join(str(v.value) for v in kind)  # type: ignore[attr-defined]
        raise InvalidInput(f"the request's {key!r} is {value!r}: one of {options}") from None


# -- who ----------------------------------------------------------------------------------------


def _whoami(c: ControlContext, a: Args) -> dict[str, Any]:
    """Who the server sees on this end, what they hold, and the tenants they may view."""
    access = c.service.access
    assert access is not None  # a control server's service always checks access
    scope = c.service.scope(c.actor)
    identity = access.identities.identity(c.actor)
    return {
        "operator": c.actor,
        "grants": to_wire(identity.grants),
        "tenants": None if scope.tenants is None else sorted(scope.tenants),
    }


# -- schedules and runs -------------------------------------------------------------------------


def _schedules(c: ControlContext, a: Args) -> dict[str, Any]:
    found = c.service.schedules(
        tenant=maybe_text(a, "tenant"),
        status=_choice(a, "status", ScheduleStatus),
        limit=bounded(a, "limit", 1, LIST_MAX, 1000),
        actor=c.actor,
    )
    return window(found, _offset(a))


def _schedule(c: ControlContext, a: Args) -> dict[str, Any]:
    found = c.service.get(text(a, "name"), tenant=text(a, "tenant", DEFAULT_TENANT), actor=c.actor)
    return {"schedule": to_wire(found)}


def _preview(c: ControlContext, a: Args) -> dict[str, Any]:
    slots = c.service.preview(
        text(a, "name"),
        tenant=text(a, "tenant", DEFAULT_TENANT),
        count=bounded(a, "count", 1, PREVIEW_MAX, 10),
        after_ms=maybe_int(a, "after_ms"),
        actor=c.actor,
    )
    return {"slots": to_wire(slots)}


def _runs(c: ControlContext, a: Args) -> dict[str, Any]:
    since, until = maybe_int(a, "since_ms"), maybe_int(a, "until_ms")
    if since is not None and until is not None and until <= since:
        raise InvalidInput("the request's 'until_ms' must be after 'since_ms'")
    found = c.service.runs(
        RunQuery(
            tenant=maybe_text(a, "tenant"),
            schedule_id=maybe_text(a, "schedule_id"),
            state=_choice(a, "state", RunState),
            since_ms=since,
            until_ms=until,
            limit=bounded(a, "limit", 1, LIST_MAX, 100),
        ),
        actor=c.actor,  # the service narrows the query to the actor's tenants
    )
    return window(found, _offset(a))


def _run(c: ControlContext, a: Args) -> dict[str, Any]:
    run_id = maybe_int(a, "run_id")
    if run_id is None:
        raise InvalidInput("the request needs 'run_id'")
    return {"run": to_wire(c.service.run(run_id, actor=c.actor))}


def _without_token(fire: Fire) -> Fire:
    """A fire as an operator sees it: a consumer's lease token is no reader's business."""
    return dataclasses.replace(fire, lease_token=None)


def _dead_letters(c: ControlContext, a: Args) -> dict[str, Any]:
    found = c.service.dead_letters(
        tenant=maybe_text(a, "tenant"),
        limit=bounded(a, "limit", 1, DEAD_LETTER_PAGE_MAX, 100),
        actor=c.actor,
    )
    return window([_without_token(f) for f in found], _offset(a))


# -- approvals, operators, retention ------------------------------------------------------------


def _approvals(c: ControlContext, a: Args) -> dict[str, Any]:
    found = c.service.approvals(
        actor=c.actor,
        tenant=maybe_text(a, "tenant"),
        state=_choice(a, "state", ApprovalState),
        limit=bounded(a, "limit", 1, 10_000, 100),
    )
    return window(found, _offset(a))


def _approval(c: ControlContext, a: Args) -> dict[str, Any]:
    found = c.service.approval(
        text(a, "approval_id"), actor=c.actor, tenant=maybe_text(a, "tenant")
    )
    return {"approval": to_wire(found)}


def _operators(c: ControlContext, a: Args) -> dict[str, Any]:
    return {"grants": to_wire(c.service.operators(actor=c.actor))}


def _retention(c: ControlContext, a: Args) -> dict[str, Any]:
    view = c.service.retention(actor=c.actor)
    return {
        "settings": view.settings.to_payload(),
        "source": view.source,
        "overrides": to_wire(view.overrides),
    }


# -- the audit trail ----------------------------------------------------------------------------


def _audit_chains(c: ControlContext, a: Args) -> dict[str, Any]:
    return {"chains": c.service.audit_chains(actor=c.actor, wanted=names(a, "wanted"))}


def _audit_tail(c: ControlContext, a: Args) -> dict[str, Any]:
    found = c.service.audit_latest(
        actor=c.actor, chain=maybe_text(a, "chain"), limit=bounded(a, "limit", 1, 10_000, 20)
    )
    return window(found, _offset(a))


def _audit_entries(c: ControlContext, a: Args) -> dict[str, Any]:
    """A page of one chain, for an export: as many entries as fit, from after `after_seq`;
    the client asks again after the last one it got until a page comes back empty."""
    found = c.service.audit_entries(
        text(a, "chain"),
        actor=c.actor,
        after_seq=bounded(a, "after_seq", 0, 2**62, 0),
        limit=bounded(a, "limit", 1, AUDIT_PAGE_MAX, 1000),
    )
    return {"entries": window(found, 0)["items"]}


# -- the site -----------------------------------------------------------------------------------


def _db_info(c: ControlContext, a: Args) -> dict[str, Any]:
    return {"facts": c.service.database_info(actor=c.actor)}


def _doctor(c: ControlContext, a: Args) -> dict[str, Any]:
    """The service's own doctor, on its view of the database. Its findings name schedules of
    every tenant, so it answers only a viewer of every tenant."""
    try:
        assert c.service.access is not None
        c.service.access.authorize(c.actor, Operation.VIEW, None)
    except PermissionDenied:
        raise PermissionDenied(
            f"{c.actor} may not run the doctor through the control socket: its findings "
            "name every tenant's schedules, so it needs the viewer role in every tenant "
            "(`vortos operators grant NAME viewer`)"
        ) from None
    if c.doctor is None:
        raise StorageError("this server runs no doctor: run `vortos doctor` as its account")
    return {"report": c.doctor().to_json()}


# -- the console's read model -------------------------------------------------------------------


def _model(c: ControlContext) -> ReadModel:
    if c.read_model is None:
        raise StorageError(
            "this control socket serves no console reads: start it with `vortos run "
            "--control-socket` of the same release"
        )
    return c.read_model(c.actor)


def _read(c: ControlContext, call: Any) -> Any:
    """One call of the console's read model narrowed to the actor, on a loop of its own
    (this is a connection's thread)."""
    model = _model(c)

    async def once() -> Any:
        try:
            coroutine: Coroutine[Any, Any, Any] = call(model)
            return await coroutine
        finally:
            await model.close()

    return asyncio.run(once())


def _page(page: Any) -> dict[str, Any]:
    """A read model's page, cut to fit one answer (then `more` says rows follow)."""
    encoded = to_wire(page)
    rows, taken = fit(encoded["rows"])
    if taken < len(encoded["rows"]):
        encoded["rows"] = rows
        encoded["more"] = True
    return {"page": encoded}


def _query_limit(a: Args) -> int:
    return bounded(a, "limit", 1, PAGE_MAX, 200)


def _console_overview(c: ControlContext, a: Args) -> dict[str, Any]:
    now = maybe_int(a, "now_ms")
    if now is None:
        raise InvalidInput("the request needs 'now_ms'")
    return {"overview": to_wire(_read(c, lambda m: m.overview(now)))}


def _console_schedules(c: ControlContext, a: Args) -> dict[str, Any]:
    query = ScheduleListQuery(
        text=maybe_text(a, "text"),
        tenant=maybe_text(a, "tenant"),
        status=_choice(a, "status", ScheduleStatus),
        offset=_offset(a),
        limit=_query_limit(a),
    )
    return _page(_read(c, lambda m: m.schedules(query)))


def _console_fires(c: ControlContext, a: Args) -> dict[str, Any]:
    query = FireListQuery(
        text=maybe_text(a, "text"),
        tenant=maybe_text(a, "tenant"),
        state=_choice(a, "state", RunState),
        schedule_id=maybe_text(a, "schedule_id"),
        offset=_offset(a),
        limit=_query_limit(a),
    )
    return _page(_read(c, lambda m: m.fires(query)))


def _console_schedule(c: ControlContext, a: Args) -> dict[str, Any]:
    schedule_id = text(a, "schedule_id")
    runs = bounded(a, "runs", 0, PAGE_MAX, 20)
    found = _read(c, lambda m: m.schedule(schedule_id, runs=runs))
    if found is not None:
        cut = window(found.runs, 0)
        found = dataclasses.replace(found, runs=found.runs[: len(cut["items"])])
    return {"detail": to_wire(found)}


def _console_run(c: ControlContext, a: Args) -> dict[str, Any]:
    run_id = maybe_int(a, "run_id")
    if run_id is None:
        raise InvalidInput("the request needs 'run_id'")
    found = _read(c, lambda m: m.run(run_id))
    if found is not None and found.fire is not None:
        found = dataclasses.replace(found, fire=_without_token(found.fire))
    return {"detail": to_wire(found)}


def _console_audit(c: ControlContext, a: Args) -> dict[str, Any]:
    chain = maybe_text(a, "chain")
    limit = bounded(a, "limit", 1, PAGE_MAX, 50)
    found = _read(c, lambda m: m.audit(chain, limit=limit))
    cut = window(found.recent, 0)
    found = dataclasses.replace(found, recent=found.recent[: len(cut["items"])])
    return {"audit": to_wire(found)}


def _console_approvals(c: ControlContext, a: Args) -> dict[str, Any]:
    limit = bounded(a, "limit", 1, PAGE_MAX, 100)
    found = _read(c, lambda m: m.approvals(limit=limit))
    return {"approvals": window(found, 0)["items"]}


READS: dict[str, Handler] = {
    "whoami": _whoami,
    "schedules": _schedules,
    "schedule": _schedule,
    "preview": _preview,
    "runs": _runs,
    "run": _run,
    "dead_letters": _dead_letters,
    "approvals": _approvals,
    "approval": _approval,
    "operators": _operators,
    "retention": _retention,
    "audit_chains": _audit_chains,
    "audit_tail": _audit_tail,
    "audit_entries": _audit_entries,
    "db_info": _db_info,
    "doctor": _doctor,
    "console_overview": _console_overview,
    "console_schedules": _console_schedules,
    "console_fires": _console_fires,
    "console_schedule": _console_schedule,
    "console_run": _console_run,
    "console_audit": _console_audit,
    "console_approvals": _console_approvals,
}

__all__ = ["READS", "window"]
