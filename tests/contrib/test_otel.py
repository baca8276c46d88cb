"""OpenTelemetry spans of ``django_redlock.contrib.otel`` on real nodes, recorded by the SDK's
in-memory exporter."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from django_redlock.contrib.otel import ObserverChain, OtelObserver, compose_observers
from django_redlock.exceptions import LockContended, LockLost, QuorumUnreachable
from django_redlock.localnodes import LocalCluster
from django_redlock.redlock import LockManager
from tests.helpers import FakeClock

PASSWORD = "otel-s3cret-pw"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def observer(exporter: InMemorySpanExporter) -> OtelObserver:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelObserver(tracer_provider=provider)


@pytest.fixture(scope="module")
def guarded() -> Iterator[LocalCluster]:
    """Three nodes that need a password: their URLs carry it."""
    with LocalCluster(3, password=PASSWORD) as cluster:
        yield cluster


def spans(exporter: InMemorySpanExporter) -> list[tuple[str, dict[str, Any]]]:
    return [(span.name, dict(span.attributes or {})) for span in exporter.get_finished_spans()]


def every_text(span: ReadableSpan) -> str:
    """Everything a span carries as text: name, attributes, status, events."""
    parts = [span.name, repr(dict(span.attributes or {})), str(span.status.description)]
    parts += [repr((event.name, dict(event.attributes or {}))) for event in span.events]
    return "\n".join(parts)


def test_acquire_extend_release_are_spans_with_the_lock_and_the_nodes(cluster3, observer, exporter):
    clock = FakeClock()
    manager = LockManager(cluster3.urls, observer=observer, clock=clock, sleep=clock.sleep)
    with manager.lock("report:42", ttl=10.0, origin="tests.view") as lease:
        lease.extend()
    names = [name for name, _ in spans(exporter)]
    assert names == ["redlock.acquire", "redlock.extend", "redlock.release"]
    acquire, extend, release = (attributes for _, attributes in spans(exporter))
    assert acquire["redlock.lock.name"] == "report:42"
    assert acquire["redlock.lock.kind"] == "lock"
    assert acquire["redlock.origin"] == "tests.view"
    assert acquire["redlock.outcome"] == "acquired"
    assert acquire["redlock.quorum"] == 2
    assert tuple(acquire["redlock.nodes"]) == manager.nodes
    assert acquire["redlock.wait_s"] >= 0
    assert extend["redlock.validity_s"] > 0
    assert release["redlock.outcome"] == "released"
    assert all(
        span.status.status_code == StatusCode.UNSET for span in exporter.get_finished_spans()
    )


def test_the_acquire_span_lasts_the_wait(cluster3, observer, exporter):
    """The observer hears of the acquire once it is over: the span starts ``waited`` earlier."""
    clock = FakeClock()
    manager = LockManager(cluster3.urls, observer=observer, clock=clock, sleep=clock.sleep)
    other = LockManager(cluster3.urls)  # another owner (the same one would re-enter)
    holder = other.acquire("busy", ttl=60.0)
    with pytest.raises(LockContended):
        manager.acquire("busy", ttl=5.0, timeout=3.0)  # the fake clock runs the wait out
    gave_up = exporter.get_finished_spans()[-1]
    assert gave_up.name == "redlock.acquire"
    waited = gave_up.attributes["redlock.wait_s"]
    assert waited >= 3.0
    assert gave_up.end_time - gave_up.start_time >= int(waited * 1e9) - 1
    assert gave_up.status.status_code == StatusCode.ERROR
    assert gave_up.attributes["redlock.outcome"] == "contended"
    assert gave_up.attributes["redlock.votes"] == 0
    assert gave_up.attributes["redlock.quorum"] == 2
    assert gave_up.attributes["redlock.attempts"] > 1
    holder.release()
    other.close()


def test_a_lost_lease_is_an_error_span_with_its_reason(cluster3, observer, exporter):
    clock = FakeClock()
    manager = LockManager(cluster3.urls, observer=observer, clock=clock, sleep=clock.sleep)
    lease = manager.acquire("short", ttl=2.0)
    clock.advance(3.0)
    with pytest.raises(LockLost):
        lease.check()
    lost = exporter.get_finished_spans()[-1]
    assert lost.name == "redlock.lost"
    assert lost.status.status_code == StatusCode.ERROR
    assert lost.attributes["redlock.reason"] == "the lease expired: its validity ran out"
    assert lost.attributes["redlock.lost_cause"] == "expired"


def test_no_span_carries_a_token_or_a_password(guarded, observer, exporter):
    urls = guarded.urls
    assert all(PASSWORD in url for url in urls)
    manager = LockManager(urls, observer=observer, node_timeout=0.5)
    tokens = []
    with manager.lock("secret:1", ttl=10.0) as lease:
        tokens.append(lease.token)
        lease.extend()
        with LockManager(urls, observer=observer) as other, pytest.raises(LockContended):
            other.acquire("secret:1", blocking=False)
    lost = manager.acquire("secret:2", ttl=10.0)
    tokens.append(lost.token)
    lost._mark_lost("its validity ran out", "expired")  # as when a renewal came too late
    lost.release()
    # Two nodes down (their URLs still carry the password): the give-up names them.
    guarded[1].stop()
    guarded[2].stop()
    try:
        with pytest.raises(QuorumUnreachable):
            manager.acquire("secret:3", blocking=False)
    finally:
        guarded.ensure_running()
        manager.close()
    finished = exporter.get_finished_spans()
    assert {span.name for span in finished} == {
        "redlock.acquire",
        "redlock.extend",
        "redlock.release",
        "redlock.lost",
    }
    unreachable = finished[-1]
    assert unreachable.attributes["redlock.outcome"] == "quorum_unreachable"
    assert len(unreachable.attributes["redlock.nodes.failed"]) == 2
    for span in finished:
        text = every_text(span)
        assert PASSWORD not in text
        for token in tokens:
            assert token not in text


class Broken:
    def __getattr__(self, name: str) -> Any:
        def fail(*_: object) -> None:
            raise RuntimeError(f"broken {name}")

        return fail


class Recording:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *_: self.events.append(name)


def test_composed_observers_all_hear_every_event_even_after_one_fails(
    cluster3, observer, exporter, caplog
):
    recording = Recording()
    chain = compose_observers(Broken(), None, observer, recording)
    assert isinstance(chain, ObserverChain)
    manager = LockManager(cluster3.urls, observer=chain)
    with caplog.at_level(logging.ERROR, logger="django_redlock"), manager.lock("both") as lease:
        lease.extend()
    assert recording.events == ["acquired", "extended", "released"]
    assert [name for name, _ in spans(exporter)] == [
        "redlock.acquire",
        "redlock.extend",
        "redlock.release",
    ]
    assert "broken acquired" in caplog.text


def test_compose_observers_keeps_a_single_one_and_refuses_what_is_not_an_observer(observer):
    assert compose_observers(None, observer) is observer
    assert compose_observers() is None
    with pytest.raises(TypeError, match="observers"):
        compose_observers(observer, object())  # type: ignore[arg-type]


def test_a_failing_tracer_never_breaks_the_lock(cluster3, caplog):
    class FailingTracer:
        def start_span(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("exporter down")

    manager = LockManager(cluster3.urls, observer=OtelObserver(tracer=FailingTracer()))  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="django_redlock"), manager.lock("robust"):
        pass
    assert "redlock.acquire" in caplog.text


def test_semaphore_and_read_leases_are_spans_of_their_kind(cluster3, observer, exporter):
    manager = LockManager(cluster3.urls, observer=observer)
    manager.semaphore("api", 2).acquire(ttl=10.0).release()
    manager.rwlock("table").read(ttl=10.0).release()
    kinds = [
        (name, attributes["redlock.lock.name"], attributes["redlock.lock.kind"])
        for name, attributes in spans(exporter)
    ]
    assert kinds == [
        ("redlock.acquire", "api", "semaphore"),
        ("redlock.release", "api", "semaphore"),
        ("redlock.acquire", "table", "read"),
        ("redlock.release", "table", "read"),
    ]
