"""Ports: the contracts every storage backend implements, and nothing else may assume."""

from engine.ports.dispatch import ChangeFeed, DispatchedFire, DispatchPort, DispatchReport, Resolver
from engine.ports.fire_queue import Fire, FireQueue
from engine.ports.lease import Lease, LeasePort
from engine.ports.runs import RunLedger, RunQuery
from engine.ports.schedules import ScheduleQuery, ScheduleStore
from engine.ports.storage import Storage

__all__ = [
    "ChangeFeed",
    "DispatchPort",
    "DispatchReport",
    "DispatchedFire",
    "Fire",
    "FireQueue",
    "Lease",
    "LeasePort",
    "Resolver",
    "RunLedger",
    "RunQuery",
    "ScheduleQuery",
    "ScheduleStore",
    "Storage",
]
