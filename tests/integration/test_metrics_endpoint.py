"""A real `vortos run --metrics-port` after a scripted scenario serves every metric family the
README lists, with the labels it lists; and a metrics port in use stops `vortos run` and
`vortos consume` before they open the database."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import (
    CommandRegistry,
    IntervalTrigger,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    RetryPolicy,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.domain.timeutil import MINUTE_MS, SECOND_MS
from tests.conftest import cli_env, run_cli
from tests.integration.processes import wait_for

README = Path(__file__).resolve().parents[2] / "README.md"

# Fed by parts that `vortos run` does not exercise in this scenario: the retention sweeper prunes
# nothing on a new database, and the dead-man detector's verdicts are its owner's to report.
# Their families must still be served; their labels are checked when they have samples.
# Families with no sample unless something happens that this scenario does not do (a plug-in
# failing: see test_plugin_isolation.py).
NOT_IN_THIS_SCENARIO = {
    "vortos_runs_pruned_total",
    "vortos_deadman_verdict",
    "vortos_plugin_failures_total",
    # No command here passes a time limit or loses its consumer: their own tests sample them
    # (test_time_limits.py, test_metrics.py).
    "vortos_runs_timed_out_total",
    "vortos_consumer_deaths_total",
}

APP = '''
"""Commands for the metrics scenario: one completes, one fails once, one always fails."""

from engine import FireContext, schedulable


@schedulable("ok")
def ok() -> str:
    return "ok"


@schedulable("flaky")
def flaky(*, fire: FireContext) -> str:
    if fire.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return "ok on a retry"


@schedulable("doomed")
def doomed() -> None:
    raise RuntimeError("always fails")
'''


def documented_families() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, labels), from the README's table."""
    section = README.read_text().split("## Metrics and tracing", 1)[1].split("\n## ", 1)[0]
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for line in section.splitlines():
        row = re.match(r"\|\s*`(vortos_\w+)`\s*\|\s*(\w+)\s*\|([^|]*)\|", line)
        if row:
            labels = frozenset(re.findall(r"`(\w+)`", row.group(3)))
            found[row.group(1)] = (row.group(2), labels)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return ""


Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> dict[str, tuple[str, list[Sample]]]:
    """Family name as documented (counters with _total) -> (type, its samples)."""
    families: dict[str, tuple[str, list[Sample]]] = {}
    for family in text_string_to_metric_families(text):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        families[name] = (
            family.type,
            [
                (s.name, dict(s.labels), s.value)
                for s in family.samples
                if not s.name.endswith("_created")
            ],
        )
    return families


def total(text: str, sample: str, **labels: str) -> float:
    for _, family in samples(text).values():
        for name, have, value in family:
            if name == sample and all(have.get(k) == v for k, v in labels.items()):
                return value
    return 0.0


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "metrics_app.py").write_text(textwrap.dedent(APP))
    return folder


def scenario(db: Path) -> None:
    """Schedules for each path: completes, retried once, dead-lettered, and one that comes
    back 10 minutes late (its missed slots are misfires)."""
    registry: CommandRegistry = builtin_commands()
    registry.register("ok", lambda: "ok")
    registry.register("flaky", lambda: "ok")
    registry.register("doomed", lambda: None)
    with open_engine(db, commands=registry) as engine:
        now = engine.clock.now_ms() // 1000 * 1000
        past = ManualClock(now - 10 * MINUTE_MS)
        quick = RetryPolicy(max_attempts=3, backoff_ms=100, backoff_cap_ms=1000)
        for name, command, every, retry in (
            ("ok", "ok", 1, quick),
            ("flaky", "flaky", 2, quick),
            ("doomed", "doomed", 3, RetryPolicy(max_attempts=1)),
        ):
            spec = ScheduleSpec(
                name=name,
                trigger=IntervalTrigger(every * SECOND_MS, now),
                command=command,
                retry=retry,
            )
            engine.service.create(spec, actor="test")
    with open_engine(db, clock=past, commands=registry) as engine:
        late = MisfirePolicy(MisfireKind.LATEST, grace_ms=SECOND_MS)
        spec = ScheduleSpec(
            name="late",
            trigger=IntervalTrigger(MINUTE_MS, past.now_ms()),
            command="ok",
            misfire=late,
        )
        engine.service.create(spec, actor="test")


@pytest.fixture
def served(db_path: Path, app_dir: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    scenario(db_path)
    port = free_port()
    env = cli_env({"PYTHONPATH": os.pathsep.join([str(app_dir), os.getcwd()])})
    with (app_dir.parent / "run.log").open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vortos_tui.cli",
                "--db",
                str(db_path),
                "--app",
                "metrics_app",
                "run",
                "--metrics-port",
                str(port),
                "--lease-ttl",
                "3s",
                "--node-id",
                "n1",
            ],
            cwd=app_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        yield port, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(30)


def test_the_readme_table_lists_the_families_this_test_expects() -> None:
    families = documented_families()
    assert len(families) >= 20
    assert families["vortos_fires_total"] == (
        "counter",
        frozenset({"result", "schedule", "tenant"}),
    )


def test_a_running_scheduler_serves_every_documented_family_with_its_labels(
    served: tuple[int, subprocess.Popen[bytes]],
) -> None:
    port, process = served
    text = ""

    def scenario_done() -> bool:
        nonlocal text
        assert process.poll() is None, "vortos run exited"
        text = scrape(port)
        ok = {"schedule": "ok", "tenant": "default"}
        flaky = {"schedule": "flaky", "tenant": "default"}
        doomed = {"schedule": "doomed", "tenant": "default"}
        late = {"schedule": "late", "tenant": "default", "policy": "latest"}
        return (
            total(text, "vortos_runs_total", outcome="completed", **ok) >= 2
            and total(text, "vortos_retries_total", **flaky) >= 1
            and total(text, "vortos_runs_total", outcome="completed", **flaky) >= 1
            and total(text, "vortos_dead_letters_total", **doomed) >= 1
            and total(text, "vortos_misfires_total", action="skipped", **late) >= 1
        )

    wait_for(scenario_done, 60, "the scenario's fires, retry and dead letter", every=0.25)
    served_families = samples(text)
    for name, (kind, labels) in documented_families().items():
        assert name in served_families, f"{name} is not served"
        served_kind, found = served_families[name]
        assert served_kind == kind, f"{name} is a {served_kind}, documented as a {kind}"
        if name in NOT_IN_THIS_SCENARIO and not found:
            continue
        assert found, f"{name} has no sample"
        for sample, have, _ in found:
            assert set(have) - {"le"} == labels, f"{sample} has labels {sorted(have)}"
    dead = {"reason": "retries_exhausted", "schedule": "doomed", "tenant": "default"}
    assert total(text, "vortos_dead_letters_total", **dead) >= 1
    assert total(text, "vortos_leader", lease="scheduler:leader") == 1
    assert total(text, "vortos_active_schedules") >= 4


@pytest.mark.parametrize("command", ["run", "consume"])
def test_a_metrics_port_in_use_stops_the_command_before_it_opens_the_database(
    tmp_path: Path, command: str
) -> None:
    db = tmp_path / "never.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(command, "--metrics-port", str(port), db=db)
    assert result.code == 1
    assert f"127.0.0.1:{port}" in result.stderr
    assert "in use" in result.stderr
    assert not db.exists()
