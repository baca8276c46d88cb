"""W2 and W3: several processes, side by side, one library at a time.

Contenders (``kind``): ``django_redlock``, ``redis-py``, ``python-redis-lock``, ``pottery`` and
``minimal`` (``benchmarks/minimal_redlock.py``, the floor of the algorithm), ``floor``
(``benchmarks/floor.py``: the minimal client sending our commands, W2) and ``floor_line``
(``benchmarks/floor_line.py``: the same for our blocking acquire, waiting in line, W3). The
minimal client has no wait line, so its blocking lock tries again after a random sleep of 0
to ``MINIMAL_RETRY_DELAY`` seconds, as a typical naive Redlock client does.

- W2: 4 processes, each taking and releasing its own keys: pairs/s.
- W3: 8 processes on one key with a 1 ms critical section: critical sections/s, hand-offs/s
  (consecutive holders in different processes), wait p50/p99, Jain's fairness index over the
  processes, and lost updates of a non-atomic counter incremented in the critical section.

Every contender gets the same clients (50 ms socket timeout, no client retries).
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from benchmarks.minimal_redlock import MinimalRedlock

NODE_TIMEOUT = 0.05
TTL = 10.0
# Seconds: the longest random sleep of the minimal client between tries (random, so the
# waiters do not try in step). It sets the floor W3 compares us to: the shorter, the more the
# waiters spin on the two cores the holder needs, and the lower the minimal client's critical
# sections/s. Measured at N=5 (3 s, two runs each): 0.5 ms 629 and 448 CS/s (hand-off share
# about 0.8), 2 ms 425 and 555 (about 0.6), 10 ms 740 and 736 (about 0.3, Jain 0.98, the
# profile of the issue 25 measurement). 10 ms, still short beside the 200 ms of pottery or
# redlock-py, gives the highest floor of the three.
MINIMAL_RETRY_DELAY = 0.01


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=NODE_TIMEOUT,
        socket_connect_timeout=NODE_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )


def make_locker(kind: str, urls: list[str]) -> Callable[[str], AbstractContextManager[Any]]:
    """A factory of blocking lock context managers for one library."""
    if kind == "django_redlock":
        from django_redlock import LockManager

        manager = LockManager(urls, ttl=TTL, node_timeout=NODE_TIMEOUT)
        return lambda name: manager.lock(name, timeout=60.0)
    if kind == "redis-py":
        client = _client(urls[0])
        return lambda name: client.lock(name, timeout=TTL, blocking_timeout=60.0)
    if kind == "python-redis-lock":
        import redis_lock

        # Its wait is a BLPOP of up to its expire: a socket timeout shorter than that fails
        # the wait, not the node (a waiter's p99 is about 110 ms in W3), so its client waits
        # as long as its BLPOP does; its other commands answer in microseconds anyway.
        client = redis.Redis.from_url(
            urls[0],
            socket_timeout=TTL + 1.0,
            socket_connect_timeout=NODE_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        return lambda name: redis_lock.Lock(client, name, expire=int(TTL))
    if kind == "pottery":
        from pottery import Redlock

        masters = frozenset(_client(url) for url in urls)
        return lambda name: Redlock(
            key=name, masters=masters, auto_release_time=TTL, context_manager_timeout=60.0
        )
    if kind == "minimal":
        minimal = MinimalRedlock(urls, NODE_TIMEOUT)
        return lambda name: _minimal_lock(minimal, name)
    if kind == "floor":
        from benchmarks.floor import SameCommandsRedlock

        floor = SameCommandsRedlock(urls, NODE_TIMEOUT)
        return lambda name: _minimal_lock(floor, name)
    if kind == "floor_cluster":
        from benchmarks.floor_cluster import RoutedSameCommands

        routed = RoutedSameCommands(urls, NODE_TIMEOUT)
        return lambda name: _minimal_lock(routed, name)
    if kind == "floor_line":
        from benchmarks.floor_line import SameCommandsLine

        line = SameCommandsLine(urls, NODE_TIMEOUT)
        return lambda name: line.lock(f"redlock:{name}", int(TTL * 1000))
    raise ValueError(kind)


class _TryOnce(Protocol):
    """The minimal client and the same-commands floor (``benchmarks/floor.py``): one try."""

    def acquire(self, key: str, ttl_ms: int, /) -> Any: ...

    def release(self, held: Any, /) -> bool: ...


@contextmanager
def _minimal_lock(client: _TryOnce, name: str, timeout: float = 60.0) -> Iterator[None]:
    """A blocking lock over the minimal client (or the same-commands floor): try, sleep a
    random while, try again."""
    deadline = time.monotonic() + timeout
    # The same "redlock:" prefix as ours, so both send keys of the same length.
    while (held := client.acquire(f"redlock:{name}", int(TTL * 1000))) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"minimal Redlock: {name} not acquired in {timeout:g} s")
        time.sleep(random.uniform(0, MINIMAL_RETRY_DELAY))
    try:
        yield
    finally:
        client.release(held)


def ready(
    kind: str, locker: Callable[[str], AbstractContextManager[Any]], index: int, out: Any
) -> None:
    """One acquire + release of a key of this worker's own, then tell :func:`launch` it is
    ready: a client that connects on first use (ours) pays its connections' set-up here,
    before the clock starts, as one that connects when made (the minimal client, the floors)
    pays it before."""
    with locker(f"warm:{kind}:{index}"):
        pass
    out.put(("ready", index))


def window_end(go: Any, start: Any, seconds: float) -> float:
    """Wait for the go, then the shared deadline: the same window for every worker."""
    go.wait()
    return float(start.value) + seconds


def _w2_worker(
    index: int, go: Any, start: Any, out: Any, kind: str, urls: list[str], seconds: float
) -> None:
    locker = make_locker(kind, urls)
    ready(kind, locker, index, out)
    deadline = window_end(go, start, seconds)
    pairs = 0
    while time.monotonic() < deadline:
        with locker(f"w2:{kind}:{index}:{pairs}"):
            pass
        pairs += 1
    out.put(pairs)


def _w3_worker(
    index: int,
    go: Any,
    start: Any,
    out: Any,
    kind: str,
    urls: list[str],
    seconds: float,
    counter: Any,
) -> None:
    locker = make_locker(kind, urls)
    ready(kind, locker, index, out)
    deadline = window_end(go, start, seconds)
    waits: list[float] = []
    order: list[int] = []
    while time.monotonic() < deadline:
        asked = time.perf_counter()
        # One key per contender: pottery also prefixes "redlock:", and a key left by one
        # contender must not meet the next one.
        with locker(f"w3:{kind}:shared"):
            waits.append(time.perf_counter() - asked)
            value = counter.value  # a non-atomic read-modify-write: lost updates show here
            busy_until = time.perf_counter() + 0.001  # the 1 ms critical section
            while time.perf_counter() < busy_until:
                pass
            counter.value = value + 1
            order.append(value)
    out.put((index, waits, order))


@dataclass
class W3Result:
    label: str
    sections: int
    per_second: float
    handoffs_per_second: float
    handoff_share: float
    wait_p50_ms: float
    wait_p99_ms: float
    fairness: float
    lost_updates: int


def median_w3(results: list[W3Result]) -> W3Result:
    """Each figure the median of its own over several runs; lost updates the total."""

    def median(attribute: str) -> Any:
        return statistics.median(getattr(result, attribute) for result in results)

    return W3Result(
        label=results[0].label,
        sections=int(median("sections")),
        per_second=median("per_second"),
        handoffs_per_second=median("handoffs_per_second"),
        handoff_share=median("handoff_share"),
        wait_p50_ms=median("wait_p50_ms"),
        wait_p99_ms=median("wait_p99_ms"),
        fairness=median("fairness"),
        lost_updates=sum(result.lost_updates for result in results),
    )


def launch(
    target: Callable[..., None],
    args: tuple[Any, ...],
    processes: int,
    at_start: Callable[[], object] | None = None,
) -> list[Any]:
    """Run ``target(index, go, start, out, *args)`` in ``processes`` spawned workers (this
    module's workers, and ``benchmarks/w3_budget.py``'s): each reports ``("ready", index)``
    once its client is made and warmed up; the clock starts when all have, and every worker
    stops at the same deadline (``start.value`` + its seconds). What each worker puts in
    ``out`` afterwards is returned, in no particular order. ``at_start`` is called just
    before the clock starts.

    A fixed sleep before the start was not enough: 8 workers importing and connecting on 2
    cores were still starting 1.4 to 2.1 s later, inside the window of the others, and each
    rate was divided by a window 10 to 28 % shorter than it ran (found by a review)."""
    context = multiprocessing.get_context("spawn")
    go, out = context.Event(), context.Queue()
    start = context.Value("d", 0.0, lock=False)
    workers = [
        context.Process(target=target, args=(index, go, start, out, *args))
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    ready = _collect(out, workers, 120.0)
    assert all(message[0] == "ready" for message in ready), ready
    if at_start is not None:
        at_start()
    start.value = time.monotonic()  # machine-wide on Linux: the workers' clock too
    go.set()
    results = _collect(out, workers, 180.0)
    for worker in workers:
        worker.join(60)
    return results


def _collect(out: Any, workers: list[Any], timeout: float) -> list[Any]:
    """One message from each worker within ``timeout`` seconds; RuntimeError at once when a
    worker died (its traceback is on stderr) instead of waiting out the timeout."""
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(messages) < len(workers):
        try:
            messages.append(out.get(timeout=0.5))
        except queue.Empty:
            dead = [worker.name for worker in workers if worker.exitcode not in (None, 0)]
            if dead:
                for worker in workers:
                    worker.kill()
                raise RuntimeError(f"benchmark workers died: {', '.join(dead)}") from None
            if time.monotonic() > deadline:
                raise
    return messages


def run_w2(kind: str, urls: list[str], seconds: float, processes: int = 4) -> float:
    total: int = sum(launch(_w2_worker, (kind, urls, seconds), processes))
    return total / seconds


def run_w3(kind: str, urls: list[str], seconds: float, processes: int = 8) -> W3Result:
    counter = multiprocessing.get_context("spawn").Value("q", 0, lock=False)
    results = launch(_w3_worker, (kind, urls, seconds, counter), processes)
    counts = [len(order) for _, _, order in results]
    sections = sum(counts)
    holder_by_value = {value: index for index, _, order in results for value in order}
    sequence = [holder_by_value[value] for value in sorted(holder_by_value)]
    handoffs = sum(1 for a, b in itertools.pairwise(sequence) if a != b)
    waits = sorted(wait for _, process_waits, _ in results for wait in process_waits)
    fairness = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)) if sections else 0.0
    return W3Result(
        label=kind,
        sections=sections,
        per_second=sections / seconds,
        handoffs_per_second=handoffs / seconds,
        handoff_share=handoffs / max(1, sections - 1),
        wait_p50_ms=statistics.median(waits) * 1000 if waits else 0.0,
        wait_p99_ms=waits[min(len(waits) - 1, int(0.99 * len(waits)))] * 1000 if waits else 0.0,
        fairness=fairness,
        lost_updates=sections - int(counter.value),
    )
