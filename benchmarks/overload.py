"""W5: hand-off latency under overload, django_redlock only.

300 waiters (10 processes of 30 threads) loop on one lock with a short ``retry_delay``
(10 ms), each holding it for 1 ms. Every waiter polls the nodes between wake-ups, so the nodes
are saturated by retries; the question is whether a release still gets through and the next
waiter takes over promptly, or whether hand-offs wait for the lease to expire (the ttl).

Hand-off latency is the time from a holder starting its release to the next holder having
the lock, across processes (``time.monotonic`` is one system-wide clock on Linux).
"""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

NODE_TIMEOUT = 0.05
TTL = 10.0


# What each worker process reports: (acquired, release started) per critical section, and
# how many releases raised.
if TYPE_CHECKING:
    _Out = multiprocessing.Queue[tuple[list[tuple[float, float]], int]]


@dataclass
class W5Result:
    critical_sections: int
    handoff_p50_ms: float
    handoff_p99_ms: float
    handoff_max_ms: float
    slow_handoffs: int  # hand-offs that took more than half the ttl: a lease ran out
    release_errors: int


def _worker(urls: list[str], threads: int, retry_delay: float, until: float, out: _Out) -> None:
    import logging

    from django_redlock import LockManager, LockNotAcquired

    # Overloaded nodes make every release a "did not answer" warning: keep the table readable.
    logging.getLogger("django_redlock").setLevel(logging.ERROR)
    manager = LockManager(urls, ttl=TTL, node_timeout=NODE_TIMEOUT, retry_delay=retry_delay)
    spans: list[tuple[float, float]] = []
    errors = [0]
    lock = threading.Lock()

    def loop() -> None:
        while time.monotonic() < until:
            try:
                lease = manager.acquire("w5", timeout=max(0.0, until - time.monotonic()))
            except LockNotAcquired:
                continue
            acquired = time.monotonic()
            time.sleep(0.001)
            released = time.monotonic()
            try:
                lease.release()
            except Exception:
                with lock:
                    errors[0] += 1
            with lock:
                spans.append((acquired, released))

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put((spans, errors[0]))


def run_w5(
    urls: list[str],
    seconds: float,
    *,
    processes: int = 10,
    threads: int = 30,
    retry_delay: float = 0.01,
) -> W5Result:
    context = multiprocessing.get_context("fork")
    out: _Out = context.Queue()
    until = time.monotonic() + seconds
    workers = [
        context.Process(target=_worker, args=(urls, threads, retry_delay, until, out))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    spans: list[tuple[float, float]] = []
    errors = 0
    for _ in workers:
        got, failed = out.get(timeout=seconds + TTL + 60)
        spans += got
        errors += failed
    for worker in workers:
        worker.join()
    spans.sort()
    handoffs = [(nxt[0] - prev[1]) * 1000 for prev, nxt in itertools.pairwise(spans)] or [0.0]
    ordered = sorted(handoffs)
    return W5Result(
        critical_sections=len(spans),
        handoff_p50_ms=statistics.median(ordered),
        handoff_p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        handoff_max_ms=ordered[-1],
        slow_handoffs=sum(1 for ms in handoffs if ms > TTL * 1000 / 2),
        release_errors=errors,
    )
