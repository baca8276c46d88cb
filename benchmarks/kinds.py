"""W6 and W7: the locks beyond a mutex, against a mutex doing the same work, in one run.

- W6 (read-mostly): 8 processes on one name; each operation is a read (9 in 10, chosen by
  a seeded generator, the same sequence for both contenders) or a write, each holding for
  5 ms (asleep, as an I/O wait). Contenders: django_redlock's read-write lock (reads
  share, writes exclude) and django_redlock's lock (every operation exclusive, as a user
  without a read-write lock would do). Operations/s, the most holders seen inside at once,
  and whether a write ever overlapped anything (it must not).
- W7 (semaphore): 8 processes, a semaphore of 3 slots, 5 ms inside (asleep): operations/s
  and the most holders seen inside at once (must be <= 3), against the same work under a
  lock (limit 1).

Inside-counts are kept in shared memory under a process lock, so they measure what the
locks allowed, not what the bookkeeping serialised (it is held for a few µs, never for the
5 ms of work).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.contention import launch, ready, window_end

NODE_TIMEOUT = 0.05
TTL = 10.0
HOLD = 0.005  # seconds inside, asleep: an I/O wait (a query, an API call), as in real use
READ_SHARE = 0.9
LIMIT = 3


def _enter(state: Any, writer: bool) -> None:
    with state.get_lock():
        inside = state[0] + 1
        state[0] = inside
        if writer:
            state[2] += 1
            if inside > 1:
                state[3] += 1  # a write overlapped something: must never happen
        elif state[2] > 0:
            state[3] += 1  # a read overlapped a write: must never happen
        state[1] = max(state[1], inside)


def _leave(state: Any, writer: bool) -> None:
    with state.get_lock():
        state[0] -= 1
        if writer:
            state[2] -= 1


def _worker(
    index: int,
    go: Any,
    start: Any,
    out: Any,
    kind: str,
    urls: list[str],
    seconds: float,
    state: Any,
) -> None:
    from django_redlock import LockManager

    manager = LockManager(urls, ttl=TTL, node_timeout=NODE_TIMEOUT)
    chooser = random.Random(index)  # a workload mix, not a secret
    name = f"kinds:{kind}"
    # Connect and load the scripts on a name of this worker's own before the clock starts
    # (contention.launch starts it once every worker is ready: a fixed sleep was not enough).
    ready(f"kinds:{kind}", manager.lock, index, out)
    deadline = window_end(go, start, seconds)
    done = 0
    while time.monotonic() < deadline:
        writer = chooser.random() >= READ_SHARE
        if kind == "rwlock":
            rw = manager.rwlock(name)
            lease = rw.write(timeout=60.0) if writer else rw.read(timeout=60.0)
        elif kind == "semaphore":
            writer = False
            lease = manager.semaphore(name, LIMIT).acquire(timeout=60.0)
        else:  # "lock" (for W6) and "lock-sem" (W7's anchor): everything exclusive
            writer = kind == "lock" and writer
            lease = manager.acquire(name, timeout=60.0)
        with lease:
            _enter(state, writer)
            time.sleep(HOLD)
            _leave(state, writer)
        done += 1
    out.put(done)


@dataclass
class KindResult:
    label: str
    per_second: float
    most_inside: int
    overlaps: int


def run(kind: str, urls: list[str], seconds: float, processes: int = 8) -> KindResult:
    # inside now, most inside, writers inside, overlaps of a write
    state = multiprocessing.get_context("spawn").Array("q", 4)
    total = sum(launch(_worker, (kind, urls, seconds, state), processes))
    return KindResult(kind, total / seconds, int(state[1]), int(state[3]))
