"""The README's worked cron/DST cases are the tested table (tests/unit/cron_table.md), row for
row: a case changed in one place and not the other fails here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and line[2:3].isdigit()]


def test_the_readme_holds_every_row_of_the_tested_table() -> None:
    table = _rows((ROOT / "tests" / "unit" / "cron_table.md").read_text())
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("<summary>More worked cases") : readme.index("</details>")]
    assert len(table) >= 60
    assert _rows(section) == table
