"""The README's recipe: spans and Django signals from the settings' manager at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_redlock import get_manager
from django_redlock.conf import RedlockSettings
from django_redlock.contrib.otel import OtelObserver, compose_observers
from django_redlock.default_manager import build_manager, set_manager_factory
from django_redlock.redlock import LockManager
from django_redlock.signals import SignalObserver, lock_acquired, observed_manager

pytestmark = pytest.mark.usefixtures("redlock_nodes")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def traced_manager(config: RedlockSettings) -> LockManager:  # as in the README
        signals = SignalObserver(label_mode=config.metrics_label)
        observer = compose_observers(signals, OtelObserver(tracer_provider=provider))
        manager = build_manager(config, observer=observer)
        signals.manager = manager
        return manager

    set_manager_factory(traced_manager)
    yield exporter
    set_manager_factory(observed_manager)


def test_a_manager_factory_adds_spans_and_keeps_the_signals(exporter):
    heard: list[str] = []

    def receiver(sender, lease, **kwargs):
        heard.append(lease.name)

    lock_acquired.connect(receiver)
    try:
        with get_manager().lock("traced", ttl=5.0):
            pass
    finally:
        lock_acquired.disconnect(receiver)
    assert heard == ["traced"]
    names = [span.name for span in exporter.get_finished_spans()]
    assert names == ["redlock.acquire", "redlock.release"]
