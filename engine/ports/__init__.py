"""Ports: the contracts every storage backend implements, and nothing else may assume."""

from engine.ports.dispatch import ChangeFeed, DispatchedFire, DispatchPort, DispatchReport, Resolver
from engine.ports.fire_queue import (
    Claim,
    EnqueueReport,
    Fire,
    FireQuery,
    FireQueue,
    FireState,
    HeartbeatReport,
    NewFire,
    Outcome,
    Settlement,
    SettleReport,
)
from engine.ports.lease import Lease, LeasePort
from engine.ports.runs import RunLedger, RunQuery
from engine.ports.schedules import ScheduleQuery, ScheduleStore
from engine.ports.storage import Storage

__all__ = [
    "ChangeFeed",
    "Claim",
    "DispatchPort",
    "DispatchReport",
    "DispatchedFire",
    "EnqueueReport",
    "Fire",
    "FireQuery",
    "FireQueue",
    "FireState",
    "HeartbeatReport",
    "Lease",
    "LeasePort",
    "NewFire",
    "Outcome",
    "Resolver",
    "RunLedger",
    "RunQuery",
    "ScheduleQuery",
    "ScheduleStore",
    "SettleReport",
    "Settlement",
    "Storage",
]
