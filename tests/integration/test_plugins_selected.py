"""Plug-ins selected by setting, in real processes: a policy of one's own governs the CLI, a
doctor check of one's own runs in `vortos doctor`, and `vortos run` hands fires to an
enqueuer instead of running them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import run_cli
from tests.integration.processes import Daemon, wait_for

PLUGINS = textwrap.dedent(
    '''
    """Plug-ins of a user's own, selected by dotted path."""
    import json
    import threading

    from engine.extend import Decision, Finding, Operation, PluginContext, Status


    class ChangeFreeze:
        """Refuses every pause during the freeze; everything else as the default policy."""

        def __init__(self, context: PluginContext) -> None:
            self.default = context.default
            self.reason = context.options.get("reason", "change freeze")

        def decide(self, identity, operation, tenant):
            if operation is Operation.PAUSE:
                return Decision(False, self.reason)
            return self.default.decide(identity, operation, tenant)


    class BackupFresh:
        check_id = "site.backup"

        def __init__(self, context: PluginContext) -> None:
            self.marker = context.options["marker"]

        def run(self, ctx):
            import os
            if os.path.exists(self.marker):
                return Finding(self.check_id, Status.PASS, "backup marker present")
            return Finding(self.check_id, Status.FAIL, "no backup", remediation="run backup")


    class FileBroker:
        """Appends each fire to a file, as a broker would accept it."""

        def __init__(self, context: PluginContext) -> None:
            self.path = context.options["path"]
            self.lock = threading.Lock()

        def enqueue(self, fire):
            line = json.dumps({"slot_key": fire.slot_key, "command": fire.command})
            with self.lock, open(self.path, "a") as out:
                out.write(line + "\\n")

        def close(self):
            pass
    '''
)


def setup(tmp_path: Path, config: str) -> tuple[Path, dict[str, str]]:
    (tmp_path / "siteplugins.py").write_text(PLUGINS)
    toml = tmp_path / "vortos.toml"
    toml.write_text(textwrap.dedent(config))
    return tmp_path / "vortos.db", {"VORTOS_CONFIG": str(toml), "PYTHONPATH": str(tmp_path)}


def test_a_policy_plugin_governs_the_cli(tmp_path: Path) -> None:
    db, env = setup(
        tmp_path,
        """
        policy = "siteplugins:ChangeFreeze"
        [plugin."siteplugins:ChangeFreeze"]
        reason = "change freeze until Monday"
        """,
    )
    added = run_cli(
        "schedule", "add", "nightly", "--cron", "0 2 * * *", "--command", "noop", db=db, env=env
    )
    assert added.code == 0, added.stderr

    paused = run_cli("schedule", "pause", "nightly", db=db, env=env)

    assert paused.code == 4, paused.stderr
    assert "change freeze until Monday" in paused.stderr
    shown = run_cli("schedule", "show", "nightly", "--json", db=db, env=env)
    assert json.loads(shown.stdout)["status"] == "active", "the refused pause changed nothing"


def test_a_doctor_check_plugin_runs_in_doctor(tmp_path: Path) -> None:
    marker = tmp_path / "backup.ok"
    db, env = setup(
        tmp_path,
        f"""
        doctor_checks = ["siteplugins:BackupFresh"]
        [plugin."siteplugins:BackupFresh"]
        marker = "{marker}"
        """,
    )
    assert run_cli("db", "init", db=db, env=env).code == 0

    failing = run_cli("doctor", "--json", db=db, env=env)
    marker.write_text("")
    passing = run_cli("doctor", "--json", db=db, env=env)

    def finding(out: str) -> dict[str, str]:
        found: dict[str, dict[str, str]] = {f["check_id"]: f for f in json.loads(out)["findings"]}
        return found["site.backup"]

    assert failing.code == 1
    assert finding(failing.stdout)["status"] == "fail"
    assert finding(passing.stdout)["status"] == "pass"
    ports = {f["check_id"]: f for f in json.loads(passing.stdout)["findings"]}["plugins.ports"]
    assert "doctor checks: siteplugins:BackupFresh (dotted path" in ports["detail"]


def test_vortos_run_hands_fires_to_the_selected_enqueuer(tmp_path: Path) -> None:
    sent = tmp_path / "broker.jsonl"
    db, env = setup(
        tmp_path,
        f"""
        enqueuer = "siteplugins:FileBroker"
        [plugin."siteplugins:FileBroker"]
        path = "{sent}"
        """,
    )
    added = run_cli("schedule", "add", "tick", "--every", "1s", "--command", "noop", db=db, env=env)
    assert added.code == 0, added.stderr
    node = Daemon(db, "node-a", tmp_path, env=env)
    try:
        wait_for(
            lambda: sent.exists() and len(sent.read_text().splitlines()) >= 3,
            20,
            "three fires handed to the broker",
        )
    finally:
        assert node.terminate() == 0, node.log
    lines = [json.loads(line) for line in sent.read_text().splitlines()]
    assert {line["command"] for line in lines} == {"noop"}
    assert len({line["slot_key"] for line in lines}) == len(lines), "each fire handed over once"
    runs = run_cli("runs", "list", "--schedule", "tick", "--json", db=db, env=env)
    handed = [r for r in json.loads(runs.stdout) if r["state"] == "completed"]
    assert len(handed) >= len(lines)
    assert all("handed to enqueuer FileBroker" in (r["output"] or "") for r in handed)
