"""Lock metrics: always a small in-process summary, and Prometheus series when
``prometheus-client`` is installed (``pip install django-redlock[prometheus]``).

Series (labels are low-cardinality: ``lock`` is the name up to its first ``:``, e.g.
``orders`` for ``orders:42``; set ``REDLOCK["METRICS_LABEL"] = "name"`` for full names):

- ``redlock_acquisitions_total{lock, outcome}``: acquired, contended, quorum_unreachable;
- ``redlock_wait_seconds{lock}`` and ``redlock_hold_seconds{lock}``: histograms;
- ``redlock_extensions_total{lock}``, ``redlock_lost_total{lock}``;
- ``redlock_node_errors_total{node}``: per-node failures seen by failed acquires.

They land in prometheus-client's default registry, so django-prometheus (or any
``/metrics`` view using that registry) exposes them. Without the package nothing is
imported and recording costs a dict update.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

__all__ = ["record", "summary"]

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_prometheus: dict[str, Any] | None = None
_tried = False


def _series() -> dict[str, Any] | None:
    global _prometheus, _tried
    if _tried:
        return _prometheus
    _tried = True
    try:
        import prometheus_client as prom
    except ImportError:
        return None
    _prometheus = {
        "acquisitions": prom.Counter(
            "redlock_acquisitions", "Lock acquisitions by outcome", ["lock", "outcome"]
        ),
        "wait": prom.Histogram("redlock_wait_seconds", "Seconds spent acquiring", ["lock"]),
        "hold": prom.Histogram("redlock_hold_seconds", "Seconds a lock was held", ["lock"]),
        "extensions": prom.Counter("redlock_extensions", "Lease extensions", ["lock"]),
        "lost": prom.Counter("redlock_lost", "Leases lost while held", ["lock"]),
        "node_errors": prom.Counter(
            "redlock_node_errors", "Node failures and timeouts seen by acquires", ["node"]
        ),
    }
    return _prometheus


def label_for(name: str, mode: str) -> str:
    """The ``lock`` label of ``name``: its part before the first ``:`` unless mode is name."""
    return name if mode == "name" else name.split(":", 1)[0]


def record(event: str, lock: str, *, seconds: float | None = None, node: str | None = None) -> None:
    """Count one event (acquired, contended, quorum_unreachable, released, extended, lost,
    node_error) for this process, and in Prometheus when it is installed."""
    with _lock:
        _counts[event] += 1
    series = _series()
    if series is None:
        return
    if event in ("acquired", "contended", "quorum_unreachable"):
        series["acquisitions"].labels(lock=lock, outcome=event).inc()
        if seconds is not None:
            series["wait"].labels(lock=lock).observe(seconds)
    elif event == "released" and seconds is not None:
        series["hold"].labels(lock=lock).observe(seconds)
    elif event == "extended":
        series["extensions"].labels(lock=lock).inc()
    elif event == "lost":
        series["lost"].labels(lock=lock).inc()
    elif event == "node_error" and node is not None:
        series["node_errors"].labels(node=node).inc()


def summary() -> dict[str, int]:
    """This process's counts since it started (for the status command and the admin)."""
    with _lock:
        return dict(_counts)
