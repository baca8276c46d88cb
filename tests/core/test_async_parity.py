"""One behaviour, both paths: the asyncio manager logs, signals and counts what the sync one
does (issue 14, point 6).

The same scenario (acquire, extend, release, a contended try, a blocking acquire that gives
up, a lost lease, a quorum out of reach, a grant despite a node down) runs through a
``LockManager`` and through an ``AsyncLockManager``, each with the Django layer's own
``SignalObserver``; the log records (logger, level, message with the numbers blanked), the
signals sent and the metrics counted must be the same.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock import (
    LockContended,
    LockLost,
    LockManager,
    QuorumUnreachable,
    signals,
)
from django_redlock.aredlock import AsyncLockManager
from django_redlock.core import metrics
from django_redlock.localnodes import LocalCluster
from tests.helpers import node_client, put_lock

SIGNALS = {
    "lock_acquired": signals.lock_acquired,
    "lock_released": signals.lock_released,
    "lock_lost": signals.lock_lost,
    "lock_busy": signals.lock_busy,
}


async def done(value: Any) -> Any:
    """``value``, awaited if it is awaitable: one scenario drives both managers."""
    return await value if inspect.isawaitable(value) else value


async def scenario(manager: Any, holder: LockManager, cluster: LocalCluster) -> None:
    """Every kind of event a lock can report, in a fixed order."""
    lease = await done(manager.acquire("parity:a", ttl=5.0))
    await done(lease.extend())
    await done(lease.release())

    busy = holder.acquire("parity:b", ttl=10.0)
    with pytest.raises(LockContended):
        await done(manager.acquire("parity:b", blocking=False))
    with pytest.raises(LockContended):  # blocking: several attempts, then it gives up
        await done(manager.acquire("parity:b", timeout=0.05))
    busy.release()

    lost = await done(manager.acquire("parity:c", ttl=5.0))
    for node in cluster:  # another holder's token in our keys: the lease is gone
        with node_client(node) as client:
            put_lock(client, lost.key, "someone-else")
    with pytest.raises(LockLost):
        await done(lost.extend())
    with pytest.raises(LockLost):
        await done(lost.release())

    # Nodes down (killed: refused at once, so what is reported does not hang on timing).
    cluster[0].kill()
    try:  # a grant despite a node down warns (once per manager and 10 s)
        degraded = await done(manager.acquire("parity:d", ttl=5.0))
        await done(degraded.release())
        cluster[1].kill()
        with pytest.raises(QuorumUnreachable):
            await done(manager.acquire("parity:e", blocking=False))
    finally:
        cluster.ensure_running()


def shape(record: logging.LogRecord) -> str:
    """What a log record says, without what varies from run to run (vote counts, which node
    was slow, milliseconds): its format string, with the lock names it mentions."""
    names = re.findall(r"'parity:\w'", record.getMessage())
    return f"{record.msg} [{', '.join(names)}]"


def collapsed(items: list[Any]) -> list[Any]:
    """``items`` without consecutive repeats: how many failed attempts a blocking acquire
    makes before it gives up depends on timing, not on the path."""
    return [item for index, item in enumerate(items) if index == 0 or items[index - 1] != item]


@pytest.fixture
def heard() -> Iterator[list[tuple[Any, ...]]]:
    """Every lock signal sent while the test runs: (signal, sender type, lock name, names of
    the arguments, error type)."""
    events: list[tuple[Any, ...]] = []
    receivers = []
    for label, signal in SIGNALS.items():

        def receive(sender: object, label: str = label, **kwargs: Any) -> None:
            error = kwargs.get("error")
            events.append(
                (
                    label,
                    type(sender).__name__,
                    kwargs["name"],
                    tuple(sorted(kwargs)),
                    type(error).__name__ if error is not None else None,
                )
            )

        signal.connect(receive, weak=False)
        receivers.append((signal, receive))
    yield events
    for signal, receive in receivers:
        signal.disconnect(receive)


def run_path(
    path: str, cluster: LocalCluster, caplog: pytest.LogCaptureFixture, heard: list[Any]
) -> tuple[list[Any], list[Any], dict[str, int]]:
    """Run the scenario through one manager; its log shapes, signals and metric counts."""
    observer = signals.SignalObserver()
    options: dict[str, Any] = {"observer": observer, "retry_delay": 0.01}
    holder = LockManager(cluster.urls)
    caplog.clear()
    heard.clear()
    before = metrics.summary()
    with caplog.at_level(logging.DEBUG, logger="django_redlock"):
        if path == "sync":
            manager = LockManager(cluster.urls, **options)
            observer.manager = manager
            asyncio.run(scenario(manager, holder, cluster))
        else:
            amanager = AsyncLockManager(cluster.urls, **options)
            sender = LockManager.sharing(amanager)  # the observer holds it weakly
            observer.manager = sender
            asyncio.run(scenario(amanager, holder, cluster))
    after = metrics.summary()
    holder.close()
    logs = collapsed(
        [
            (record.name, record.levelname, shape(record))
            for record in caplog.records
            if record.name.startswith("django_redlock")
        ]
    )
    counts = {event: after[event] - before.get(event, 0) for event in after}
    return logs, list(heard), {event: count for event, count in counts.items() if count}


def test_the_asyncio_manager_logs_signals_and_counts_as_the_sync_one(cluster3, caplog, heard):
    sync_logs, sync_signals, sync_counts = run_path("sync", cluster3, caplog, heard)
    for node in cluster3:
        with node_client(node) as client:
            client.flushall()
        node.declare_fresh()
    async_logs, async_signals, async_counts = run_path("async", cluster3, caplog, heard)

    # The scenario did reach every kind of event (a test that cannot fail proves nothing).
    said = {(level, message.split(" ", 1)[0]) for _, level, message in sync_logs}
    assert {("INFO", "acquired"), ("INFO", "released"), ("DEBUG", "extended")} <= said
    assert {("DEBUG", "attempt"), ("DEBUG", "gave"), ("WARNING", "lease")} <= said
    assert ("WARNING", "acquired") in said  # despite node errors
    assert {event[0] for event in sync_signals} == set(SIGNALS)
    assert {"acquired", "released", "extended", "lost", "contended"} <= set(sync_counts)
    assert {"quorum_unreachable", "node_error"} <= set(sync_counts)

    assert async_logs == sync_logs
    assert async_signals == sync_signals
    assert async_counts == sync_counts
