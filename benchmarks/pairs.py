"""The acquire + release pair runners of W1, shared by the scale benchmark (W10): ours and
redis-py's ``Lock``, with the same lease length and socket timeout."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.contention import _client
from django_redlock import LockManager, LockNotAcquired

__all__ = ["NODE_TIMEOUT", "TTL", "PairRunner", "ours", "redis_py"]

NODE_TIMEOUT = 0.05
TTL = 10.0


# A pair runner takes a fresh key name and does acquire + release; returns True on success.
PairRunner = Callable[[str], bool]


def ours(urls: list[str]) -> PairRunner:
    manager = LockManager(urls, ttl=TTL, node_timeout=NODE_TIMEOUT)

    def run(name: str) -> bool:
        try:
            lease = manager.acquire(name, blocking=False)
        except LockNotAcquired:
            return False
        lease.release()
        return True

    return run


def redis_py(urls: list[str]) -> PairRunner:
    client = _client(urls[0])

    def run(name: str) -> bool:
        lock = client.lock(name, timeout=TTL)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return run
