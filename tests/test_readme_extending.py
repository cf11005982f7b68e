"""The README's extending guide runs as written.

Every ```python block of its `## Extending` section names its file on its first line
(`# mypkg/leases.py`, `# tests/test_clock.py`). The modules are written to a temporary
directory and imported, and each plug-in is built the way Vortos builds it (a PluginContext,
or the entry points of the pyproject.toml snippet found through importlib.metadata and the
vortos.toml snippet's settings) and used through its port. The blocks under `tests/` are test
modules: they run under pytest in a process of their own. A renamed API, a broken example or
a snippet naming a setting or group that does not exist fails here.
"""

from __future__ import annotations

import dataclasses
import grp
import importlib
import json
import os
import pwd
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import engine.extend
import engine.testing.conformance
from engine import Clock, CronTrigger, Engine, ManualClock, ScheduleSpec, open_engine
from engine.config import BY_NAME, load_settings
from engine.domain.access import Grant, Identity, Operation, PermissionDenied, Role
from engine.domain.audit import tenant_chain
from engine.domain.run import RunState
from engine.governance.doctor import DoctorContext, Status, run_checks
from engine.governance.policy import RoleBasedPolicy, StoredIdentities
from engine.plugins.registry import (
    PORT_BY_SETTING,
    PORTS,
    PluginContext,
    PluginError,
    find,
    select_plugins,
)
from engine.plugins.runtime import Builder, build_runtime, doctor_checks
from engine.ports.fire_queue import FireQuery
from engine.ports.lease import LEADER_LEASE
from engine.ports.runs import RunQuery
from engine.runtime.isolation import Guard, IsolatedObserver
from tests.conftest import T0, run_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
FILE_LINE = re.compile(r"^# (\S+\.py)$")
DAY_MS = 86_400_000
NODE = "readme-node"

# The example modules the tests below use, each by the file its block names. A block added to
# the guide must be exercised here too (test_every_example_is_exercised).
EXERCISED = {
    "mypkg/leases.py",
    "mypkg/broker.py",
    "mypkg/policy.py",
    "mypkg/identities.py",
    "mypkg/audit.py",
    "mypkg/metrics.py",
    "mypkg/checks.py",
}


@dataclasses.dataclass(frozen=True)
class Block:
    language: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0]

    @property
    def path(self) -> str:
        found = FILE_LINE.match(self.first_line)
        assert found is not None, f"a python example must name its file first: {self.first_line}"
        return found.group(1)


def extending_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.find("\n## Extending\n")
    assert start >= 0, "README.md has no ## Extending section"
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def blocks(language: str | None = None) -> list[Block]:
    found = [Block(m.group(1), m.group(2)) for m in FENCE.finditer(extending_section())]
    return [b for b in found if language is None or b.language == language]


def toml_block(first_line: str) -> Block:
    (block,) = [b for b in blocks("toml") if b.first_line.startswith(first_line)]
    return block


def example_test_blocks() -> list[Block]:
    return [b for b in blocks("python") if b.path.startswith("tests/")]


def entry_points() -> dict[str, dict[str, str]]:
    """The pyproject.toml snippet's entry points: group -> name -> target."""
    project = tomllib.loads(toml_block("# pyproject.toml").text)["project"]
    groups: dict[str, dict[str, str]] = project["entry-points"]
    return groups


