"""The audit sink's contract (engine.ports.audit_sink): every entry delivered is stored once,
intact and in order, however often it is delivered and however often the sink is reopened."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from engine.domain.audit import (
    GENESIS,
    SYSTEM_CHAIN,
    AuditEntry,
    AuditEvent,
    ChainWalk,
    KeyRing,
    seal,
    tenant_chain,
)
from engine.domain.timeutil import parse_instant
from engine.ports.audit_sink import AuditSink

# When the suite's entries happened: a Monday, midnight UTC, one second apart.
T0 = parse_instant("2026-01-05T00:00:00Z")
KEYS = KeyRing([b"audit-sink-conformance-key-0001"])

# Every field an entry carries, as AuditEntry declares them (data_json is how it was encoded,
# not what it says, and is not compared).
FIELDS = tuple(f.name for f in dataclasses.fields(AuditEntry) if f.compare)


def _event(chain: str, seq: int) -> AuditEvent:
    """An event whose fields differ from entry to entry, with every optional field filled in
    on some entries and left out on others, and data that JSON can get wrong."""
    tenant = None if chain == SYSTEM_CHAIN else chain.removeprefix("tenant:")
    if seq % 2:
        return AuditEvent(
            event="fire.dispatched",
            actor=f"node-{seq}",
            tenant=tenant,
            schedule_id=f"nightly-report-{seq}",
            slot_key=f"nightly-report-{seq}@2026-01-05T02:30:00+01:00",
            data={
                "attempt": seq,
                "ratio": 0.25,
                "late": False,
                "note": 'Zürich — 東京 "quoted" \\ back\nslash',
                "labels": ["a", "b"],
                "nested": {"none": None, "empty": {}, "list": []},
            },
        )
    return AuditEvent(event="schedule.paused", actor=f"alice-{seq}", tenant=tenant)


def audit_chain(chain: str, count: int) -> list[AuditEntry]:
    """The first `count` entries of `chain` (seq 1..count), hashed, linked and signed as the
    engine seals them."""
    entries: list[AuditEntry] = []
    prev_hash = GENESIS
    for seq in range(1, count + 1):
        entry = seal(
            _event(chain, seq), seq=seq, at=T0 + seq * 1000, prev_hash=prev_hash, keys=KEYS
        )
        entries.append(entry)
        prev_hash = entry.hash
    return entries


def _of_chain(entries: Sequence[AuditEntry], chain: str) -> list[AuditEntry]:
    return [e for e in entries if e.chain == chain]


def _seqs(entries: Sequence[AuditEntry]) -> list[tuple[str, int]]:
    return [(e.chain, e.seq) for e in entries]


class AuditSinkConformance:
    """Subclass this suite and implement `open_sink` and `stored`:

        class TestMySink(AuditSinkConformance):
            def open_sink(self, directory): return closing(MySink(directory / "copy"))
            def stored(self, directory): return read_my_copy(directory / "copy")

    Each test gets an empty directory of its own. `open_sink` gives a sink storing under it
    (opened again on the same directory, it continues the same copy); `stored` reads that copy
    back. `stored` is called while the sink is open as well as after it closed: a `deliver`
    that returned has stored its entries. The entries are real ones, sealed and signed as the
    engine seals them.
    """

    def open_sink(self, directory: Path) -> AbstractContextManager[AuditSink]:
        """A context manager giving a sink that stores its copy under `directory`, closed at
        its end. Opening it again on the same directory continues the same copy."""
        raise NotImplementedError(f"{type(self).__name__} must implement open_sink")

    def stored(self, directory: Path) -> list[AuditEntry]:
        """What the copy under `directory` holds, read back, in the order it was stored."""
        raise NotImplementedError(f"{type(self).__name__} must implement stored")

    @pytest.fixture
    def directory(self, tmp_path: Path) -> Path:
        where = tmp_path / "audit-sink"
        where.mkdir()
        return where

    @pytest.fixture
    def sink(self, directory: Path) -> Iterator[AuditSink]:
        with self.open_sink(directory) as opened:
            yield opened

    # --- what is stored ------------------------------------------------------------------

    def test_delivered_entries_round_trip_every_field(
        self, sink: AuditSink, directory: Path
    ) -> None:
        entries = audit_chain(tenant_chain("acme"), 4)

        sink.deliver(entries)
        stored = self.stored(directory)

        assert _seqs(stored) == _seqs(entries), (
            "a delivered entry is stored once: the copy should hold exactly the entries delivered"
        )
        for sent, back in zip(entries, stored, strict=True):
            for name in FIELDS:
                assert getattr(back, name) == getattr(sent, name), (
                    f"every field round-trips: {name} of entry {sent.chain}#{sent.seq} changed"
                )

    def test_stored_copy_verifies_against_the_key_ring(
        self, sink: AuditSink, directory: Path
    ) -> None:
        entries = audit_chain(SYSTEM_CHAIN, 5)

        sink.deliver(entries)
        walk = ChainWalk(SYSTEM_CHAIN, KEYS)
        intact = all(walk.feed(entry) for entry in self.stored(directory))

        assert intact, f"a stored copy is tamper-evident as the original is: {walk.problem}"
        assert walk.checked == 5, "a stored copy holds the whole chain delivered"

    def test_order_within_a_chain_is_kept(self, sink: AuditSink, directory: Path) -> None:
        entries = audit_chain(SYSTEM_CHAIN, 9)

        for start in range(0, 9, 3):
            sink.deliver(entries[start : start + 3])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "order within a chain is kept: entries are stored in the order delivered"
        )

    def test_several_chains_are_independent(self, sink: AuditSink, directory: Path) -> None:
        acme, globex = audit_chain(tenant_chain("acme"), 4), audit_chain(tenant_chain("globex"), 4)
        system = audit_chain(SYSTEM_CHAIN, 2)

        # Interleaved, as the shipper delivers chains on threads of their own; every chain
        # starts at seq 1, which must not be taken for a repeat of another chain's seq 1.
        sink.deliver(acme[:2])
        sink.deliver(globex[:3])
        sink.deliver(system)
        sink.deliver(acme[2:])
        sink.deliver(globex[3:])
        stored = self.stored(directory)

        for chain, entries in (("tenant:acme", acme), ("tenant:globex", globex)):
            assert _seqs(_of_chain(stored, chain)) == _seqs(entries), (
                f"chains are independent: {chain} should hold its own entries, in order"
            )
        assert _seqs(_of_chain(stored, SYSTEM_CHAIN)) == _seqs(system), (
            "chains are independent: the system chain should hold its own entries"
        )
        assert len(stored) == 10, "chains are independent: nothing stored twice or lost"

    def test_empty_delivery_stores_nothing(self, sink: AuditSink, directory: Path) -> None:
        sink.deliver([])

        assert self.stored(directory) == [], "an empty delivery stores nothing"

    def test_empty_delivery_leaves_what_is_stored(self, sink: AuditSink, directory: Path) -> None:
        entries = audit_chain(SYSTEM_CHAIN, 3)
        sink.deliver(entries)

        sink.deliver([])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "an empty delivery stores nothing and removes nothing"
        )

    # --- at-least-once delivery ----------------------------------------------------------

    def test_redelivery_stores_nothing_twice(self, sink: AuditSink, directory: Path) -> None:
        entries = audit_chain(SYSTEM_CHAIN, 4)
        sink.deliver(entries)

        sink.deliver(entries)
        sink.deliver(entries[2:])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "delivery is at least once: entries delivered again are stored once"
        )

    def test_redelivery_after_reopening_stores_nothing_twice(self, directory: Path) -> None:
        entries = audit_chain(tenant_chain("acme"), 4)
        with self.open_sink(directory) as sink:
            sink.deliver(entries)

        with self.open_sink(directory) as sink:
            sink.deliver(entries)
            sink.deliver(entries[3:])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "delivery is at least once, across restarts too: entries stored before the sink "
            "was reopened are stored once"
        )

    def test_redelivered_batch_stores_only_its_new_entries(
        self, sink: AuditSink, directory: Path
    ) -> None:
        entries = audit_chain(SYSTEM_CHAIN, 6)
        sink.deliver(entries[:4])

        sink.deliver(entries[2:])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "a batch overlapping what is stored stores only the entries after it"
        )

    def test_overlapping_batch_after_reopening_stores_only_its_new_entries(
        self, directory: Path
    ) -> None:
        entries = audit_chain(SYSTEM_CHAIN, 6)
        with self.open_sink(directory) as sink:
            sink.deliver(entries[:4])

        with self.open_sink(directory) as sink:
            sink.deliver(entries[1:])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "a batch overlapping what was stored before the sink was reopened stores only the "
            "entries after it"
        )

    # --- closing -------------------------------------------------------------------------

    def test_close_then_reopen_keeps_everything(self, directory: Path) -> None:
        acme, system = audit_chain(tenant_chain("acme"), 3), audit_chain(SYSTEM_CHAIN, 2)
        with self.open_sink(directory) as sink:
            sink.deliver(acme)
            sink.deliver(system)

        with self.open_sink(directory):
            pass
        stored = self.stored(directory)

        assert _seqs(_of_chain(stored, "tenant:acme")) == _seqs(acme), (
            "close then reopen keeps everything stored"
        )
        assert _seqs(_of_chain(stored, SYSTEM_CHAIN)) == _seqs(system), (
            "close then reopen keeps everything stored"
        )

    def test_reopened_sink_continues_the_same_copy(self, directory: Path) -> None:
        entries = audit_chain(tenant_chain("acme"), 5)
        with self.open_sink(directory) as sink:
            sink.deliver(entries[:2])

        with self.open_sink(directory) as sink:
            sink.deliver(entries[2:])

        assert _seqs(self.stored(directory)) == _seqs(entries), (
            "a reopened sink continues the same copy: what it stores follows what was stored"
        )
