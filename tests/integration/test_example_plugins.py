"""The example plug-in package (examples/plugins): its lease driver and audit sink pass the
shipped conformance suites, are found by name through their installed entry points, and the
file lease excludes real processes from one another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path

import pytest
from vortos_example_plugins import DamagedCopy, FileLockLease, JsonlAuditSink, read_copy

from engine.api import open_engine
from engine.domain.audit import SYSTEM_CHAIN, AuditEntry, tenant_chain
from engine.domain.clock import ManualClock, SystemClock
from engine.domain.errors import LeaseNotOwned
from engine.domain.run import RunKind, RunState
from engine.plugins.registry import PORT_BY_SETTING, PluginContext, PluginError, find
from engine.ports.audit_sink import AuditSink
from engine.ports.lease import LEADER_LEASE, Lease, LeasePort
from engine.ports.runs import RunQuery
from engine.testing.conformance.audit_sink import AuditSinkConformance, audit_chain
from engine.testing.conformance.lease import LeaseConformance
from tests.conftest import T0, run_cli
from tests.integration.processes import Daemon, wait_for

ROOT = Path(__file__).resolve().parents[2]
KEY = "scheduler:leader"
DISTRIBUTION = "vortos-example-plugins"

# --- the shipped suites ------------------------------------------------------------------


class TestFileLockLease(LeaseConformance):
    @contextmanager
    def open_leases(self, clock: ManualClock) -> Iterator[LeasePort]:
        with (
            tempfile.TemporaryDirectory(prefix="vortos-filelock-") as directory,
            closing(FileLockLease(Path(directory) / "leases", clock)) as leases,
        ):
            yield leases

    def open_contender(
        self, leases: LeasePort, clock: ManualClock
    ) -> AbstractContextManager[LeasePort]:
        # Another node on the host: a driver of its own over the same directory.
        assert isinstance(leases, FileLockLease)
        return closing(FileLockLease(leases.directory, clock))


class TestJsonlAuditSink(AuditSinkConformance):
    def open_sink(self, directory: Path) -> AbstractContextManager[AuditSink]:
        return closing(JsonlAuditSink(directory / "audit.jsonl"))

    def stored(self, directory: Path) -> list[AuditEntry]:
        return read_copy(directory / "audit.jsonl")


# --- found by name -----------------------------------------------------------------------


def context(setting: str, name: str, db: Path | str, **options: str) -> PluginContext:
    return PluginContext(
        setting=setting,
        name=name,
        clock=ManualClock(T0),
        db=db,
        node_id="node-a",
        options=options,
    )


def test_filelock_is_found_by_name_through_its_entry_point(tmp_path: Path) -> None:
    plugin = find(PORT_BY_SETTING["lease_driver"], "filelock")

    assert plugin.source.startswith(f"entry point of {DISTRIBUTION}")
    leases = plugin.build(context("lease_driver", "filelock", tmp_path / "vortos.db"))

    assert isinstance(leases, FileLockLease)
    held = leases.acquire(KEY, "token-a", "node-a", 10_000)
    assert held is not None
    assert leases.acquire(KEY, "token-b", "node-b", 10_000) is None
    assert leases.current(KEY) == held


def test_filelock_keeps_its_leases_beside_the_database_file(tmp_path: Path) -> None:
    leases = find(PORT_BY_SETTING["lease_driver"], "filelock").build(
        context("lease_driver", "filelock", tmp_path / "vortos.db")
    )

    assert isinstance(leases, FileLockLease)
    assert leases.directory == tmp_path / "vortos.db.leases"


def test_filelock_directory_option_chooses_the_directory(tmp_path: Path) -> None:
    leases = find(PORT_BY_SETTING["lease_driver"], "filelock").build(
        context("lease_driver", "filelock", tmp_path / "vortos.db", directory=str(tmp_path / "l"))
    )

    assert isinstance(leases, FileLockLease)
    assert leases.directory == tmp_path / "l"
    assert leases.directory.is_dir()


def test_filelock_on_postgresql_without_a_directory_says_which_option_to_set() -> None:
    plugin = find(PORT_BY_SETTING["lease_driver"], "filelock")

    with pytest.raises(PluginError, match=r"\[plugin\.filelock\] directory"):
        plugin.build(context("lease_driver", "filelock", "postgresql://vortos@db/vortos"))


def test_filelock_refuses_an_unknown_option(tmp_path: Path) -> None:
    plugin = find(PORT_BY_SETTING["lease_driver"], "filelock")

    with pytest.raises(PluginError, match=r"unknown option.*directroy"):
        plugin.build(context("lease_driver", "filelock", tmp_path / "v.db", directroy="/x"))


def test_jsonl_is_found_by_name_through_its_entry_point(tmp_path: Path) -> None:
    plugin = find(PORT_BY_SETTING["audit_sinks"], "jsonl")
    entries = audit_chain(SYSTEM_CHAIN, 3)

    assert plugin.source.startswith(f"entry point of {DISTRIBUTION}")
    sink = plugin.build(context("audit_sinks", "jsonl", tmp_path / "vortos.db"))
    assert isinstance(sink, JsonlAuditSink)
    try:
        sink.deliver(entries)
    finally:
        sink.close()

    assert read_copy(tmp_path / "audit.jsonl") == entries


def test_jsonl_path_option_chooses_the_file(tmp_path: Path) -> None:
    sink = find(PORT_BY_SETTING["audit_sinks"], "jsonl").build(
        context("audit_sinks", "jsonl", tmp_path / "vortos.db", path=str(tmp_path / "a/b.jsonl"))
    )
    assert isinstance(sink, JsonlAuditSink)
    sink.close()

    assert sink.path == tmp_path / "a" / "b.jsonl"


def test_jsonl_on_postgresql_without_a_path_says_which_option_to_set() -> None:
    plugin = find(PORT_BY_SETTING["audit_sinks"], "jsonl")

    with pytest.raises(PluginError, match=r"\[plugin\.jsonl\] path"):
        plugin.build(context("audit_sinks", "jsonl", "postgresql://vortos@db/vortos"))


# --- the JSON-lines file after a crash ---------------------------------------------------


def test_jsonl_cuts_off_a_torn_last_line_and_appends_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    entries = audit_chain(tenant_chain("acme"), 4)
    with closing(JsonlAuditSink(path)) as sink:
        sink.deliver(entries[:2])
    with path.open("ab") as file:  # a crash in the middle of writing entry 3
        file.write(json.dumps(entries[2].to_json()).encode()[:40])

    with closing(JsonlAuditSink(path)) as sink:
        sink.deliver(entries[2:])

    assert read_copy(path) == entries
    assert all(json.loads(line) for line in path.read_bytes().split(b"\n")[:-1])


def test_jsonl_refuses_a_damaged_line_before_the_last(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with closing(JsonlAuditSink(path)) as sink:
        sink.deliver(audit_chain(SYSTEM_CHAIN, 3))
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b"{edited", *lines[2:]]))

    with pytest.raises(DamagedCopy, match="move it aside"):
        JsonlAuditSink(path)


def test_jsonl_sinks_sharing_a_file_store_each_entry_once(tmp_path: Path) -> None:
    # Leadership moved between two processes on the host, each with the file open.
    path = tmp_path / "audit.jsonl"
    entries = audit_chain(SYSTEM_CHAIN, 6)
    with closing(JsonlAuditSink(path)) as former, closing(JsonlAuditSink(path)) as successor:
        former.deliver(entries[:4])
        successor.deliver(entries[2:])

    assert read_copy(path) == entries


# --- real processes contending for one file lease ---------------------------------------

CONTEND_S = 2.0
HOLD_TTL_MS = 60_000  # far longer than a hold: a lease never expires under its holder here


def contend(directory: str, token: str, start_file: str, seconds: str) -> None:
    """Run in a contender process: acquire, hold briefly, release, for `seconds`, and print
    how often it held the lease and how often it found another holder inside its hold.

    While holding it creates a witness file exclusively (O_EXCL): a second holder at the same
    time would find it there."""
    leases = FileLockLease(Path(directory), SystemClock())
    witness = Path(directory).parent / "witness"
    while not Path(start_file).exists():
        time.sleep(0.005)
    deadline = time.monotonic() + float(seconds)
    holds = overlaps = 0
    while time.monotonic() < deadline:
        if leases.acquire(KEY, token, f"process-{token}", HOLD_TTL_MS) is None:
            time.sleep(0.001)
            continue
        holds += 1
        try:
            os.close(os.open(witness, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            overlaps += 1
        else:
            time.sleep(0.002)
            current = leases.current(KEY)
            if current is None or current.token != token:
                overlaps += 1
            witness.unlink(missing_ok=True)
        try:
            leases.release(KEY, token)
        except LeaseNotOwned:  # the other process took the lease while this one held it
            overlaps += 1
        time.sleep(0.001)  # give the other process its chance at the free key
    print(json.dumps({"holds": holds, "overlaps": overlaps}))


def start_contender(directory: Path, token: str, start_file: Path) -> subprocess.Popen[str]:
    code = (
        "import sys\n"
        "from tests.integration.test_example_plugins import contend\n"
        "contend(*sys.argv[1:])\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(directory), token, str(start_file), str(CONTEND_S)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_processes_never_hold_one_filelock_lease_at_once(tmp_path: Path) -> None:
    directory, start_file = tmp_path / "leases", tmp_path / "go"
    contenders = [start_contender(directory, t, start_file) for t in ("token-a", "token-b")]
    time.sleep(0.5)  # both importing: start them together
    start_file.touch()

    reports = []
    for process in contenders:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        reports.append(json.loads(out))

    assert [r["overlaps"] for r in reports] == [0, 0], f"two holders at once: {reports}"
    assert all(r["holds"] > 0 for r in reports), f"one process never held the lease: {reports}"


@pytest.mark.slow
def test_lease_of_a_killed_process_is_free_once_it_expires(tmp_path: Path) -> None:
    directory = tmp_path / "leases"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from engine.domain.clock import SystemClock\n"
        "from vortos_example_plugins import FileLockLease\n"
        "leases = FileLockLease(Path(sys.argv[1]), SystemClock())\n"
        "assert leases.acquire(sys.argv[2], 'token-dead', 'doomed', 3000) is not None\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(directory), KEY], cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"held\n"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    leases = FileLockLease(directory, SystemClock())

    left = leases.current(KEY)
    refused = leases.acquire(KEY, "token-next", "survivor", 3000)
    assert left is not None
    time.sleep(max(0.0, left.expires_at / 1000 - time.time()) + 0.05)
    taken = leases.acquire(KEY, "token-next", "survivor", 3000)

    assert left.token == "token-dead", "the killed holder's lease must stand until it expires"
    assert refused is None, "the killed holder's lease must stand until it expires"
    assert taken is not None, "the killed holder's lease must be free once it expired"


# -- acceptance 1: selected by setting, serving a real `vortos run` ----------------------------


def _leader_row(db: Path) -> Lease | None:
    """The database's lease row, where dispatch fences (a plug-in's lease is mirrored there)."""
    with open_engine(db, create=False, readonly=True) as engine:
        return engine.storage.leases.current(LEADER_LEASE)


def _completed_slots(db: Path) -> list[int]:
    return _slots(db, RunState.COMPLETED)


def _slots(db: Path, state: RunState | None = None) -> list[int]:
    """The slots with a run (in `state`, when given)."""
    with open_engine(db, create=False, readonly=True) as engine:
        runs = engine.storage.runs.query(RunQuery(state=state, limit=100_000))
    return sorted(r.slot_at for r in runs if r.kind is RunKind.SCHEDULED)


def _chains(db: Path) -> dict[str, list[int]]:
    with open_engine(db, create=False, readonly=True) as engine:
        audit = engine.storage.audit
        return {c: [e.seq for e in audit.entries(c)] for c in audit.chains()}


def _copied_up_to(copy: Path, heads: dict[str, int]) -> bool:
    reached: dict[str, int] = {}
    for entry in read_copy(copy):
        reached[entry.chain] = max(reached.get(entry.chain, 0), entry.seq)
    return all(reached.get(chain, 0) >= seq for chain, seq in heads.items())


def test_vortos_run_leads_with_filelock_and_copies_the_audit_trail_to_jsonl(
    tmp_path: Path,
) -> None:
    db = tmp_path / "vortos.db"
    config = tmp_path / "vortos.toml"
    config.write_text('lease_driver = "filelock"\naudit_sinks = ["jsonl"]\n')
    env = {"VORTOS_CONFIG": str(config)}
    added = run_cli("schedule", "add", "tick", "--every", "1s", "--command", "noop", db=db, env=env)
    assert added.code == 0, added.stderr
    copy = tmp_path / "audit.jsonl"
    files = FileLockLease(tmp_path / "vortos.db.leases", SystemClock())

    first = Daemon(db, "node-a", tmp_path, lease_ttl="2s", env=env)
    second: Daemon | None = None
    try:
        wait_for(lambda: len(_completed_slots(db)) >= 3, 20, "node-a to run three slots")
        held = files.current(LEADER_LEASE)
        assert held is not None, "the filelock driver holds the leader lease in its directory"
        assert held.holder == "node-a"
        row = _leader_row(db)
        assert row is not None, "the plug-in's lease is mirrored into the row dispatch fences on"
        assert (row.holder, row.token) == (held.holder, held.token)

        # A standby on the same driver takes over once the killed leader's lease expires.
        second = Daemon(db, "node-b", tmp_path, lease_ttl="2s", env=env)
        first.kill()
        killed_at = len(_completed_slots(db))
        wait_for(
            lambda: (lease := files.current(LEADER_LEASE)) is not None and lease.holder == "node-b",
            20,
            "node-b to take the filelock lease",
        )
        wait_for(lambda: len(_completed_slots(db)) >= killed_at + 3, 20, "node-b to run slots")
        # The copy catches up with every chain's head as it was a moment ago (shipping
        # resumed on node-b from the position node-a stored).
        heads = {chain: seqs[-1] for chain, seqs in _chains(db).items()}
        wait_for(lambda: _copied_up_to(copy, heads), 15, f"the jsonl copy to reach {heads}")
        assert second.terminate() == 0, second.log
    finally:
        for node in (first, second):
            if node is not None and node.process.poll() is None:
                node.kill()

    # Every slot has its one run (a fire the killed node had claimed completes once its claim
    # expires, after the test).
    slots = _slots(db)
    assert len(slots) == len(set(slots)), "no slot ran twice across the failover"
    assert slots == list(range(slots[0], slots[-1] + 1000, 1000)), "no slot was lost"
    stored: dict[str, list[int]] = {}
    for entry in read_copy(copy):
        stored.setdefault(entry.chain, []).append(entry.seq)
    for chain, seqs in stored.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{chain}: copied once each, in order"

    doctor = run_cli("doctor", "--json", db=db, env=env)
    findings = {f["check_id"]: f for f in json.loads(doctor.stdout)["findings"]}
    ports = findings["plugins.ports"]
    assert ports["status"] == "pass", ports
    assert "lease driver: filelock (entry point of vortos-example-plugins" in ports["detail"]
    assert "audit sinks: jsonl (entry point of vortos-example-plugins" in ports["detail"]