@pytest.fixture
def examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every python block written to its file under a directory on sys.path, with the
    pyproject.toml snippet's entry points installed there as a distribution's metadata."""
    src = tmp_path / "src"
    for block in blocks("python"):
        target = src / block.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
    dist = src / "mypkg_examples-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mypkg-examples\nVersion: 0.1.0\n", encoding="utf-8"
    )
    lines = []
    for group, named in entry_points().items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in named.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(src))
    yield src
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name == "mypkg" or (where is not None and Path(where).is_relative_to(src)):
            del sys.modules[name]


def example(name: str) -> ModuleType:
    return importlib.import_module(name)


def context(
    setting: str,
    name: str,
    clock: Clock,
    db: Path,
    options: dict[str, Any] | None = None,
    default: Any = None,
) -> PluginContext:
    return PluginContext(
        setting=setting,
        name=name,
        clock=clock,
        db=db,
        node_id=NODE,
        options=options or {},
        default=default,
    )


def run_one_fire(engine: Engine, **consumer: Any) -> None:
    """Create an every-minute schedule, dispatch its slot due now and let a consumer take it."""
    spec = ScheduleSpec(name="tick", trigger=CronTrigger("* * * * *"), command="noop")
    engine.service.create(spec, actor="readme")
    daemon = engine.daemon(node_id=NODE, lease_ttl_ms=DAY_MS)
    daemon.step()  # leads
    daemon.step()  # dispatches the slot due now, the first of the minute
    taker = engine.consumer(consumer_id=NODE, concurrency=1, **consumer)
    try:
        taker.step()
        taker.drain(30)
    finally:
        taker.close()


# --- the section itself ------------------------------------------------------------------


def test_extending_comes_just_before_settings() -> None:
    text = README.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)

    assert headings.index("Settings") == headings.index("Extending") + 1


def test_every_snippet_says_its_language() -> None:
    languages = {b.language for b in blocks()}

    assert languages <= {"python", "toml", "sh"}, languages


def test_every_python_example_names_a_file_of_its_own() -> None:
    paths = [b.path for b in blocks("python")]

    assert len(paths) == len(set(paths)), paths


def test_every_example_is_exercised() -> None:
    modules = {b.path for b in blocks("python") if not b.path.startswith("tests/")}

    assert modules == EXERCISED


def test_port_table_names_each_port_with_its_setting_and_group() -> None:
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in extending_section().splitlines()
        if line.startswith("| `")
    ]
    groups = {}
    for port, setting, group, suites in rows:
        assert hasattr(engine.extend, port.split("`")[1]), port
        for suite in re.findall(r"`(\w+)`", suites):
            assert suite in engine.testing.conformance.__all__, suite
        if group != "-":
            groups[setting.split("`")[1]] = group.strip("`")

    assert groups == {p.setting: p.group for p in PORTS}


def test_versioning_names_the_public_surface_and_the_current_version() -> None:
    section = extending_section()
    versioning = section[section.index("### Versioning") :]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    stated = re.search(r"Vortos is (\S+) now", versioning)

    for module in ("engine.extend", "engine.testing", "engine.testing.conformance"):
        assert f"`{module}`" in versioning, module
        importlib.import_module(module)
    assert "Semantic Versioning" in versioning
    assert stated is not None
    assert stated.group(1) == project["version"]


# --- registering and selecting -------------------------------------------------------------


def test_entry_points_snippet_registers_a_factory_in_every_port_group(examples: Path) -> None:
    by_group = {p.group: p for p in PORTS}

    assert set(entry_points()) == set(by_group)
    for group, named in entry_points().items():
        for target in named.values():
            assert callable(find(by_group[group], target).factory), target


def test_vortos_toml_snippet_selects_registered_plugins_by_real_settings() -> None:
    table = tomllib.loads(toml_block("# vortos.toml").text)
    options = table.pop("plugin")
    registered = entry_points()
    selected: set[str] = set()

    for setting, value in table.items():
        assert setting in BY_NAME, setting
        port = PORT_BY_SETTING[setting]
        names = value if port.many else [value]
        assert set(names) <= set(registered[port.group]), (setting, names)
        selected |= set(names)
    assert set(options) <= selected


def write_vortos_toml(directory: Path) -> Path:
    """The vortos.toml snippet, its paths moved under `directory` and its Unix group made
    one this host has (the primary group of the account running the tests)."""
    text = toml_block("# vortos.toml").text.replace('"/var/', f'"{directory}/var/')
    text = text.replace("vortos-admins", grp.getgrgid(os.getgid()).gr_name)
    path = directory / "vortos.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_selected_plugins_are_found_through_their_entry_points_and_start(
    examples: Path, tmp_path: Path
) -> None:
    settings = load_settings(config=write_vortos_toml(tmp_path), env={})
    selection = select_plugins(settings)
    clock = ManualClock(T0)

    assert {p.source for p in selection.plugged()} == {"entry point of mypkg-examples 0.1.0"}
    with open_engine(
        tmp_path / "vortos.db", clock=clock, plugins=selection, settings=settings, node_id=NODE
    ) as engine:
        assert type(getattr(engine.leases, "driver", None)).__name__ == "MemoryLease"
        daemon = engine.daemon(node_id=NODE)
        daemon.step()
        mirrored = engine.storage.leases.current(LEADER_LEASE)
        assert daemon.leading
        assert mirrored is not None, "a plug-in lease is mirrored into the fenced row"
        assert mirrored.holder == NODE
        builder = Builder(engine.storage, clock, tmp_path / "vortos.db", NODE, settings)
        runtime = build_runtime(selection, builder)
        # Started (never leading, so nothing is shipped): a runtime closes only once started.
        runtime.start(lambda: False)
        try:
            assert type(runtime.enqueuer).__name__ == "BrokerEnqueuer"
            assert [type(m.plugin).__name__ for m in runtime.metrics] == ["RunCounts"]
            assert runtime.shipper is not None
        finally:
            runtime.close()
        assert [c.check_id for c in doctor_checks(selection, builder)] == ["backup.fresh"]


def test_vortos_plugins_lists_what_the_snippets_register_and_select(
    examples: Path, tmp_path: Path
) -> None:
    config = write_vortos_toml(tmp_path)

    done = run_cli(
        "plugins", "--json", env={"PYTHONPATH": str(examples), "VORTOS_CONFIG": str(config)}
    )

    assert done.code == 0, done.stderr
    rows = {row["setting"]: row for row in json.loads(done.stdout)}
    for setting, value in tomllib.loads(config.read_text(encoding="utf-8")).items():
        if setting == "plugin":
            continue
        names = value if isinstance(value, list) else [value]
        assert [s.split(" ")[0] for s in rows[setting]["selected"]] == names
        assert rows[setting]["problem"] is None


# --- each port, through its example --------------------------------------------------------


def test_memory_lease_excludes_renews_and_releases(examples: Path, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    leases = example("mypkg.leases").memory_lease(
        context("lease_driver", "memory", clock, tmp_path / "vortos.db")
    )

    held = leases.acquire("k", "token-a", "node-a", 10_000)
    refused = leases.acquire("k", "token-b", "node-b", 10_000)
    clock.advance(5)
    renewed = leases.renew("k", "token-a", 10_000)
    leases.release("k", "token-a")

    assert held is not None
    assert refused is None
    assert renewed.expires_at == T0 + 15_000
    assert leases.current("k") is None


def test_broker_enqueuer_hands_each_fire_over_once(examples: Path, tmp_path: Path) -> None:
    broker = example("mypkg.broker")
    clock = ManualClock(T0)
    enqueuer = broker.BrokerEnqueuer(
        context("enqueuer", "broker", clock, tmp_path / "vortos.db", {"queue": "jobs"})
    )
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        run_one_fire(engine, enqueuer=enqueuer)
        (fire,) = engine.storage.fire_queue.read(FireQuery())
        (run,) = engine.service.runs(RunQuery())

        enqueuer.enqueue(fire)  # again, as after a consumer's crash

    assert run.state is RunState.COMPLETED
    assert list(broker.BROKER.messages) == [f"{fire.tenant}/{fire.slot_key}"]
    queue, body = broker.BROKER.messages[f"{fire.tenant}/{fire.slot_key}"]
    assert queue == "jobs"
    assert json.loads(body) == {"command": "noop", "payload": {}}


def test_frozen_tenants_policy_keeps_the_role_rules_and_freezes_a_tenant(
    examples: Path, tmp_path: Path
) -> None:
    policy = example("mypkg.policy").FrozenTenants(
        context(
            "policy",
            "frozen-tenants",
            ManualClock(T0),
            tmp_path / "vortos.db",
            {"frozen": ["acme"]},
            default=RoleBasedPolicy(),
        )
    )
    admin = Identity("alice", (Grant("alice", Role.ADMIN),))
    viewer = Identity("bob", (Grant("bob", Role.VIEWER),))

    assert policy.decide(admin, Operation.VIEW, "acme").allowed
    frozen = policy.decide(admin, Operation.PAUSE, "acme")
    assert not frozen.allowed
    assert "frozen" in frozen.reason
    assert policy.decide(admin, Operation.PAUSE, "globex").allowed
    assert not policy.decide(viewer, Operation.PAUSE, "globex").allowed


def test_frozen_tenants_policy_refuses_changes_through_the_service(
    examples: Path, tmp_path: Path
) -> None:
    (tmp_path / "vortos.toml").write_text(
        'policy = "frozen-tenants"\n[plugin.frozen-tenants]\nfrozen = ["acme"]\n',
        encoding="utf-8",
    )
    settings = load_settings(config=tmp_path / "vortos.toml", env={})
    with open_engine(
        tmp_path / "vortos.db",
        clock=ManualClock(T0),
        plugins=select_plugins(settings),
        settings=settings,
        node_id=NODE,
    ) as engine:
        trigger = CronTrigger("0 * * * *")
        engine.service.create(
            ScheduleSpec(name="ok", trigger=trigger, command="noop", tenant="globex"),
            actor="alice",
        )

        with pytest.raises(PermissionDenied, match="frozen"):
            engine.service.create(
                ScheduleSpec(name="no", trigger=trigger, command="noop", tenant="acme"),
                actor="alice",
            )


def test_unix_group_roles_add_a_role_for_a_mapped_group(examples: Path, tmp_path: Path) -> None:
    account = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    with open_engine(tmp_path / "vortos.db", clock=ManualClock(T0)) as engine:
        engine.storage.operators.grant(Grant(account, Role.VIEWER, "acme"), by="test", at=T0)
        provider = example("mypkg.identities").UnixGroupRoles(
            context(
                "identity_provider",
                "unix-groups",
                engine.clock,
                tmp_path / "vortos.db",
                {group: "approver"},
                default=StoredIdentities(engine.storage),
            )
        )

        mapped = provider.identity(account)
        stranger = provider.identity("no-such-account-here")

    assert set(mapped.grants) == {
        Grant(account, Role.VIEWER, "acme"),
        Grant(account, Role.APPROVER),
    }
    assert stranger.grants == ()


def test_unix_group_roles_with_an_unknown_group_is_refused_at_start(
    examples: Path, tmp_path: Path
) -> None:
    plugin = find(PORT_BY_SETTING["identity_provider"], "mypkg.identities:UnixGroupRoles")
    start = context(
        "identity_provider",
        "unix-groups",
        ManualClock(T0),
        tmp_path / "vortos.db",
        {"no-such-group-here": "admin"},
        default=None,
    )

    with pytest.raises(PluginError, match="failed to start"):
        plugin.build(start)


def test_jsonl_copy_stores_each_entry_once_across_reopening(examples: Path, tmp_path: Path) -> None:
    audit = example("mypkg.audit")
    options = {"path": str(tmp_path / "audit.jsonl")}
    clock = ManualClock(T0)
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        trigger = CronTrigger("0 * * * *")
        for name in ("a", "b", "c"):
            engine.service.create(
                ScheduleSpec(name=name, trigger=trigger, command="noop"), actor="readme"
            )
        entries = engine.storage.audit.entries(tenant_chain("default"))

    def opened() -> Any:
        return audit.JsonLinesCopy.from_context(
            context("audit_sinks", "jsonl-copy", clock, tmp_path / "vortos.db", options)
        )

    sink = opened()
    sink.deliver(entries[:2])
    sink.deliver(entries[:2])  # delivered again: stored once
    sink.close()
    sink = opened()
    sink.deliver(entries)  # overlapping what the file holds
    sink.close()

    assert len(entries) == 4  # the chain's opening and the three creates
    assert audit.read_copy(tmp_path / "audit.jsonl") == entries


def test_run_counts_count_settled_runs_behind_the_isolation(examples: Path, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    counts = example("mypkg.metrics").RunCounts(
        context("metrics", "run-counts", clock, tmp_path / "vortos.db", {"prefix": "jobs"})
    )
    isolated = IsolatedObserver(counts, Guard("metrics", "run-counts", clock, 5_000))
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        run_one_fire(engine, observer=isolated)
    isolated.close(5)

    assert counts.counts == {"jobs.tick.completed": 1}
    assert isolated.guard.failures == 0


def test_backup_fresh_check_finds_a_missing_stale_or_fresh_backup(
    examples: Path, tmp_path: Path
) -> None:
    backup = tmp_path / "backup.db"
    clock = ManualClock(T0)
    check = example("mypkg.checks").BackupFresh(
        context(
            "doctor_checks", "backup-fresh", clock, tmp_path / "vortos.db", {"path": str(backup)}
        )
    )
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        ctx = DoctorContext(storage=engine.storage, clock=clock, db=tmp_path / "vortos.db")

        missing = check.run(ctx)
        backup.write_bytes(b"")
        os.utime(backup, (T0 / 1000 - 2 * 86_400, T0 / 1000 - 2 * 86_400))
        stale = check.run(ctx)
        os.utime(backup, (T0 / 1000 - 3_600, T0 / 1000 - 3_600))
        (fresh,) = run_checks(ctx, [check]).findings

    assert (missing.check_id, missing.status) == ("backup.fresh", Status.FAIL)
    assert stale.status is Status.FAIL
    assert "48 h old" in stale.summary
    assert (fresh.check_id, fresh.status) == ("backup.fresh", Status.PASS)


# --- the examples that are tests -----------------------------------------------------------


@pytest.mark.parametrize("block", example_test_blocks(), ids=lambda b: b.path)
def test_example_test_module_passes_under_pytest(block: Block, examples: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", block.path, "-q", "-p", "no:cacheprovider"],
        cwd=examples,
        env={**os.environ, "PYTHONPATH": str(examples)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", done.stdout), done.stdout[-2000:]
    assert not re.search(r"\b(failed|skipped|error)", done.stdout), done.stdout[-2000:]
