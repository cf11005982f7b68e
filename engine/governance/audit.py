"""Verifying audit chains: incrementally from the last verification, or in full, or offline
from an export; and exporting them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TextIO

from engine.domain.audit import (
    CHAIN_OPENED,
    CHECKPOINT_EVERY,
    GENESIS,
    START,
    Anchor,
    AuditEntry,
    ChainPoint,
    ChainProblem,
    ChainWalk,
    Checkpoint,
    KeyRing,
    VerificationMark,
    anchor_message,
    chain_tenant,
    checkpoint_message,
    entry_message,
    parse_point,
    tenant_chain,
)
from engine.domain.audit_keys import KeyKind, KeyLineage, KeyPeriod, LineageBroken, verify_signed
from engine.domain.errors import VortosError
from engine.domain.timeutil import iso_utc
from engine.governance.ledger import LedgerCheck
from engine.ports.audit import AuditLog

PAGE = 10_000


class VerifyMode(StrEnum):
    INCREMENTAL = "incremental"  # from the signed verification mark: earlier entries trusted
    FULL = "full"  # every entry, every checkpoint and the mark
    EXPORT = "export"  # an export, offline: every entry it holds, from the chain's start


class VerificationCancelled(VortosError):
    """The verifier asked to stop: chains not finished were not verified, nor recorded."""


# Entries checked so far and the total to check, over every chain of one verification.
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class ChainReport:
    chain: str
    head: ChainPoint
    resumed_from: int  # the sequence verification started after (0: the chain's start)
    checked: int = 0  # entries whose hash and signature were checked now
    problem: ChainProblem | None = None
    mode: VerifyMode = VerifyMode.INCREMENTAL
    # When the signed mark trusted for entries 1..resumed_from was made (None: none trusted).
    mark_at: int | None = None
    checkpoints_checked: int = 0  # signed checkpoints compared with their entries now
    # The walk found an entry broken: the last entry it verified before it (not reported).
    verified_to: ChainPoint | None = None
    seals_checked: int = 0  # Ed25519 signatures checked now (openings, seals, checkpoints)
    batches_checked: int = 0  # dispatch batches whose run rows matched their digest
    partly_pruned: int = 0  # batches with runs retention pruned (the rest not matched)
    anchored_at: int = 0  # entries up to this were archived: verified from the signed anchor

    @property
    def intact(self) -> bool:
        return self.problem is None

    @property
    def trusted_through(self) -> int:
        """Entries up to this sequence were not checked now: trusted from the mark."""
        return self.resumed_from

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "intact": self.intact,
            "head": self.head.spelled(),
            "head_seq": self.head.seq,
            "resumed_from": self.resumed_from,
            "checked": self.checked,
            "first_bad_seq": None if self.problem is None else self.problem.seq,
            "problem": None if self.problem is None else self.problem.reason,
            "unverifiable": self.problem is not None and self.problem.unverifiable,
            "mode": self.mode.value,
            "trusted_through": self.trusted_through,
            "mark_at": self.mark_at,
            "checkpoints_checked": self.checkpoints_checked,
            "seals_checked": self.seals_checked,
            "batches_checked": self.batches_checked,
            "partly_pruned": self.partly_pruned,
            "anchored_at": self.anchored_at,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ChainReport:
        """A report as `to_json` wrote it (a control socket's verification)."""
        bad = value.get("first_bad_seq")
        mark_at = value.get("mark_at")
        return cls(
            chain=str(value["chain"]),
            head=parse_point(str(value["head"])),
            resumed_from=int(value["resumed_from"]),
            checked=int(value["checked"]),
            problem=None
            if bad is None
            else ChainProblem(
                int(bad), str(value["problem"]), bool(value.get("unverifiable", False))
            ),
            # A server from before these keys verified incrementally and said nothing more.
            mode=VerifyMode(str(value.get("mode", VerifyMode.INCREMENTAL.value))),
            mark_at=None if mark_at is None else int(mark_at),
            checkpoints_checked=int(value.get("checkpoints_checked", 0)),
            seals_checked=int(value.get("seals_checked", 0)),
            batches_checked=int(value.get("batches_checked", 0)),
            partly_pruned=int(value.get("partly_pruned", 0)),
            anchored_at=int(value.get("anchored_at", 0)),
        )


@dataclass(slots=True)
class Verification:
    chains: list[ChainReport] = field(default_factory=list)
    # Chains that exist and were not checked because the verifier may not read them.
    unreadable: int = 0

    @property
    def intact(self) -> bool:
        return all(report.intact for report in self.chains)

    @property
    def checked(self) -> int:
        return sum(report.checked for report in self.chains)

    @property
    def trusted(self) -> list[ChainReport]:
        """The chains whose earlier entries were trusted from a mark, not checked now."""
        return [r for r in self.chains if r.trusted_through > 0]


@dataclass(frozen=True, slots=True)
class Trust:
    """What a verification trusts: the secret ring (None: the public key alone) and the
    database's key lineage, checked from its root (None: a database from before lineages,
    whose chains only HMAC keys vouch for), or why the lineage cannot be trusted."""

    keys: KeyRing | None
    lineage: KeyLineage | None = None
    broken: str | None = None


def trust_for(log: AuditLog, keys: KeyRing | None, *, root: PublicRoot | None = None) -> Trust:
    """The lineage `log`'s database records, checked from the root public key: `root`'s,
    else the one `keys` holds (a key file's `root` line, or derived from an epoch-0 key)."""
    found = log.identity()
    if found is None:
        return Trust(keys)
    database_id, periods = found
    if root is not None and root.database_id != database_id:
        return Trust(
            keys,
            broken=f"this database's id is {database_id}, the public key file is for "
            f"database {root.database_id}",
        )
    root_key = root.public_key if root is not None else (keys.root_public_key if keys else None)
    try:
        return Trust(keys, KeyLineage.checked(database_id, periods, root_public_key=root_key))
    except LineageBroken as exc:
        return Trust(keys, broken=f"the audit key lineage cannot be trusted: {exc}")


@dataclass(frozen=True, slots=True)
class PublicRoot:
    """What an auditor holds (`vortos audit public-key`): no secret, nothing to sign with."""

    database_id: str
    root_key_id: str
    public_key: str

    def to_json(self) -> dict[str, str]:
        return {
            "database_id": self.database_id,
            "root_key_id": self.root_key_id,
            "root_public_key": self.public_key,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> PublicRoot:
        try:
            root = cls(
                str(value["database_id"]), str(value["root_key_id"]), str(value["root_public_key"])
            )
        except (KeyError, TypeError):
            raise ValueError(
                "not a public key file: `vortos audit public-key -o FILE` writes one"
            ) from None
        if len(root.public_key) != 64 or not all(c in "0123456789abcdef" for c in root.public_key):
            raise ValueError("its root_public_key is not 64 hex digits")
        return root


def judge_mark(
    log: AuditLog, trust: Trust, head: ChainPoint, mark: VerificationMark
) -> ChainProblem | None:
    """What is wrong with a chain's verification mark, given the chain's head: a mark only the
    key can sign, naming an entry that must still be there, unchanged, above a key transition
    that is itself genuine (a thief holding the current key can sign a mark, but not the seal
    of an epoch before it)."""
    if not _mark_signed(trust, mark):
        return ChainProblem(
            mark.seq,
            "the verification mark's signature is not valid (forged, or the wrong key), or it "
            f"is signed with key {mark.key_id}, which is not this database's",
        )
    if mark.seq > head.seq:
        return ChainProblem(
            head.seq + 1,
            f"entries {head.seq + 1}..{mark.seq} were verified before and are gone "
            "(the chain was truncated)",
        )
    if mark.seq == 0:
        return None if mark.hash == GENESIS else ChainProblem(1, "the verification mark is bad")
    if not _still_there(log, mark.chain, mark.point):
        return ChainProblem(mark.seq, "the entry verified last time has changed since (rewritten)")
    return _last_transition_holds(log, trust, mark.chain, mark.seq)


def _mark_checkable(trust: Trust, mark: VerificationMark) -> bool:
    if len(mark.signature) == HMAC_HEX:  # a mark from before epochs: the key's holder only
        return trust.keys is not None and trust.keys.holds(mark.key_id)
    return trust.lineage is not None and mark.key_id in trust.lineage.by_id()


HMAC_HEX = 64  # HMAC-SHA-256 in hex (an Ed25519 signature is 128)


def _mark_signed(trust: Trust, mark: VerificationMark) -> bool:
    message = checkpoint_message(mark.chain, mark.seq, mark.hash)
    if trust.lineage is not None:
        period = trust.lineage.by_id().get(mark.key_id)
        if period is not None and verify_signed(period.public_key, message, mark.signature):
            return True
    # A mark from before lineages: HMAC by a key the verifier holds.
    return trust.keys is not None and bool(trust.keys.valid(message, mark.key_id, mark.signature))


def _last_transition_holds(
    log: AuditLog, trust: Trust, chain: str, upto: int
) -> ChainProblem | None:
    """The chain's newest epoch seal or rotation at or before `upto` is genuine: sealed by the
    key of the epoch it closes, unchanged, and still linked to the entry before it. Entries up
    to a mark are trusted; a mark re-signed over a rewritten chain by a thief with the current
    key would otherwise carry a forgery of a sealed epoch."""
    if trust.lineage is None:
        return None
    transition = log.last_transition(chain, upto)
    if transition is None:
        return None
    try:
        next_epoch = int(transition.data["next_epoch"])
    except (KeyError, TypeError, ValueError):
        return ChainProblem(transition.seq, "an epoch transition names no next epoch (forged)")
    periods = trust.lineage.periods
    closing = periods[next_epoch - 1] if 0 < next_epoch <= len(periods) - 1 else None
    message = entry_message(chain, transition.seq, transition.hash)
    if (
        closing is None
        or transition.key_id != closing.key_id
        or transition.seal is None
        or transition.computed_hash() != transition.hash
        or not verify_signed(closing.public_key, message, transition.seal)
    ):
        return ChainProblem(
            transition.seq,
            "the epoch transition the verification mark stands on is not sealed by the key of "
            "the epoch it closes (the chain was rewritten with a later key)",
        )
    before = log.entries(chain, after_seq=transition.seq - 2, limit=1)
    if transition.seq > 1 and (
        not before
        or before[0].seq != transition.seq - 1
        or before[0].hash != transition.prev_hash
        or before[0].computed_hash() != before[0].hash
    ):
        return ChainProblem(
            transition.seq - 1,
            "the entry before an epoch transition was rewritten (its hash no longer links)",
        )
    return None


def _signed(trust: Trust, mark: VerificationMark) -> bool:
    return trust.keys is not None and _mark_signed(trust, mark)


def _still_there(log: AuditLog, chain: str, point: ChainPoint) -> bool:
    """The entry at `point` is there and is itself: its stored hash is `point`'s, and its
    content still hashes to it (an edit that kept the hash column is an edit)."""
    found = log.entries(chain, after_seq=point.seq - 1, limit=1)
    if not found or found[0].seq != point.seq or found[0].hash != point.hash:
        return False
    return found[0].computed_hash() == point.hash


def _key_after(log: AuditLog, chain: str, seq: int, trust: Trust) -> str | None:
    """The key the chain is signed with just after entry `seq` (a resumed walk's key): the
    next entry's, which the walk then checks; with none, the database's current key."""
    found = log.entries(chain, after_seq=seq, limit=1)
    if found and found[0].event != CHAIN_OPENED:
        return found[0].key_id
    return None if trust.lineage is None else trust.lineage.current.key_id


@dataclass(slots=True)
class _Plan:
    """One chain's verification before it walks: where it starts and what it trusts."""

    report: ChainReport
    mark: VerificationMark | None
    start: ChainPoint = START
    key_id: str | None = None  # the chain's key at `start`

    @property
    def to_check(self) -> int:
        return 0 if self.report.problem is not None else self.report.head.seq - self.start.seq


def _plan(log: AuditLog, trust: Trust, chain: str, mode: VerifyMode) -> _Plan:
    head = log.head(chain)
    mark = log.verified(chain)
    if mark is not None and not _mark_checkable(trust, mark):
        # Signed by a key nobody holds any more and no lineage names (an HMAC mark from
        # before epochs, whose key a seal erased): it cannot vouch for anything, nor be told
        # forged. Walk as if there were none; an intact walk signs a new one.
        mark = None
    plan = _Plan(ChainReport(chain, head, 0, mode=mode), mark)
    if trust.broken is not None:
        plan.report.problem = ChainProblem(1, trust.broken)
        return plan
    anchor = log.anchor(chain)
    if anchor is not None:
        # Archived entries were pruned: the chain is verified from the signed anchor on (the
        # archive itself with `verify --with-archive`).
        problem = _judge_anchor(anchor, head, trust)
        if problem is not None:
            plan.report.problem = problem
            return plan
        plan.start = ChainPoint(anchor.seq, anchor.hash)
        plan.report.anchored_at = anchor.seq
        plan.key_id = _key_after(log, chain, anchor.seq, trust)
    if (
        mode is VerifyMode.INCREMENTAL
        and mark is not None
        and trust.keys is not None
        and mark.seq >= plan.start.seq
    ):
        # Resume only from a mark that holds; a bad one is a finding, never a silent restart.
        plan.report.problem = judge_mark(log, trust, head, mark)
        if plan.report.problem is None and mark.seq > 0:
            plan.start = mark.point
            plan.report.resumed_from = mark.seq
            plan.report.mark_at = mark.at
            plan.key_id = _key_after(log, chain, mark.seq, trust)
    return plan


def _judge_anchor(anchor: Anchor, head: ChainPoint, trust: Trust) -> ChainProblem | None:
    public = None
    if trust.lineage is not None:
        period = trust.lineage.by_id().get(anchor.key_id)
        public = None if period is None else period.public_key
    if public is None or not verify_signed(
        public,
        anchor_message(anchor.chain, anchor.seq, anchor.hash, anchor.archive),
        anchor.signature,
    ):
        return ChainProblem(
            anchor.seq, "the archive anchor's signature is not valid (forged or edited)"
        )
    if anchor.seq > head.seq:
        return ChainProblem(head.seq + 1, "the chain ends before its archive anchor (truncated)")
    return None


def _never() -> bool:
    return False


class _Counter:
    """Entries checked across the chains of one verification, told to `progress`."""

    def __init__(
        self, total: int, progress: Progress | None, cancelled: Callable[[], bool]
    ) -> None:
        self.done = 0
        self.total = total
        self._progress = progress
        self._cancelled = cancelled

    def add(self, entries: int) -> None:
        self.done += entries
        if self._progress is not None:
            self._progress(self.done, self.total)
        if self._cancelled():
            raise VerificationCancelled(
                f"verification cancelled after {self.done} of {self.total} entries"
            )


def _walk_plan(
    log: AuditLog,
    trust: Trust,
    plan: _Plan,
    expect: ChainPoint | None,
    counter: _Counter,
    page: int,
) -> ChainReport:
    report = plan.report
    if report.problem is not None:
        return report
    walk = ChainWalk(report.chain, trust.keys, lineage=trust.lineage)
    walk.start_at(plan.start, plan.key_id)
    ledger = LedgerCheck(log.fired_runs)
    checkpoints = {cp.seq: cp for cp in log.checkpoints(report.chain, after_seq=plan.start.seq)}
    after = plan.start.seq
    while walk.problem is None:
        entries = log.entries(report.chain, after_seq=after, limit=page)
        if not entries:
            break
        report.checkpoints_checked += _walk(walk, entries, checkpoints, ledger)
        counter.add(len(entries))
        after = entries[-1].seq
    report.checked = walk.checked
    report.seals_checked = walk.seals_checked
    report.problem = walk.problem
    if walk.problem is not None:
        report.verified_to = walk.at
    else:
        report.problem = _problem_after_walk(log, trust, plan, expect, walk, checkpoints, ledger)
    if (
        report.problem is not None
        and report.verified_to is None
        and not report.problem.unverifiable
    ):
        # Found after the walk (runs missing, a truncated tail): the last entry before the
        # problem is as far as this verification vouches for.
        report.verified_to = _point_before(log, report.chain, report.problem.seq)
    report.batches_checked = ledger.batches
    report.partly_pruned = ledger.partly_pruned
    return report


def _problem_after_walk(
    log: AuditLog,
    trust: Trust,
    plan: _Plan,
    expect: ChainPoint | None,
    walk: ChainWalk,
    checkpoints: Mapping[int, Checkpoint],
    ledger: LedgerCheck,
) -> ChainProblem | None:
    """What the plan's walk, done without a problem, still leaves to prove, in order: the
    chain reaches its head, its ledger and checkpoints close, the verification mark, the
    expected head and (a full walk of a tenant's chain) every fired run recorded."""
    report = plan.report
    chain, head = report.chain, report.head
    if walk.at != head:
        return ChainProblem(walk.at.seq + 1, "the chain ends before its head")
    problem = walk.finish() or ledger.finish()
    if problem is None:
        problem = _beyond_head(walk, [cp for cp in checkpoints.values() if cp.seq > head.seq])
    # A truncated tail first: its runs left behind would otherwise read as runs added.
    if (
        problem is None
        and plan.mark is not None
        and report.mode is VerifyMode.FULL
        and trust.keys is not None
    ):
        problem = judge_mark(log, trust, head, plan.mark)
    if problem is None and expect is not None:
        problem = _against_expected(log, chain, head, expect)
    if (
        problem is None
        and report.mode is VerifyMode.FULL
        and plan.start.seq == 0
        and chain_tenant(chain) is not None
    ):
        problem = _unrecorded_runs(log, chain, ledger)
    return problem


def _point_before(log: AuditLog, chain: str, seq: int) -> ChainPoint:
    if seq <= 1:
        return START
    found = log.entries(chain, after_seq=seq - 2, limit=1)
    return ChainPoint(found[0].seq, found[0].hash) if found else START


def _missing_chains(log: AuditLog, present: set[str]) -> list[_Plan]:
    """A tenant with schedules or runs and no audit chain: every change and fire of it was
    recorded in its chain, so the chain was deleted whole."""
    missing = []
    for tenant in log.tenants_with_history():
        chain = tenant_chain(tenant)
        if chain in present:
            continue
        report = ChainReport(chain, START, 0, mode=VerifyMode.FULL)
        report.problem = ChainProblem(
            1,
            f"tenant {tenant!r} has schedules or runs in the database but no audit chain: "
            "its whole chain was deleted",
        )
        missing.append(_Plan(report, None))
    return missing


def _unrecorded_runs(log: AuditLog, chain: str, ledger: LedgerCheck) -> ChainProblem | None:
    """A dispatched run no batch entry of the chain committed to: added to the ledger."""
    tenant = chain_tenant(chain)
    assert tenant is not None
    after = 0
    while True:
        ids = log.scheduled_run_ids(tenant, after, PAGE)
        if not ids:
            return None
        for run_id in ids:
            if not ledger.covers(run_id):
                return ChainProblem(
                    log.head(chain).seq + 1,
                    f"run {run_id} of tenant {tenant!r} is in the ledger, but no dispatch "
                    "entry of this chain records it (a run row was added)",
                )
        after = ids[-1]


def _walk(
    walk: ChainWalk,
    entries: Iterable[AuditEntry],
    checkpoints: Mapping[int, Checkpoint],
    ledger: LedgerCheck,
) -> int:
    """Feed `entries` to the walk, comparing each with the checkpoint signed at its sequence
    and each batch with the ledger; how many checkpoints were compared."""
    compared = 0
    for entry in entries:
        before = walk.at
        if not walk.feed(entry):
            break
        problem = ledger.feed(entry)
        if problem is not None:
            # The entry itself is not vouched for: the walk ends before it (a mark moved back
            # there must not trust it).
            walk.problem = problem
            walk.at = before
            break
        checkpoint = checkpoints.get(entry.seq)
        if checkpoint is None:
            if entry.seq % CHECKPOINT_EVERY == 0:
                # Every append that completes a thousand signs one: none here is a deletion.
                walk.problem = ChainProblem(
                    entry.seq, "the checkpoint signed at this sequence is missing (deleted)"
                )
                break
            continue
        compared += 1
        if checkpoint.hash != entry.hash:
            walk.problem = ChainProblem(
                entry.seq, "the entry differs from the checkpoint signed at this sequence"
            )
            break
        if not walk.check_point(checkpoint):
            break
    return compared


def _beyond_head(walk: ChainWalk, checkpoints: Iterable[Checkpoint]) -> ChainProblem | None:
    """A checkpoint past the head: signed, the entries it sealed are gone; else it is forged."""
    for checkpoint in sorted(checkpoints, key=lambda cp: cp.seq):
        public = walk.public_key(checkpoint.key_id)
        message = checkpoint_message(checkpoint.chain, checkpoint.seq, checkpoint.hash)
        genuine = (public is not None and verify_signed(public, message, checkpoint.signature)) or (
            walk.keys is not None
            and walk.keys.valid(message, checkpoint.key_id, checkpoint.signature)
        )
        if not genuine:
            return ChainProblem(checkpoint.seq, "the checkpoint's signature is not valid (forged)")
        return ChainProblem(
            walk.at.seq + 1,
            f"a checkpoint was signed at entry {checkpoint.seq} and the chain now ends at "
            f"{walk.at.seq} (truncated)",
        )
    return None


def _against_expected(
    log: AuditLog, chain: str, head: ChainPoint, expect: ChainPoint
) -> ChainProblem | None:
    if expect.seq > head.seq:
        return ChainProblem(
            head.seq + 1,
            f"the head recorded earlier is {expect.seq}, the chain now ends at {head.seq} "
            "(truncated)",
        )
    if expect.seq == 0:
        return None
    if not _still_there(log, chain, expect):
        return ChainProblem(expect.seq, "the entry at the head recorded earlier has changed")
    return None


def verify(
    log: AuditLog,
    keys: KeyRing | None,
    *,
    chains: Iterable[str] | None = None,
    full: bool = False,
    expect: Mapping[str, ChainPoint] | None = None,
    record: bool = True,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
    page: int = PAGE,
    root: PublicRoot | None = None,
) -> Verification:
    """Verify chains (all by default); with `record`, remember how far each intact one was
    verified, so the next run resumes there. `progress` hears the entries checked so far and
    the total after each page; when `cancelled()` turns true it stops (VerificationCancelled).
    Without `keys` (an auditor's, with `root`), every chain is walked in full and only what
    Ed25519 signatures cover is vouched for."""
    wanted = list(chains) if chains is not None else log.chains()
    mode = VerifyMode.FULL if full or keys is None else VerifyMode.INCREMENTAL
    record = record and keys is not None
    trust = trust_for(log, keys, root=root)
    plans = [_plan(log, trust, chain, mode) for chain in wanted]
    if chains is None and mode is VerifyMode.FULL:
        plans += _missing_chains(log, set(wanted))
    counter = _Counter(sum(p.to_check for p in plans), progress, cancelled or _never)
    if progress is not None:
        progress(0, counter.total)
    result = Verification()
    for plan in plans:
        chain = plan.report.chain
        report = _walk_plan(
            log, trust, plan, None if expect is None else expect.get(chain), counter, page
        )
        result.chains.append(report)
        if record and report.intact and report.head.seq > 0:
            log.mark_verified(chain, report.head)
        elif (
            record
            and report.verified_to is not None
            and plan.mark is not None
            and report.verified_to.seq < plan.mark.seq
            # A chain now shorter than its mark keeps the mark: it is the evidence of the cut.
            and report.head.seq >= plan.mark.seq
            and _signed(trust, plan.mark)
        ):
            # A break found below a genuine mark: the mark no longer vouches for the entries
            # it covered. Move it back to the last entry verified now, so that an incremental
            # verify after this one finds the break again instead of trusting it. (A forged
            # mark stays, and stays reported.)
            log.mark_verified(chain, report.verified_to)
    return result


def what_was_checked(result: Verification, check_all: str) -> list[str]:
    """What an intact verification checked, exactly, in sentences: how many entries and
    checkpoints now, which entries were trusted from a signed mark instead (and since when),
    how many chains were not looked at. `check_all` says how to check the trusted ones too."""
    modes = {r.mode for r in result.chains}
    checkpoints = sum(r.checkpoints_checked for r in result.chains)
    seals = sum(r.seals_checked for r in result.chains)
    said = [
        f"{result.checked} entr{'y' if result.checked == 1 else 'ies'} checked now in "
        f"{len(result.chains)} chain(s), with {checkpoints} signed checkpoint(s) and {seals} "
        "public-key signature(s): no tampering found in them"
    ]
    batches = sum(r.batches_checked for r in result.chains)
    pruned = sum(r.partly_pruned for r in result.chains)
    if batches or pruned:
        said.append(
            f"{batches} dispatch batch(es) matched their run rows in the ledger"
            + (
                f"; {pruned} batch(es) whose runs retention pruned were not matched"
                if pruned
                else ""
            )
        )
    anchored = [r for r in result.chains if r.anchored_at]
    if anchored:
        said.append(
            "archived, verified from the signed anchor on: "
            + "; ".join(f"{r.chain} entries 1..{r.anchored_at}" for r in anchored)
            + " (`verify --with-archive DIR` checks the archive too)"
        )
    if VerifyMode.EXPORT in modes:
        said.append("the export was checked from each chain's start (it holds no checkpoints)")
    elif VerifyMode.FULL in modes:
        said.append(
            "every chain was checked from its start, with its checkpoints and its signed "
            "verification mark"
        )
    trusted = result.trusted
    if trusted:
        said.append(
            "not checked now, trusted from the signed mark of an earlier verification: "
            + "; ".join(
                f"{r.chain} entries 1..{r.trusted_through}"
                + ("" if r.mark_at is None else f" (mark of {iso_utc(r.mark_at)})")
                for r in trusted
            )
            + f": {check_all}"
        )
    if result.unreadable:
        said.append(f"{result.unreadable} other chain(s) not checked: you may not read them")
    return said


# -- export and offline verification ---------------------------------------------------------

EXPORT_FORMAT = 2


def head_message(database_id: str, chain: str, seq: int, digest: str) -> str:
    return f"head:{database_id}:{chain}:{seq}:{digest}"


@dataclass(frozen=True, slots=True)
class SignedHead:
    """An export's last line for a chain: its head, signed with Ed25519 when exported, so
    that the public key alone vouches for every entry up to it."""

    chain: str
    seq: int
    hash: str
    key_id: str
    signature: str

    def to_json(self) -> dict[str, Any]:
        return {
            "head": {
                "chain": self.chain,
                "seq": self.seq,
                "hash": self.hash,
                "key_id": self.key_id,
                "signature": self.signature,
            }
        }


def anchor_json(anchor: Anchor) -> dict[str, Any]:
    return {
        "chain": anchor.chain,
        "seq": anchor.seq,
        "hash": anchor.hash,
        "key_id": anchor.key_id,
        "at": anchor.at,
        "signature": anchor.signature,
        "archive": anchor.archive,
    }


def roster_message(database_id: str, heads: Mapping[str, str]) -> str:
    listed = ",".join(f"{chain}={point}" for chain, point in sorted(heads.items()))
    return f"roster:{database_id}:{listed}"


@dataclass(frozen=True, slots=True)
class Roster:
    """An export's last line: every chain it holds and its head, signed."""

    heads: Mapping[str, str]  # chain -> SEQ:HASH
    key_id: str
    signature: str

    def to_json(self) -> dict[str, Any]:
        return {
            "roster": {
                "heads": dict(sorted(self.heads.items())),
                "key_id": self.key_id,
                "signature": self.signature,
            }
        }


@dataclass(frozen=True, slots=True)
class ExportHeader:
    """An export's first line: the database's id and key lineage (public halves only)."""

    database_id: str
    periods: tuple[KeyPeriod, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "vortos_audit_export": EXPORT_FORMAT,
            "database_id": self.database_id,
            "lineage": [period_json(p) for p in self.periods],
        }


def period_json(period: KeyPeriod) -> dict[str, Any]:
    return {
        "epoch": period.epoch,
        "key_id": period.key_id,
        "public_key": period.public_key,
        "kind": period.kind.value,
        "started_at": period.started_at,
        "endorsement": period.endorsement,
    }


def period_from_json(value: Mapping[str, Any]) -> KeyPeriod:
    return KeyPeriod(
        int(value["epoch"]),
        str(value["key_id"]),
        str(value["public_key"]),
        KeyKind(str(value["kind"])),
        int(value["started_at"]),
        str(value["endorsement"]),
    )


def export(
    log: AuditLog,
    out: TextIO,
    *,
    chains: Iterable[str] | None = None,
    keys: KeyRing | None = None,
) -> int:
    """Write the database's lineage, then every entry as one JSON line, chain by chain in
    sequence order, each chain closed by its head signed with `keys` (none without: the
    public key then vouches only for what seals and checkpoints cover); how many entries."""
    identity = log.identity()
    if identity is not None:
        header = ExportHeader(identity[0], tuple(identity[1]))
        out.write(_line(header.to_json()))
    count = 0
    heads: dict[str, str] = {}
    for chain in list(chains) if chains is not None else log.chains():
        after = 0
        last: AuditEntry | None = None
        anchor = log.anchor(chain)
        if anchor is not None:
            # The entries up to it were archived: the export's walk starts from this signed
            # point (the archive itself is `verify --with-archive`'s).
            out.write(_line({"anchor": anchor_json(anchor)}))
            after = anchor.seq
        while True:
            page = log.entries(chain, after_seq=after, limit=PAGE)
            if not page:
                break
            for entry in page:
                out.write(_line(entry.to_json()))
            count += len(page)
            after = page[-1].seq
            last = page[-1]
        if last is not None and keys is not None and identity is not None:
            message = head_message(identity[0], chain, last.seq, last.hash)
            head = SignedHead(chain, last.seq, last.hash, keys.active_id, keys.seal(message))
            out.write(_line(head.to_json()))
            heads[chain] = ChainPoint(last.seq, last.hash).spelled()
    if keys is not None and identity is not None:
        # The signed list of every chain exported, and its head: a chain left out or cut
        # short of its head is told from it, with the public key alone.
        roster = Roster(heads, keys.active_id, keys.seal(roster_message(identity[0], heads)))
        out.write(_line(roster.to_json()))
    return count


def _line(value: Mapping[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False) + "\n"


ExportItem = AuditEntry | SignedHead | ExportHeader | Roster | Anchor


def read_export(lines: Iterable[str]) -> Iterator[ExportItem]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
            if "vortos_audit_export" in value:
                yield ExportHeader(
                    str(value["database_id"]),
                    tuple(period_from_json(p) for p in value["lineage"]),
                )
            elif "anchor" in value:
                a = value["anchor"]
                yield Anchor(
                    str(a["chain"]),
                    int(a["seq"]),
                    str(a["hash"]),
                    str(a["key_id"]),
                    int(a["at"]),
                    str(a["signature"]),
                    str(a["archive"]),
                )
            elif "roster" in value:
                roster = value["roster"]
                yield Roster(
                    {str(k): str(v) for k, v in dict(roster["heads"]).items()},
                    str(roster["key_id"]),
                    str(roster["signature"]),
                )
            elif "head" in value:
                head = value["head"]
                yield SignedHead(
                    str(head["chain"]),
                    int(head["seq"]),
                    str(head["hash"]),
                    str(head["key_id"]),
                    str(head["signature"]),
                )
            else:
                yield AuditEntry.from_json(value)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"line {number} is not an audit entry ({exc})") from None


def verify_export(
    items: Iterable[ExportItem],
    keys: KeyRing | None,
    *,
    expect: Mapping[str, ChainPoint] | None = None,
    root: PublicRoot | None = None,
) -> Verification:
    """Walk an export offline, each chain from its start, against the lineage it carries
    (checked from the root public key: `root`'s, or the one `keys` holds). With `expect`,
    each chain named must be in the export, reach at least that sequence, and hold that entry
    unchanged (an export cut short, or rewritten from there, since the head was noted)."""
    expect = expect or {}
    walks: dict[str, ChainWalk] = {}
    seen: dict[str, str] = {}  # chain -> the hash the export holds at the expected sequence
    lineage: KeyLineage | None = None
    broken: str | None = None
    database_id = ""
    header = False
    roster: Roster | None = None
    anchors: dict[str, Anchor] = {}
    for item in items:
        if isinstance(item, Roster):
            roster = item
            continue
        if isinstance(item, Anchor):
            anchors[item.chain] = item
            continue
        if isinstance(item, ExportHeader):
            header = True
            database_id = item.database_id
            lineage, broken = _export_lineage(item, keys, root)
            continue
        if isinstance(item, SignedHead):
            walk = walks.get(item.chain)
            if walk is not None:
                walk.cover(
                    item.seq,
                    item.hash,
                    item.key_id,
                    item.signature,
                    head_message(database_id, item.chain, item.seq, item.hash),
                )
            continue
        walk = walks.get(item.chain) or _export_walk(
            item, keys, lineage, anchors.get(item.chain), walks
        )
        if walk.feed(item):
            wanted = expect.get(item.chain)
            if wanted is not None and wanted.seq == item.seq:
                seen[item.chain] = item.hash
    if root is not None and lineage is None and broken is None:
        broken = "the export carries no key lineage: the public key cannot vouch for it"
    listed: dict[str, str] = {}
    unlisted = False
    if header and broken is None:
        listed, broken_roster = _judge_roster(roster, lineage, database_id)
        if broken_roster is not None:
            broken = broken_roster
            unlisted = roster is None  # nothing to judge by, not a forgery
    return _export_result(walks, keys, expect, seen, listed if header else None, broken, unlisted)


def _export_result(
    walks: Mapping[str, ChainWalk],
    keys: KeyRing | None,
    expect: Mapping[str, ChainPoint],
    seen: Mapping[str, str],
    listed: Mapping[str, str] | None,
    broken: str | None,
    unlisted: bool,
) -> Verification:
    """One report per chain walked, expected or listed in the export's signed roster."""
    result = Verification()
    for chain in sorted(walks.keys() | expect.keys() | (listed or {}).keys()):
        walk = walks.get(chain) or ChainWalk(chain, keys)
        problem = (
            ChainProblem(1, broken, unverifiable=unlisted) if broken is not None else walk.finish()
        )
        if problem is None and listed is not None:
            problem = _against_roster(chain, walk.at, listed)
        report = ChainReport(chain, walk.at, 0, walk.checked, problem, mode=VerifyMode.EXPORT)
        report.seals_checked = walk.seals_checked
        wanted = expect.get(chain)
        if report.problem is None and wanted is not None:
            report.problem = _export_against_expected(walk.at, wanted, seen.get(chain))
        result.chains.append(report)
    return result


def _export_walk(
    first: AuditEntry,
    keys: KeyRing | None,
    lineage: KeyLineage | None,
    anchor: Anchor | None,
    walks: dict[str, ChainWalk],
) -> ChainWalk:
    """The walk of `first`'s chain: from its start, or from its archive anchor (signed by a
    key of the lineage), the chain signed there with the first entry's key."""
    walk = ChainWalk(first.chain, keys, lineage=lineage)
    walks[first.chain] = walk
    if anchor is None:
        return walk
    period = None if lineage is None else lineage.by_id().get(anchor.key_id)
    message = anchor_message(anchor.chain, anchor.seq, anchor.hash, anchor.archive)
    if period is None or not verify_signed(period.public_key, message, anchor.signature):
        walk.problem = ChainProblem(
            anchor.seq, "the export's archive anchor is not validly signed (edited or forged)"
        )
        return walk
    key = None if first.event == CHAIN_OPENED else first.key_id
    walk.start_at(ChainPoint(anchor.seq, anchor.hash), key)
    return walk


def _judge_roster(
    roster: Roster | None, lineage: KeyLineage | None, database_id: str
) -> tuple[dict[str, str], str | None]:
    """The chains and heads the export's signed roster lists, or why it cannot be trusted."""
    if roster is None:
        return {}, (
            "the export ends without its signed list of chains (cut short, or exported "
            "without the audit key): a chain or entries left out could not be told"
        )
    period = None if lineage is None else lineage.by_id().get(roster.key_id)
    message = roster_message(database_id, roster.heads)
    if period is None or not verify_signed(period.public_key, message, roster.signature):
        return {}, "the export's list of chains is not validly signed (edited or forged)"
    return dict(roster.heads), None


def _against_roster(chain: str, end: ChainPoint, listed: Mapping[str, str]) -> ChainProblem | None:
    point = listed.get(chain)
    if point is None:
        return ChainProblem(1, "this chain is not in the export's signed list of chains (added)")
    if point != end.spelled():
        return ChainProblem(
            end.seq + 1,
            f"the export's signed list says this chain ends at {point.split(':')[0]}, the "
            f"export holds it to {end.seq} (cut short or rewritten)",
        )
    return None


def _export_lineage(
    header: ExportHeader, keys: KeyRing | None, root: PublicRoot | None
) -> tuple[KeyLineage | None, str | None]:
    if root is not None and root.database_id != header.database_id:
        return None, (
            f"the export is of database {header.database_id}, the public key file is for "
            f"database {root.database_id}"
        )
    root_key = root.public_key if root is not None else (keys.root_public_key if keys else None)
    try:
        return KeyLineage.checked(
            header.database_id, header.periods, root_public_key=root_key
        ), None
    except LineageBroken as exc:
        return None, f"the export's key lineage cannot be trusted: {exc}"


def _export_against_expected(
    end: ChainPoint, expect: ChainPoint, found: str | None
) -> ChainProblem | None:
    if expect.seq > end.seq:
        return ChainProblem(
            end.seq + 1,
            f"the head recorded earlier is {expect.seq}, the export ends at {end.seq} (truncated)",
        )
    if expect.seq > 0 and found != expect.hash:
        return ChainProblem(expect.seq, "the entry at the head recorded earlier has changed")
    return None
