"""Metrics: the in-process summary and the Prometheus series, with low-cardinality labels."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from prometheus_client import REGISTRY

from django_redlock import LockContended, lock_for
from django_redlock.core import metrics


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.usefixtures("redlock_nodes")
def test_acquisitions_holds_and_contention_are_counted(held_elsewhere):
    before = metrics.summary()
    acquired = sample("redlock_acquisitions_total", lock="orders", outcome="acquired")
    contended = sample("redlock_acquisitions_total", lock="orders", outcome="contended")
    holds = sample("redlock_hold_seconds_count", lock="orders")
    with lock_for("orders:1"):
        pass
    with lock_for("orders:2"):
        pass
    with held_elsewhere("orders:3"), pytest.raises(LockContended), lock_for("orders:3", timeout=0):
        pass
    after = metrics.summary()
    assert after["acquired"] - before.get("acquired", 0) == 2
    assert after["contended"] - before.get("contended", 0) == 1
    # One series for every orders:<id>, not one per name.
    assert sample("redlock_acquisitions_total", lock="orders", outcome="acquired") == acquired + 2
    assert sample("redlock_acquisitions_total", lock="orders", outcome="contended") == contended + 1
    assert sample("redlock_hold_seconds_count", lock="orders") == holds + 2
    assert sample("redlock_acquisitions_total", lock="orders:1", outcome="acquired") == 0


def test_full_names_when_configured(settings, cluster3):
    settings.REDLOCK = {"NODES": cluster3.urls, "METRICS_LABEL": "name"}
    before = sample("redlock_acquisitions_total", lock="orders:9", outcome="acquired")
    with lock_for("orders:9"):
        pass
    assert sample("redlock_acquisitions_total", lock="orders:9", outcome="acquired") == before + 1


@pytest.mark.usefixtures("redlock_nodes")
def test_the_status_command_reports_this_process():
    with lock_for("counted"):
        pass
    out = io.StringIO()
    call_command("redlock_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["this_process"]["acquired"] >= 1
