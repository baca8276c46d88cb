"""W7: how often a healthy node misses ``NODE_TIMEOUT`` when the machine is busy (issue 40, item 6).

A new user's site: 4 worker processes of 8 threads (gunicorn ``--workers 4 --threads 8``), each
request locking its own object (a name drawn from a million: no contention), holding it 1 ms, on
three healthy local nodes, all on one 2-core machine. The question is what a node timeout of
20, 50, 100 or 200 ms costs: how many commands a node did not answer in time (a failed vote),
and how many acquires failed for it (a view's 503). Nothing else runs; the load is the site's
own (32 threads and 3 servers on 2 cores).

    python -m benchmarks.node_timeout [--seconds 5] [--timeouts 0.02,0.05,0.1,0.2]

Each line: the node timeout, acquires done, acquires failed (not for contention: a quorum did
not answer in time), node commands that timed out per 10,000, and the acquire's p50/p99 in ms.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import threading
import time
from typing import TYPE_CHECKING

PROCESSES = 4
THREADS = 8
NAMES = 1_000_000  # so that two requests almost never want the same object

if TYPE_CHECKING:
    _Out = multiprocessing.Queue[tuple[list[float], int, int, int]]


def _worker(urls: list[str], node_timeout: float, until: float, out: _Out) -> None:
    import logging

    from django_redlock import LockContended, LockManager, LockNotAcquired

    logging.getLogger("django_redlock").setLevel(logging.CRITICAL)
    manager = LockManager(urls, ttl=10.0, node_timeout=node_timeout)
    latencies: list[float] = []
    # acquires failed for want of answers (not contended), node commands, those that timed out
    counts = [0, 0, 0]
    lock = threading.Lock()

    def loop() -> None:
        rng = random.Random()
        while time.monotonic() < until:
            name = f"order:{rng.randrange(NAMES)}"
            start = time.monotonic()
            try:
                lease = manager.acquire(name, blocking=False)
            except LockNotAcquired as error:
                late = sum(1 for text in error.node_errors.values() if "no answer within" in text)
                with lock:
                    counts[0] += not isinstance(error, LockContended)
                    counts[1] += len(urls)
                    counts[2] += late
                continue
            took = time.monotonic() - start
            time.sleep(0.001)
            lease.release()
            with lock:
                latencies.append(took)
                counts[1] += len(urls)

    workers = [threading.Thread(target=loop) for _ in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put((latencies, counts[0], counts[1], counts[2]))


def run(urls: list[str], node_timeout: float, seconds: float) -> dict[str, float]:
    """One measurement: ``PROCESSES`` x ``THREADS`` clients for ``seconds``."""
    context = multiprocessing.get_context("fork")
    out: _Out = context.Queue()
    until = time.monotonic() + seconds
    workers = [
        context.Process(target=_worker, args=(urls, node_timeout, until, out))
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    latencies: list[float] = []
    failed = commands = late = 0
    for _ in workers:
        got, f, c, t = out.get(timeout=seconds + 60)
        latencies += got
        failed += f
        commands += c
        late += t
    for worker in workers:
        worker.join()
    latencies.sort()
    return {
        "node_timeout_ms": node_timeout * 1000,
        "acquires": len(latencies) + failed,
        "failed": failed,
        "late_per_10k": 10_000 * late / max(1, commands),
        "p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else 0.0,
    }


def main() -> None:
    from django_redlock.localnodes import LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--timeouts", default="0.02,0.05,0.1,0.2")
    args = parser.parse_args()
    print(f"W7: {PROCESSES} processes x {THREADS} threads, own names, 3 local nodes")
    columns = ("timeout", "acquires", "failed", "late/10k", "p50 ms", "p99 ms")
    print(
        " ".join(
            f"{name:>{width}}" for name, width in zip(columns, (8, 9, 7, 9, 7, 7), strict=True)
        )
    )
    with LocalCluster(3) as cluster:
        for text in args.timeouts.split(","):
            row = run(cluster.urls, float(text), args.seconds)
            print(
                f"{row['node_timeout_ms']:>6.0f}ms {row['acquires']:>9.0f} {row['failed']:>7.0f}"
                f" {row['late_per_10k']:>9.2f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f}"
            )


if __name__ == "__main__":
    main()
