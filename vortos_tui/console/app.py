"""VortosConsole: the frame, the keys, the live refresh and the verbs.

One poll loop reads for the view in front (and the header) and then waits for the refresh
interval or for `refresh_now()`; a read never starts before the previous one finished. A failed
read shows a degraded banner and the loop simply tries again: the console never quits on an
error of the database or of a verb.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, ClassVar

from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import get_current_worker

from engine import Approval, Overview, VortosError
from engine.domain.access import Operation
from engine.governance.audit import VerificationCancelled, what_was_checked
from vortos_tui.cli.flags import as_flags
from vortos_tui.console import views as _views  # noqa: F401 - registers the built-in views
from vortos_tui.console.actions import ScheduleRef, Verb, VerifyRun, not_applicable
from vortos_tui.console.context import ConsoleContext
from vortos_tui.console.decide import ConfirmDecision, Decided
from vortos_tui.console.dialogs import Confirmed, ConfirmVerb, HelpScreen, JumpTo
from vortos_tui.console.format import clock_time
from vortos_tui.console.views.base import LiveView
from vortos_tui.console.views.registry import find_view, views
from vortos_tui.console.views.verbs import HELP_ONLY, refused_id
from vortos_tui.console.widgets import StatusLine

log = logging.getLogger("vortos.console")


def with_refusals(keymap: Mapping[str, str]) -> dict[str, str]:
    """The keymap, with each verb's hidden twin (see views.verbs) moved along with the verb,
    unless the keymap moves the twin itself. (An id no binding has is ignored by Textual.)"""
    return {refused_id(binding_id): keys for binding_id, keys in keymap.items()} | dict(keymap)


class VortosConsole(App[None]):
    TITLE = "vortos"
    CSS = """
    Screen { background: $background; }
    PagedTable { height: 1fr; }
    #detail { height: 1fr; }
    #detail > Static { margin: 0 0 1 0; }
    #detail #runs { height: auto; max-height: 22; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("colon", "jump", "Views", id="jump", key_display=":"),
        Binding("question_mark", "help", "Help", id="help", key_display="?"),
        Binding("space", "toggle_live", "Live", id="toggle-live"),
        Binding("r", "refresh", "Refresh", id="refresh"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    def __init__(self, ctx: ConsoleContext, *, keymap: dict[str, str] | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.live = True
        self.degraded: str | None = None
        self.last_good_ms: int | None = None
        self.polls = 0  # reads attempted (tests wait on this)
        self.last_message: tuple[str, str] | None = None  # (severity, text) of the last verb
        self.verbs_done = 0
        self.verify_run: VerifyRun | None = None  # the audit verification running, if any
        self._wake: asyncio.Event | None = None
        self._inflight: asyncio.Future[tuple[Overview, Any]] | None = None
        self._history: list[str] = []
        self._keymap = keymap or {}

    # -- start ------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.animation_level = "none"
        if self._keymap:
            self.set_keymap(with_refusals(self._keymap))
        for spec in views():
            self.add_mode(spec.name, partial(spec.factory, self.ctx))
        self._wake = asyncio.Event()
        self.switch_mode(self.ctx.start_view)
        self.run_worker(self._poll_loop(), name="poll", group="poll", exit_on_error=False)

    # -- live refresh -----------------------------------------------------------------------

    def refresh_now(self) -> None:
        """Read at once (the loop's current wait ends); also while live refresh is paused."""
        self._manual = True
        if self._wake is not None:
            self._wake.set()

    async def _poll_loop(self) -> None:
        self._manual = True
        while True:
            if self.live or self._manual:
                self._manual = False
                await self.refresh_once()
            assert self._wake is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.ctx.refresh_s)
            self._wake.clear()

    def _front_view(self) -> LiveView | None:
        for screen in reversed(self.screen_stack):
            if isinstance(screen, LiveView):
                return screen
        return None

    async def refresh_once(self) -> None:
        view = self._front_view()
        now = self.ctx.clock.now_ms()
        # Shielded, and awaited again at unmount: a read cut off by quitting would leave the
        # read model's worker thread reporting to a closed event loop.
        self._inflight = asyncio.ensure_future(self._read(view, now))
        try:
            overview, data = await asyncio.shield(self._inflight)
        except Exception as exc:  # noqa: BLE001 - any failed read degrades, none quits
            self.degraded = (
                f"degraded: last good at {clock_time(self.last_good_ms, self.ctx.zone)}"
                if self.last_good_ms is not None
                else "degraded: nothing read yet"
            ) + f" · {exc} · retrying"
            if view is not None and view.is_attached:
                view.banners.degraded = self.degraded
                view.show_frame(None)
            self.polls += 1
            return
        self.degraded = None
        self.last_good_ms = now
        # What the operator may do, as of this reading: the views' keys and the palette ask.
        self.ctx.identity = overview.identity
        if view is not None and view.is_attached and view is self._front_view():
            view.banners.degraded = None
            view.banners.live = self.live
            view.show(data, now)
            view.loaded = True
            view.show_frame(overview)
            view.recheck_bindings()
        self.polls += 1

    async def _read(self, view: LiveView | None, now: int) -> tuple[Overview, Any]:
        overview = await self.ctx.model.overview(now)
        data = None if view is None else await view.load(self.ctx.model, now)
        return overview, data

    async def on_unmount(self) -> None:
        if self._inflight is not None and not self._inflight.done():
            await asyncio.wait([self._inflight], timeout=5)
        await self.ctx.model.close()

    async def settle(self, polls: int = 1, timeout: float = 10.0) -> None:
        """Wait until `polls` more reads have finished (tests and benchmarks)."""
        target = self.polls + polls
        self.refresh_now()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.polls < target:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the console did not refresh within {timeout}s")
            await asyncio.sleep(0.005)

    # -- keys -------------------------------------------------------------------------------

    def action_refresh(self) -> None:
        self.refresh_now()

    def action_toggle_live(self) -> None:
        self.live = not self.live
        view = self._front_view()
        if view is not None:
            view.banners.live = self.live
            view.query_one(StatusLine).show(view.banners)
        self.notify("live refresh resumed" if self.live else "live refresh paused (space resumes)")
        if self.live:
            self.refresh_now()

    def action_jump(self) -> None:
        self.push_screen(JumpTo(views()), callback=self._jumped)

    def _jumped(self, name: str | None) -> None:
        if name is not None:
            self.switch_view(name)

    def switch_view(self, name: str) -> None:
        spec = find_view(name)
        if spec is None:
            self.notify(f"no view named {name!r}", severity="warning")
            return
        if spec.name != self.current_mode:
            self._history.append(self.current_mode)
            self.switch_mode(spec.name)

    def go_back(self) -> None:
        """esc on a view's base screen: the previous view, as in k9s."""
        if self._history:
            self.switch_mode(self._history.pop())

    def action_help(self) -> None:
        keys: list[tuple[str, str, str]] = []
        seen: set[str] = set()
        for active in self.screen.active_bindings.values():
            binding = active.binding
            # Textual's system keys (ctrl+q, ctrl+p) are listed once, below; the table's own
            # cursor keys (not shown in the footer) are the usual ones and not listed.
            listed = binding.show or binding.id in HELP_ONLY
            if binding.system or not listed or not binding.description or not active.enabled:
                continue
            identity = binding.id or binding.action
            if identity in seen:
                continue
            seen.add(identity)
            keys.append(
                (
                    binding.key_display or self.get_key_display(binding),
                    binding.description,
                    binding.id or "",
                )
            )
        keys.append(("ctrl+p", "Command palette: every verb and view", ""))
        keys.append(("ctrl+q", "Quit (also q)", ""))
        self.push_screen(HelpScreen(keys, views()))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        for spec in views():
            yield SystemCommand(
                f"View: {spec.title}", spec.summary, partial(self.switch_view, spec.name)
            )
        view = self._front_view()
        act = getattr(view, "action_verb", None)
        if not self.ctx.read_only and view is not None and act is not None:
            for verb in Verb:
                # Only the verbs the policy lets the operator use on the selected schedule.
                if not view.check_action("verb", (verb.value,)):
                    continue
                yield SystemCommand(
                    f"{verb.value.capitalize()} the selected schedule",
                    f"{verb.value} it, after a confirmation",
                    # The verb itself, not the key's action: refused meanwhile, it says why.
                    partial(act, verb.value),
                )
        yield SystemCommand("Refresh now", "read everything again", self.refresh_now)
        yield SystemCommand(
            "Pause or resume live refresh", "freeze the screen (space)", self.action_toggle_live
        )
        yield SystemCommand("Help", "every key and view", self.action_help)
        yield from super().get_system_commands(screen)

    # -- verbs ------------------------------------------------------------------------------

    async def ask_verb(self, verb: Verb, ref: ScheduleRef) -> None:
        """Confirm, then act through the service on a thread worker."""
        if self.ctx.actions is None:
            self._say("error", f"read-only console ({self.ctx.read_only_reason}): nothing done")
            return
        decision = self.ctx.may(verb.operation, ref.tenant)
        if not decision.allowed:
            self._say("error", decision.reason)
            return
        why_not = not_applicable(verb, ref)
        if why_not is not None:
            self._say("warning", why_not)
            return
        self.push_screen(
            ConfirmVerb(verb, ref, self.ctx.operator),
            callback=partial(self._confirmed, verb, ref),
        )

    def _confirmed(self, verb: Verb, ref: ScheduleRef, result: Confirmed | None) -> None:
        if result is None:
            self._say("information", f"cancelled: {ref.label} not changed")
            return
        self.run_worker(
            partial(self._perform, verb, ref, result.note),
            thread=True,
            group="verbs",
            name=f"{verb.value} {ref.label}",
            exit_on_error=False,
        )

    def _perform(self, verb: Verb, ref: ScheduleRef, note: str | None) -> None:
        actions = self.ctx.actions
        assert actions is not None
        try:
            message = actions.perform(verb, ref, note)
        except VortosError as exc:
            # The console's edit takes the CLI's options: it names them as the CLI does.
            said = as_flags(str(exc))
            self.call_from_thread(self._acted, "error", f"{verb.value} refused: {said}")
        except Exception as exc:
            log.exception("%s %s failed", verb.value, ref.label)
            self.call_from_thread(self._acted, "error", f"{verb.value} failed: {exc}")
        else:
            self.call_from_thread(self._acted, "information", message)

    def ask_decision(self, verb: str, approval: Approval) -> None:
        """Approve or reject a request after a confirmation (a rejection asks why)."""
        if self.ctx.actions is None:
            self._say("error", f"read-only console ({self.ctx.read_only_reason}): nothing done")
            return
        if approval.requested_by == self.ctx.operator:
            self._say(
                "error",
                f"you asked for {approval.id}: another approver must {verb} it",
            )
            return
        decision = self.ctx.may(Operation.APPROVE, approval.tenant)
        if not decision.allowed:
            self._say("error", decision.reason)
            return
        self.push_screen(
            ConfirmDecision(verb, approval, self.ctx.operator),
            callback=partial(self._decided, verb, approval),
        )

    def _decided(self, verb: str, approval: Approval, result: Decided | None) -> None:
        if result is None:
            self._say("information", f"cancelled: {approval.id} not {verb}d")
            return
        self.run_worker(
            partial(self._decide, verb, approval.id, result.reason),
            thread=True,
            group="verbs",
            exit_on_error=False,
        )

    def _decide(self, verb: str, approval_id: str, reason: str | None) -> None:
        actions = self.ctx.actions
        assert actions is not None
        try:
            message = actions.decide(verb, approval_id, reason)
        except VortosError as exc:
            self.call_from_thread(self._acted, "error", f"{verb} refused: {exc}")
        except Exception as exc:
            log.exception("%s %s failed", verb, approval_id)
            self.call_from_thread(self._acted, "error", f"{verb} failed: {exc}")
        else:
            self.call_from_thread(self._acted, "information", message)

    def verify_audit(self, full: bool = False) -> None:
        """Verify the chains on a thread worker (incrementally, or with `full` from each
        chain's start), its progress shown in the Audit view; `cancel_verify` stops it."""
        if self.ctx.actions is None:
            self._say("error", f"read-only console ({self.ctx.read_only_reason}): no verify")
            return
        if self.verify_run is not None:
            self._say("warning", f"a {self.verify_run.label} is running: x cancels it")
            return
        run = VerifyRun(full)
        self.verify_run = run
        self._say(
            "information",
            "verifying every audit entry, checkpoint and mark…"
            if full
            else "verifying the audit entries since the last verification…",
        )
        self._verify_progressed()
        self.run_worker(
            partial(self._verify, run), thread=True, group="verify", exit_on_error=False
        )

    def cancel_verify(self) -> None:
        run = self.verify_run
        if run is None:
            return
        run.cancel.set()
        self.verify_run = None
        self._verify_progressed()
        self._say("warning", f"{run.label} cancelled: what it had not reached is not verified")

    def _verify(self, run: VerifyRun) -> None:
        actions = self.ctx.actions
        assert actions is not None
        worker = get_current_worker()

        def progress(checked: int, total: int) -> None:
            run.checked, run.total = checked, total
            if not run.cancel.is_set():
                self.call_from_thread(self._verify_progressed)

        def cancelled() -> bool:
            return run.cancel.is_set() or worker.is_cancelled

        try:
            result = actions.verify_audit(full=run.full, progress=progress, cancelled=cancelled)
        except VerificationCancelled:
            return
        except Exception as exc:  # noqa: BLE001 - reported on screen, never fatal
            if not run.cancel.is_set():
                self.call_from_thread(self._verified, run, "error", f"verify failed: {exc}")
            return
        if run.cancel.is_set():  # cancelled while the control socket's server verified
            return
        broken = [r for r in result.chains if not r.intact]
        if broken:
            first = broken[0]
            assert first.problem is not None
            message = (
                f"audit chain {first.chain} is BROKEN at entry {first.problem.seq}: "
                f"{first.problem.reason}"
            )
            self.call_from_thread(self._verified, run, "error", message)
            return
        said = what_was_checked(result, "V verifies them too")
        self.call_from_thread(
            self._verified,
            run,
            "information",
            f"{len(result.chains)} audit chain(s) intact: " + "; ".join(said),
        )

    def _verified(self, run: VerifyRun, severity: SeverityLevel, message: str) -> None:
        if self.verify_run is run:
            self.verify_run = None
        self._verify_progressed()
        self._acted(severity, message)

    def _verify_progressed(self) -> None:
        show: Any = getattr(self.screen, "show_verify_progress", None)
        if show is not None:
            show()

    def _acted(self, severity: SeverityLevel, message: str) -> None:
        self._say(severity, message)
        self.verbs_done += 1
        self.refresh_now()

    def _say(self, severity: SeverityLevel, message: str) -> None:
        self.last_message = (severity, message)
        self.notify(message, severity=severity)
