"""The console's screen as plain text lines, read from Textual's SVG screenshot (the same
rendering the snapshots store): what an operator at that terminal size would read."""

from __future__ import annotations

import html
import re
from collections import defaultdict

from textual.app import App

_TEXT = re.compile(r'<text[^>]*\bx="([\d.]+)"[^>]*\by="([\d.]+)"[^>]*>(.*?)</text>', re.S)
CELL_WIDTH_PX = 12.2  # Rich's SVG export: one terminal cell


def screen_lines(app: App[None]) -> list[str]:
    rows: dict[float, list[tuple[float, str]]] = defaultdict(list)
    for x, y, text in _TEXT.findall(app.export_screenshot()):
        rows[float(y)].append((float(x), html.unescape(text).replace("\xa0", " ")))
    lines = []
    for y in sorted(rows)[1:]:  # the first is the window title of the SVG, not the screen
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / CELL_WIDTH_PX)) + text
        lines.append(line.rstrip())
    return lines
