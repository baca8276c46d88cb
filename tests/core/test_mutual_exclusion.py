"""Mutual exclusion across processes: a non-atomic counter under the lock loses nothing."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from django_redlock import LockManager

WORKERS = 8
ROUNDS = 25


def _worker(urls: list[str], counter: str, rounds: int, ready, go) -> None:
    manager = LockManager(urls, retry_delay=0.002)
    path = Path(counter)
    ready.put(True)
    go.wait()
    for _ in range(rounds):
        with manager.lock("counter", ttl=10.0, timeout=60.0):
            value = int(path.read_text())  # read ...
            path.write_text(str(value + 1))  # ... and write back: lost updates show here


def test_no_lost_updates_across_eight_processes(cluster5, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    go = context.Event()
    workers = [
        context.Process(target=_worker, args=(cluster5.urls, str(counter), ROUNDS, ready, go))
        for _ in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    go.set()  # all start together, so they really contend
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert int(counter.read_text()) == WORKERS * ROUNDS
