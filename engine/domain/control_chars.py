"""Characters that steer a terminal instead of showing: refused in the free text an operator
types, and shown visibly wherever stored text reaches a person.

Stored text can come from anyone with a role (a pause note), from a program (a run's output
tail) or from a plug-in, and is later printed in another operator's terminal: an ESC there can
move the cursor, erase a line and print a forged one, set the window title or clear the screen;
a bidi override reorders what is shown. So every control character (Unicode category Cc: C0,
DEL and C1, whose U+009B is a CSI on its own) and the bidi embedding, override and isolate
characters are one class here, with one visible spelling.
"""

from __future__ import annotations

from engine.domain.errors import InvalidInput

# Bidi embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and isolates (LRI, RLI, FSI, PDI).
_BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
# Category Cc is exactly these two ranges (C0 with DEL, and C1).
_CONTROL = (*range(0x00, 0x20), *range(0x7F, 0xA0))
_LAYOUT = (ord("\n"), ord("\t"))
# Every code point that can steer a terminal, newline and tab included.
STEERING_CODES = frozenset((*_CONTROL, *_BIDI))


def _spelled(code: int) -> str:
    # Python's own escape: ESC shows as the four characters \x1b, RLO as \u202e, CR as \r.
    return repr(chr(code))[1:-1]


_VISIBLE: dict[int, str] = {
    code: _spelled(code) for code in sorted(STEERING_CODES) if code not in _LAYOUT
}
# On one line a newline (or a tab) is as visible as the rest, so it cannot forge a line.
_VISIBLE_ON_ONE_LINE: dict[int, str] = {**_VISIBLE, ord("\n"): "\\n", ord("\t"): "\\t"}
_UNSAFE = frozenset(map(chr, _VISIBLE))
_UNSAFE_ON_ONE_LINE = _UNSAFE | {"\n", "\t"}


def steering(text: str, *, one_line: bool = False) -> list[int]:
    """Where in `text` the characters are that `visible` would spell out (none, at C speed,
    for the printable text that nearly every cell is)."""
    if text.isprintable():  # no Cc, Cf or separator character: nothing to spell
        return []
    unsafe = _UNSAFE_ON_ONE_LINE if one_line else _UNSAFE
    return [i for i, ch in enumerate(text) if ch in unsafe]


def visible(text: str, *, one_line: bool = False) -> str:
    """`text` with every steering character spelled out; newlines and tabs stay unless
    `one_line`. Idempotent: the spelling holds no such character."""
    return text.translate(_VISIBLE_ON_ONE_LINE if one_line else _VISIBLE)


def refuse_control_characters(text: str, what: str) -> None:
    """Free text typed by an operator is plain text: no character in it may steer a terminal
    (a newline neither: it is shown on one line)."""
    found = sorted({ch for ch in text if ch in _UNSAFE or ch in "\n\t"})
    if found:
        shown = ", ".join(visible(ch, one_line=True) for ch in found)
        raise InvalidInput(
            f"the {what} holds control characters ({shown}): write it as plain text on one line"
        )
