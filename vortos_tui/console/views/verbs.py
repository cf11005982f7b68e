"""The verbs on one schedule (pause, resume, trigger now, edit) as keys: shown for a schedule the
operator may change, hidden for one the policy keeps them from, and all hidden by --read-only.

Each key is bound twice: to the verb, then (never shown) to `refused`, which Textual reaches
only when the verb's check hid it. The key then says why, in the policy's words, instead of
doing nothing."""

from __future__ import annotations

from textual.binding import Binding, BindingType

from engine import Schedule
from vortos_tui.console.actions import Verb
from vortos_tui.console.context import ConsoleContext

VERB_KEYS = (
    ("p", Verb.PAUSE, "Pause"),
    ("u", Verb.RESUME, "Resume"),
    ("t", Verb.TRIGGER, "Trigger"),
    ("e", Verb.EDIT, "Edit"),
)
# Keys the help lists though the footer does not show them (see verb_bindings).
HELP_ONLY = frozenset({Verb.EDIT.value})


def refused_id(binding_id: str) -> str:
    """The id of the hidden binding that answers a refused verb's key (a keymap that moves the
    verb moves it too, see VortosConsole)."""
    return f"{binding_id}-refused"


def verb_bindings() -> list[BindingType]:
    bindings: list[BindingType] = []
    for key, verb, label in VERB_KEYS:
        # Edit is in the help and the palette, not the footer: at 80 columns the footer
        # would drop "? Help" for it.
        shown = verb.value not in HELP_ONLY
        bindings.append(Binding(key, f"verb('{verb.value}')", label, show=shown, id=verb.value))
        bindings.append(
            Binding(key, f"refused('{verb.value}')", label, show=False, id=refused_id(verb.value))
        )
    return bindings


def check_verb(
    ctx: ConsoleContext, action: str, parameters: tuple[object, ...], target: Schedule | None
) -> bool | None:
    """check_action for a view whose verbs act on `target` (None: nothing selected)."""
    if action == "verb":
        if ctx.read_only:
            return False  # False hides the key; None would only dim it
        if target is None:
            return True  # the verb itself says that nothing is selected
        return ctx.may(Verb(str(parameters[0])).operation, target.tenant).allowed
    if action == "refused":
        # Only reached when the verb on the same key was hidden; under --read-only the keys
        # stay silent.
        return not ctx.read_only and target is not None
    return True
