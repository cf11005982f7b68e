"""`vortos-tui`: the operations console (arrives with the console issue)."""

from __future__ import annotations

import sys


def main() -> None:
    sys.stderr.write(
        "vortos-tui: the operations console is not part of this release yet; "
        "use `vortos schedule list` and `vortos runs list` meanwhile.\n"
    )
    sys.exit(1)
