"""Rows to domain objects and back."""

from __future__ import annotations

import functools
import json
from typing import Any

from engine.domain.errors import InvalidInput, StorageError
from engine.domain.retry import RetryPolicy
from engine.domain.run import Run, RunKind, RunState
from engine.domain.schedule import (
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleOrigin,
    ScheduleStatus,
    StaticOverride,
    canonical_json,
)
from engine.domain.triggers import Trigger, trigger_from_spec

SCHEDULE_COLUMNS = (
    "id, tenant, name, trigger_kind, trigger_spec, timezone, command, payload, misfire, overlap, "
    "jitter_ms, status, sensitive, metadata, pause_note, version, next_slot_at, next_fire_at, "
    "created_at, updated_at, origin, retry, declared_paused, override, timeout_ms"
)

RUN_COLUMNS = (
    "id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, state, "
    "dispatched_at, node_id, attempts, finished_at, error, started_at, consumer, exit_code, "
    "output, abandoned"
)


def misfire_json(policy: MisfirePolicy) -> str:
    return canonical_json(
        {
            "kind": policy.kind.value,
            "catch_up_cap": policy.catch_up_cap,
            "max_age_ms": policy.max_age_ms,
            "grace_ms": policy.grace_ms,
        }
    )


def schedule_values(s: Schedule) -> tuple[Any, ...]:
    """The row for SCHEDULE_COLUMNS, in order."""
    return (
        s.id,
        s.tenant,
        s.name,
        s.trigger.kind,
        canonical_json(s.trigger.to_spec()),
        s.timezone,
        s.command,
        canonical_json(dict(s.payload)),
        misfire_json(s.misfire),
        s.overlap.value,
        s.jitter_ms,
        s.status.value,
        int(s.sensitive),
        canonical_json(dict(s.metadata)),
        s.pause_note,
        s.version,
        s.next_slot_at,
        s.next_fire_at,
        s.created_at,
        s.updated_at,
        s.origin.value,
        canonical_json(s.retry.to_json()),
        int(s.declared_paused),
        None if s.override is None else canonical_json(s.override.to_json()),
        s.timeout_ms,
    )


def schedule_from_row(row: tuple[Any, ...]) -> Schedule:
    """Decode a row; a row that cannot be decoded raises StorageError naming it."""
    try:
        return _decode_schedule(row)
    except (KeyError, ValueError, TypeError, InvalidInput) as exc:
        raise StorageError(
            f"schedule {row[0]} ({row[1]}/{row[2]}) is stored in a form this Vortos cannot read "
            f"({type(exc).__name__}: {exc}); delete it or restore it from a backup"
        ) from None


# The frozen parts of a schedule, decoded once per distinct stored text: a daemon reading
# 10,000 definitions mostly meets the same few triggers and policies (bounded caches).
@functools.lru_cache(maxsize=4096)
def _trigger(kind: str, spec: str) -> Trigger:
    return trigger_from_spec(kind, json.loads(spec))


@functools.lru_cache(maxsize=1024)
def _misfire(text: str) -> MisfirePolicy:
    m = json.loads(text)
    return MisfirePolicy(MisfireKind(m["kind"]), m["catch_up_cap"], m["max_age_ms"], m["grace_ms"])


@functools.lru_cache(maxsize=1024)
def retry_policy_from(text: str) -> RetryPolicy:
    """A stored retry policy (its JSON column), decoded once per distinct spelling."""
    return RetryPolicy.from_json(json.loads(text))


def _decode_schedule(row: tuple[Any, ...]) -> Schedule:
    (
        sid,
        tenant,
        name,
        kind,
        spec,
        tz,
        command,
        payload,
        misfire,
        overlap,
        jitter,
        status,
        sensitive,
        metadata,
        note,
        version,
        next_slot,
        next_fire,
        created,
        updated,
        origin,
        retry,
        declared_paused,
        override,
        timeout_ms,
    ) = row
    return Schedule(
        id=sid,
        tenant=tenant,
        name=name,
        trigger=_trigger(kind, spec),
        timezone=tz,
        command=command,
        payload=json.loads(payload),
        misfire=_misfire(misfire),
        overlap=OverlapPolicy(overlap),
        jitter_ms=jitter,
        status=ScheduleStatus(status),
        sensitive=bool(sensitive),
        metadata=json.loads(metadata),
        version=version,
        next_slot_at=next_slot,
        next_fire_at=next_fire,
        created_at=created,
        updated_at=updated,
        pause_note=note,
        origin=ScheduleOrigin(origin),
        retry=retry_policy_from(retry),
        declared_paused=bool(declared_paused),
        override=None if override is None else StaticOverride.from_json(json.loads(override)),
        timeout_ms=timeout_ms,
    )


def run_from_row(row: tuple[Any, ...]) -> Run:
    (
        rid,
        tenant,
        sid,
        sname,
        key,
        slot_at,
        due_at,
        kind,
        state,
        dispatched_at,
        node,
        attempts,
        finished,
        error,
        started,
        consumer,
        exit_code,
        output,
        abandoned,
    ) = row
    return Run(
        id=rid,
        tenant=tenant,
        schedule_id=sid,
        schedule_name=sname,
        slot_key=key,
        slot_at=slot_at,
        due_at=due_at,
        kind=RunKind(kind),
        state=RunState(state),
        dispatched_at=dispatched_at,
        node_id=node,
        attempts=attempts,
        finished_at=finished,
        error=error,
        started_at=started,
        consumer=consumer,
        exit_code=exit_code,
        output=output,
        abandoned=abandoned,
    )
