"""Handing fires to another transport (a message broker) instead of running them here."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from engine.ports.fire_queue import Fire


@runtime_checkable
class Enqueuer(Protocol):
    """Where a consumer sends each fire when the `enqueuer` setting names one.

    The built-in fire queue stays the outbox that makes dispatch exactly once: a consumer
    claims a fire from it as always, calls `enqueue`, and settles the fire completed when the
    call returns (the run's output says where it went). The broker's own workers then run it.

    Contract:
    - `enqueue` returns only once the transport has accepted the fire durably.
    - It is at least once: a consumer that crashes between `enqueue` and its settle makes
      another consumer enqueue the same fire again. Deduplicate on `fire.slot_key` (unique per
      tenant, the same on every attempt) or `fire.run_id`, e.g. as the message id.
    - Raising means "not accepted": the fire is retried with the schedule's retry policy, and
      dead-lettered when that is spent, exactly as a failing command is.
    - It is called from the consumer's worker threads, several at once: be thread-safe.
    - `close` is called once at shutdown, after the last `enqueue`.
    """

    def enqueue(self, fire: Fire) -> None: ...

    def close(self) -> None: ...
