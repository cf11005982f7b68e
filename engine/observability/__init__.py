"""Observability: metrics (Prometheus), spans (OpenTelemetry), and the hooks that feed them.

The runtime reports to an `Observer` (a do-nothing one by default). Importing this package
imports neither prometheus_client nor OpenTelemetry: `PrometheusMetrics`, `StoreGauges` and
`watch` load prometheus_client when first used, `serve_metrics` when called, and `tracing()`
loads OpenTelemetry only when called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.observability.guard import (
    DEFAULT_MAX_SCHEDULES,
    DEFAULT_MAX_TENANTS,
    OVERFLOW,
    CardinalityGuard,
)
from engine.observability.observer import (
    NULL_OBSERVER,
    DeadmanVerdict,
    DispatchFacts,
    LeaderChange,
    NullObserver,
    Observer,
    Observers,
    PruneTrigger,
    RunWatch,
    ScheduleVerdict,
    run_result,
)
from engine.observability.server import DEFAULT_METRICS_HOST, MetricsServer, serve_metrics
from engine.observability.tracing import Tracing, tracing

if TYPE_CHECKING:
    from engine.observability.gauges import StoreGauges, watch
    from engine.observability.metrics import PrometheusMetrics

_LAZY = {
    "PrometheusMetrics": "engine.observability.metrics",
    "StoreGauges": "engine.observability.gauges",
    "watch": "engine.observability.gauges",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_MAX_SCHEDULES",
    "DEFAULT_MAX_TENANTS",
    "DEFAULT_METRICS_HOST",
    "NULL_OBSERVER",
    "OVERFLOW",
    "CardinalityGuard",
    "DeadmanVerdict",
    "DispatchFacts",
    "LeaderChange",
    "MetricsServer",
    "NullObserver",
    "Observer",
    "Observers",
    "PrometheusMetrics",
    "PruneTrigger",
    "RunWatch",
    "ScheduleVerdict",
    "StoreGauges",
    "Tracing",
    "run_result",
    "serve_metrics",
    "tracing",
    "watch",
]
