"""The doctor's checks of how commands run: runs over their time limit, commands that ignored
their cancellation, and fires whose consumers keep dying under them.

Each is a warning, not a failure: the engine already acted (a run past its limit is asked to
stop and settled timed_out; a fire whose consumers died too often is dead-lettered), but an
operator should know before the workers are all held by hung commands or a crash loop
dead-letters the queue."""

from __future__ import annotations

from engine.domain.errors import VortosError
from engine.domain.timeutil import format_duration
from engine.governance.checks import _Named, _some
from engine.governance.doctor import DoctorContext, Finding
from engine.ports.diagnostics import ExecutionFacts
from engine.runtime.executor import IGNORED_CANCEL

# What "recent" means for commands that ignored cancellation and for consumer deaths.
RECENT_MS = 3600 * 1000
# A fire is reported as near the death budget from this share of it on.
NEAR_BUDGET_SHARE = 0.8
DEFAULT_DEATH_BUDGET = 10


def _facts(ctx: DoctorContext) -> ExecutionFacts | None:
    if ctx.diagnostics is None:
        return None
    now = ctx.clock.now_ms()
    budget = ctx.settings.consumer_deaths if ctx.settings is not None else DEFAULT_DEATH_BUDGET
    return ctx.diagnostics.execution_facts(
        now, now - RECENT_MS, IGNORED_CANCEL, max(1, int(budget * NEAR_BUDGET_SHARE))
    )


class _ExecutionCheck(_Named):
    """A check judging the execution facts: reads them (a failing read fails the check, a
    backend without diagnostics skips it) and hands them to `judge`."""

    unreadable = "the runs cannot be read"

    def run(self, ctx: DoctorContext) -> Finding:
        try:
            facts = _facts(ctx)
        except VortosError as exc:
            return self.fail(self.unreadable, str(exc), "check storage")
        if facts is None:
            return self.skip("no diagnostics for this backend")
        return self.judge(ctx, facts)

    def judge(self, ctx: DoctorContext, facts: ExecutionFacts) -> Finding:
        raise NotImplementedError


class RunsOverLimit(_ExecutionCheck):
    """No run is still running past its schedule's time limit (its consumer's watchdog should
    have stopped it: that consumer is gone, frozen, or predates time limits)."""

    def __init__(self) -> None:
        super().__init__("runs.over_limit")

    def judge(self, ctx: DoctorContext, facts: ExecutionFacts) -> Finding:
        if not facts.over_limit:
            return self.ok("no run is running past its time limit")
        now = ctx.clock.now_ms()
        return self.warn(
            f"{len(facts.over_limit)} run(s) running past their time limit",
            _some(
                [
                    f"run {o.run_id} {o.tenant}/{o.schedule_name}: "
                    f"{format_duration(max(0, now - o.started_at))} of "
                    f"{format_duration(o.timeout_ms)}"
                    for o in facts.over_limit
                ]
            ),
            "a consumer settles a run timed_out within its limit and a few seconds: look at "
            "the consumers' logs (a frozen or old consumer), or `vortos queue list`",
        )


class CommandsIgnoringCancel(_ExecutionCheck):
    """No command ignored the request to stop at its time limit in the last hour: such a
    command keeps a consumer's worker thread busy (a Python thread cannot be killed)."""

    def __init__(self) -> None:
        super().__init__("runs.ignored_cancel")

    def judge(self, ctx: DoctorContext, facts: ExecutionFacts) -> Finding:
        if not facts.ignored_cancel:
            return self.ok("no command ignored its cancellation in the last hour")
        return self.warn(
            f"{len(facts.ignored_cancel)} run(s) in the last hour whose command ignored its "
            "cancellation at its time limit (each still holds a worker thread until it returns)",
            _some([f"run {rid} ({name})" for rid, name in facts.ignored_cancel]),
            "make the command stop when asked (check fire.cancelled or use "
            "fire.wait_cancelled), or run it as a process command, which can be killed; "
            "vortos_commands_ignoring_cancel counts the threads held",
        )


class ConsumerDeaths(_ExecutionCheck):
    """Consumers do not keep dying under fires: fires abandoned by a dead consumer in the last
    hour, and fires near their consumer_deaths budget (then dead-lettered)."""

    def __init__(self) -> None:
        super().__init__("consumers.deaths")

    unreadable = "the fire queue cannot be read"

    def judge(self, ctx: DoctorContext, facts: ExecutionFacts) -> Finding:
        near, recent = facts.near_death_budget, facts.abandoned_since
        if not near and not recent:
            return self.ok("no fire lost its consumer in the last hour")
        budget = ctx.settings.consumer_deaths if ctx.settings is not None else DEFAULT_DEATH_BUDGET
        parts = [f"{recent} fire(s) abandoned by a dead consumer in the last hour"]
        if near:
            parts.append(
                f"{len(near)} near the consumer_deaths budget of {budget}: "
                + _some([f"run {rid} ({name}) {deaths} death(s)" for rid, name, deaths in near])
            )
        return self.warn(
            "consumers died holding fires",
            "; ".join(parts),
            "look for consumers crashing or killed (OOM, restarts) and for a command that "
            "kills its process; a fire past the budget is dead-lettered",
        )
