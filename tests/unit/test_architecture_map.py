"""docs/architecture.md stays true: every package is on the map, every file and test it names
exists, and the two layering rules it states hold in the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = (ROOT / "docs" / "architecture.md").read_text()


def _packages() -> list[str]:
    found = []
    for top in ("engine", "vortos_tui"):
        for init in (ROOT / top).rglob("__init__.py"):
            package = init.parent.relative_to(ROOT).as_posix()
            if package.count("/") <= 1 and "__pycache__" not in package:
                found.append(package)
    return sorted(found)


def test_every_package_is_on_the_map() -> None:
    missing = [p for p in _packages() if f"`{p}`" not in MAP and p not in ("engine", "vortos_tui")]
    assert not missing, f"add these to docs/architecture.md: {missing}"


def test_every_path_the_map_names_exists() -> None:
    named = set(re.findall(r"`((?:tests|engine|vortos_tui|docs)/[\w/.]+)`", MAP))
    named |= {f"engine/{p}" for p in re.findall(r"\(`((?:backends|runtime)/[\w/]+\.py)`", MAP)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names what is gone: {missing}"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_the_domain_imports_only_the_domain() -> None:
    for path in (ROOT / "engine" / "domain").rglob("*.py"):
        outside = {
            m
            for m in _imports(path)
            if m.startswith("engine") and not m.startswith("engine.domain")
        }
        assert not outside, (path.name, outside)


def test_the_console_never_touches_a_backend() -> None:
    for path in (ROOT / "vortos_tui" / "console").rglob("*.py"):
        backends = {m for m in _imports(path) if m.startswith("engine.backends")}
        assert not backends, (path.name, backends)
