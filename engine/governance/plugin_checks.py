"""Doctor checks of the plug-ins: which implementation serves each port, and how the
secondary ones (audit sinks, metrics backends) fare on every node that runs them."""

from __future__ import annotations

from engine.governance.doctor import DoctorContext, Finding, Status

# Reports older than this come from nodes that stopped: not shown.
REPORT_FRESH_MS = 10 * 60_000
# A failure this recent is still news.
FAILURE_RECENT_MS = 15 * 60_000


class PluginsServing:
    """Lists the implementation serving each port (built-in, entry point or dotted path)."""

    check_id = "plugins.ports"

    def run(self, ctx: DoctorContext) -> Finding:
        if ctx.plugin_problem is not None:
            return Finding(
                self.check_id,
                Status.FAIL,
                "a plug-in the settings name cannot be loaded",
                ctx.plugin_problem,
                "install the plug-in's package, fix the name or dotted path, or fix the "
                "plug-in; `vortos plugins` lists what is installed",
            )
        if ctx.plugins is None:
            return Finding(self.check_id, Status.SKIP, "plug-ins were not loaded")
        rows = ctx.plugins.rows()
        plugged = ctx.plugins.plugged()
        summary = (
            f"{len(plugged)} plug-in(s): {', '.join(p.name for p in plugged)}"
            if plugged
            else "the built-in implementations serve every port"
        )
        return Finding(
            self.check_id,
            Status.PASS,
            summary,
            "\n".join(f"{port}: {served}" for port, served in rows),
        )


class PluginsHealth:
    """Audit sinks and metrics backends: failures, hung calls and backlog, as each node that
    runs them last reported (they never stop firing, so only this shows them)."""

    check_id = "plugins.health"

    def run(self, ctx: DoctorContext) -> Finding:
        now = ctx.clock.now_ms()
        reports = ctx.storage.plugin_state.health(now - REPORT_FRESH_MS)
        if not reports:
            return Finding(self.check_id, Status.PASS, "no node reports a secondary plug-in")
        troubles = []
        for r in reports:
            where = f"{r.port} {r.plugin} on {r.node_id}"
            if r.busy_since is not None and now - r.busy_since > ctx.plugin_timeout_ms:
                troubles.append(
                    f"{where}: a call has hung for {(now - r.busy_since) // 1000}s "
                    f"({r.timeouts} timeout(s) so far)"
                )
            elif r.last_error_at is not None and now - r.last_error_at <= FAILURE_RECENT_MS:
                troubles.append(
                    f"{where}: {r.failures} failure(s), {r.timeouts} timeout(s) of "
                    f"{r.calls + r.failures} call(s); last {(now - r.last_error_at) // 1000}s "
                    f"ago: {r.last_error}"
                )
            if r.dropped:
                troubles.append(f"{where}: {r.dropped} event(s) dropped while it was behind")
            if r.port == "audit_sinks" and r.backlog:
                troubles.append(f"{where}: {r.backlog} audit entr(ies) waiting to be copied")
        if troubles:
            return Finding(
                self.check_id,
                Status.WARN,
                f"{len(troubles)} problem(s) with secondary plug-ins (firing is not affected)",
                "\n".join(troubles),
                "fix the plug-in's target (the SIEM, the metrics agent) or its settings; audit "
                "sinks catch up from where their copy ends once they accept entries again",
            )
        names = sorted({f"{r.port} {r.plugin}" for r in reports})
        return Finding(self.check_id, Status.PASS, f"healthy: {', '.join(names)}")
