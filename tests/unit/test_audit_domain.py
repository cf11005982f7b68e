"""The audit chain's pure parts: sealing, hashing, signing, keys and the walk."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from engine.domain.audit import (
    GENESIS,
    START,
    AuditEntry,
    AuditEvent,
    ChainPoint,
    ChainWalk,
    KeyRing,
    canonical,
    content_hash,
    parse_point,
    seal,
    tenant_chain,
    with_data_json,
)

KEY = b"k" * 32
OTHER = b"o" * 32


def chain_of(n: int, keys: KeyRing, tenant: str = "acme") -> list[AuditEntry]:
    entries: list[AuditEntry] = []
    at = START
    for i in range(n):
        entry = seal(
            AuditEvent("schedule.paused", actor="alice", tenant=tenant, data={"i": i, "z": [1]}),
            seq=at.seq + 1,
            at=1_000 + i,
            prev_hash=at.hash,
            keys=keys,
        )
        entries.append(entry)
        at = ChainPoint(entry.seq, entry.hash)
    return entries


def walk(entries: list[AuditEntry], keys: KeyRing) -> ChainWalk:
    w = ChainWalk(tenant_chain("acme"), keys)
    for entry in entries:
        if not w.feed(entry):
            break
    return w


def test_a_sealed_chain_walks_clean_and_starts_from_the_genesis_hash() -> None:
    keys = KeyRing([KEY])
    entries = chain_of(5, keys)
    assert entries[0].prev_hash == GENESIS
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5]
    w = walk(entries, keys)
    assert w.problem is None
    assert w.at == ChainPoint(5, entries[-1].hash)


def test_the_hash_does_not_depend_on_the_order_of_keys_in_data() -> None:
    common = {
        "chain": "system",
        "seq": 1,
        "event": "e",
        "actor": "a",
        "tenant": None,
        "schedule_id": None,
        "slot_key": None,
        "at": 1,
        "prev_hash": GENESIS,
    }
    one = content_hash(**common, data={"a": 1, "b": {"x": 1, "y": 2}})  # type: ignore[arg-type]
    two = content_hash(**common, data={"b": {"y": 2, "x": 1}, "a": 1})  # type: ignore[arg-type]
    assert one == two


@pytest.mark.parametrize(
    ("damage", "first_bad", "says"),
    [
        (lambda es: [*es[:2], replace(es[2], actor="eve"), *es[3:]], 3, "edited"),
        (lambda es: [*es[:2], *es[3:]], 3, "missing"),
        (lambda es: [*es[:2], es[3], es[2], *es[4:]], 3, "missing"),
        (lambda es: [*es[:3], es[2], *es[3:]], 4, "out of order or repeated"),
        (lambda es: [*es[:4], replace(es[4], signature="0" * 64)], 5, "signature"),
    ],
    ids=["edited", "deleted", "swapped", "repeated", "bad signature"],
)
def test_the_walk_stops_at_the_first_bad_entry(
    damage: Callable[[list[AuditEntry]], list[AuditEntry]], first_bad: int, says: str
) -> None:
    keys = KeyRing([KEY])
    w = walk(damage(chain_of(6, keys)), keys)
    assert w.problem is not None
    assert w.problem.seq == first_bad
    assert says in w.problem.reason


def test_an_entry_of_another_chain_in_the_middle_is_refused() -> None:
    keys = KeyRing([KEY])
    entries = chain_of(3, keys)
    stranger = chain_of(1, keys, tenant="globex")[0]
    w = walk([entries[0], replace(stranger, seq=2), entries[2]], keys)
    assert w.problem is not None
    assert w.problem.seq == 2


def test_after_a_rotation_old_entries_verify_with_the_old_key_and_new_ones_sign_new() -> None:
    old = KeyRing([KEY])
    before = chain_of(2, old)
    rotated = KeyRing([KEY, OTHER])
    assert rotated.active_id != old.active_id
    last = before[-1]
    after = seal(
        AuditEvent("schedule.resumed", actor="bob", tenant="acme"),
        seq=3,
        at=5_000,
        prev_hash=last.hash,
        keys=rotated,
    )
    assert after.key_id == rotated.active_id
    assert walk([*before, after], rotated).problem is None
    # Without the old key, the old entries alone cannot be told genuine: nothing the
    # verifier holds vouches for them (not tampering: unverifiable).
    alone = walk(before, KeyRing([OTHER])).finish()
    assert alone is not None
    assert alone.unverifiable
    assert "signed only with the secret key" in alone.reason
    # A later entry signed with a key held vouches for them: its hash covers theirs.
    assert walk([*before, after], KeyRing([OTHER])).finish() is None


def test_a_key_ring_refuses_short_keys_and_no_keys() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        KeyRing([b"short"])
    with pytest.raises(ValueError, match="at least one key"):
        KeyRing([])


def test_heads_parse_as_verify_prints_them() -> None:
    point = ChainPoint(42, "a" * 64)
    assert parse_point(point.spelled()) == point
    for bad in ("42", "x:" + "a" * 64, "42:abc", "42:" + "g" * 64):
        with pytest.raises(ValueError, match="SEQ:HASH"):
            parse_point(bad)


def test_entries_survive_a_json_round_trip() -> None:
    entry = chain_of(1, KeyRing([KEY]))[0]
    assert AuditEntry.from_json(entry.to_json()) == entry


def test_a_sealed_entry_keeps_the_canonical_text_it_hashed_for_storing() -> None:
    entry = chain_of(1, KeyRing([KEY]))[0]
    assert entry.data_json == canonical(dict(entry.data)) == '{"i":0,"z":[1]}'
    assert entry.hash == content_hash(
        chain=entry.chain,
        seq=entry.seq,
        event=entry.event,
        actor=entry.actor,
        tenant=entry.tenant,
        schedule_id=entry.schedule_id,
        slot_key=entry.slot_key,
        at=entry.at,
        data=entry.data,
        prev_hash=entry.prev_hash,
    )


def test_a_copy_with_other_data_does_not_keep_the_text_of_the_old_data() -> None:
    keys = KeyRing([KEY])
    entries = chain_of(3, keys)
    edited = replace(entries[1], data={"i": 99, "z": [1]})
    assert edited.data_json is None
    w = walk([entries[0], edited, entries[2]], keys)
    assert w.problem is not None
    assert (w.problem.seq, "edited" in w.problem.reason) == (2, True)


@pytest.mark.parametrize(
    ("text", "intact"),
    [
        ('{"i":1,"z":[1]}', True),  # the canonical text sealed
        ('{ "z": [1], "i": 1 }', True),  # the same content spelled otherwise: as before
        ('{"i":7,"z":[1]}', False),  # other content, canonical
        ('{ "z": [1], "i": 7 }', False),  # other content, spelled otherwise
    ],
    ids=["canonical", "respelled", "changed", "changed and respelled"],
)
def test_an_entry_read_from_text_is_judged_by_its_content(text: str, intact: bool) -> None:
    keys = KeyRing([KEY])
    entries = chain_of(3, keys)
    read = with_data_json(replace(entries[1], data=json.loads(text)), text)
    w = walk([entries[0], read, entries[2]], keys)
    assert (w.problem is None) == intact
    if not intact:
        assert w.problem is not None
        assert (w.problem.seq, "edited" in w.problem.reason) == (2, True)
