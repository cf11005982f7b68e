"""The plug-in state store's conformance suite."""

from __future__ import annotations

from dataclasses import replace

from engine.domain.audit import AuditEvent
from engine.ports.plugin_state import PluginHealth
from engine.ports.storage import Storage
from engine.testing.conformance.storage import T0, StorageConformance

SINK = "siem"


def health(node: str = "node-a", plugin: str = SINK, **changes: object) -> PluginHealth:
    base = PluginHealth(
        node_id=node,
        port="audit_sinks",
        plugin=plugin,
        calls=3,
        failures=1,
        timeouts=0,
        dropped=0,
        busy_since=None,
        backlog=2,
        last_error="ConnectionError: refused",
        last_error_at=T0 - 500,
        reported_at=T0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


class PluginStateConformance(StorageConformance):
    """What the engine keeps about plug-ins (`Storage.plugin_state`,
    engine.ports.plugin_state.PluginStateStore): each audit sink's position per chain, which
    lets a sink resume its copy without a gap, and each node's health report, which doctor
    reads from any host.

    Guarantees checked: positions are per sink and per chain and only move forward; a health
    report replaces the same node's previous one for that plug-in and round-trips every field;
    stale reports are left out by `since_ms`.

    Subclass it and implement `open_storage`:

        class TestMyPluginState(PluginStateConformance):
            def open_storage(self, clock, directory):
                return closing(MyStorage(directory / "store.db", clock))
    """

    def test_a_sink_without_a_position_has_none(self, storage: Storage) -> None:
        assert storage.plugin_state.sink_positions(SINK) == {}

    def test_positions_are_kept_per_sink_and_chain(self, storage: Storage) -> None:
        state = storage.plugin_state
        state.advance_sink(SINK, "tenant:acme", 5, T0)
        state.advance_sink(SINK, "system", 2, T0)
        state.advance_sink("archive", "tenant:acme", 9, T0)

        assert state.sink_positions(SINK) == {"tenant:acme": 5, "system": 2}, (
            "positions: each sink keeps its own position per chain"
        )
        assert state.sink_positions("archive") == {"tenant:acme": 9}

    def test_a_position_only_moves_forward(self, storage: Storage) -> None:
        state = storage.plugin_state
        state.advance_sink(SINK, "system", 7, T0)
        state.advance_sink(SINK, "system", 4, T0 + 1)  # a late writer: must not move it back
        state.advance_sink(SINK, "system", 8, T0 + 2)

        assert state.sink_positions(SINK) == {"system": 8}, (
            "positions only move forward: a lower position must be ignored, or entries would "
            "be delivered again"
        )

    def test_a_health_report_round_trips_every_field(self, storage: Storage) -> None:
        report = health(busy_since=T0 - 100, timeouts=2, dropped=4)
        storage.plugin_state.report_health([report])

        assert storage.plugin_state.health(T0) == [report]

    def test_a_report_replaces_the_nodes_previous_one(self, storage: Storage) -> None:
        state = storage.plugin_state
        state.report_health([health(calls=1)])
        later = health(calls=9, failures=0, last_error=None, last_error_at=None, reported_at=T0 + 5)
        state.report_health([later])

        assert state.health(T0) == [later], "one report per node and plug-in: the latest"

    def test_reports_of_several_nodes_and_plugins_are_all_kept(self, storage: Storage) -> None:
        reports = [health("node-a"), health("node-b"), health("node-a", plugin="statsd")]
        reports[2] = replace(reports[2], port="metrics")
        storage.plugin_state.report_health(reports)

        found = storage.plugin_state.health(T0)

        assert sorted(found, key=lambda r: (r.port, r.plugin, r.node_id)) == sorted(
            reports, key=lambda r: (r.port, r.plugin, r.node_id)
        )

    def test_audit_heads_name_each_chains_newest_entry(self, storage: Storage) -> None:
        # What the audit shipper compares sink positions with.
        assert storage.audit.heads() == {}
        storage.audit.append(
            [
                AuditEvent("schedule.created", "alice", tenant="acme"),
                AuditEvent("schedule.paused", "alice", tenant="acme"),
                AuditEvent("leader.acquired", "node-a"),
            ]
        )

        # Each chain's opening entry, then what was appended.
        assert storage.audit.heads() == {"tenant:acme": 3, "system": 2}, (
            "heads: every chain with entries, at its newest sequence number"
        )

    def test_stale_reports_are_left_out(self, storage: Storage) -> None:
        storage.plugin_state.report_health([health("old", reported_at=T0 - 60_000), health()])

        assert [r.node_id for r in storage.plugin_state.health(T0 - 1_000)] == ["node-a"]
