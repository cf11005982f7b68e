"""Observability costs nothing to a library user who does not ask for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.observability import tracing


def test_without_the_package_tracing_is_none_and_nothing_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import now raises ImportError
    assert tracing() is None


def test_importing_the_engine_imports_neither_opentelemetry_nor_prometheus_client() -> None:
    code = (
        "import sys, engine, engine.observability, engine.runtime.daemon; "
        "print('opentelemetry' in sys.modules, 'prometheus_client' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "False"]
