"""The acquire + release pair runners of W1, shared by the scale benchmark (W10) and the cost
of each node (``benchmarks/per_node.py``): ours, redis-py's ``Lock``, the minimal Redlock and
the same-commands floor, with the same lease length and socket timeout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from benchmarks.contention import _client
from django_redlock import LockManager, LockNotAcquired

__all__ = ["NODE_TIMEOUT", "TTL", "PairRunner", "minimal", "ours", "redis_py", "same_commands"]

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


class _RedlockClient(Protocol):
    """The minimal Redlock's shape, which the same-commands floor shares."""

    def acquire(self, key: str, ttl_ms: int, /) -> Any: ...

    def release(self, held: Any, /) -> bool: ...


def _redlock_pairs(client: _RedlockClient) -> PairRunner:
    ttl_ms = int(TTL * 1000)

    def run(name: str) -> bool:
        # The same "redlock:" prefix as ours, so both send keys of the same length.
        held = client.acquire(f"redlock:{name}", ttl_ms)
        if held is None:
            return False
        return client.release(held)

    return run


def minimal(urls: list[str]) -> PairRunner:
    from benchmarks.minimal_redlock import MinimalRedlock

    return _redlock_pairs(MinimalRedlock(urls, NODE_TIMEOUT))


def same_commands(urls: list[str]) -> PairRunner:
    from benchmarks.floor import SameCommandsRedlock

    return _redlock_pairs(SameCommandsRedlock(urls, NODE_TIMEOUT))
