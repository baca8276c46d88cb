"""Helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Iterable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redlock.localnodes import LocalNode


class FakeClock:
    """A monotonic clock that only moves when told (redis-py's FakeLockTime idea).

    Pass the instance as ``clock=`` and ``clock.sleep`` as ``sleep=``: sleeping advances the
    clock instead of waiting, and every sleep is recorded.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.step_per_call = 0.0

    def __call__(self) -> float:
        self.now += self.step_per_call
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def node_client(node: LocalNode) -> redis.Redis:
    """A plain redis-py client to inspect or prepare one node (never retries)."""
    return redis.Redis.from_url(node.url, socket_timeout=2, retry=Retry(NoBackoff(), 0))


def queued_on_a_majority(cluster: Iterable[LocalNode], name: str, length: int) -> bool:
    """The line of lock ``name`` (prefix ``redlock:``) has ``length`` places on a majority of
    the nodes. One node alone can lag: a lease may hold a quorum without it, and a try may be
    granted there."""
    counts = []
    for node in cluster:
        with node_client(node) as client:
            counts.append(int(client.zcard(f"redlock:{name}\x00q")))
    return sum(count == length for count in counts) > len(counts) // 2
