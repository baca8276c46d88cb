"""W8: the garbage collector's pause in a process holding many leases (issue 28, item 4).

``python -m benchmarks.gc_pause [N] [--async] [--auto-extend]`` starts 3 nodes, takes N leases
(default 50,000) on distinct names and holds them, then prints the objects the collector tracks and
the references it visits per lease (exact), and the time of a full collection
(``gc.collect()``) before and while holding them, of 21 in a row: the median and the minimum,
on the wall clock and in this thread's CPU time (the minimum and CPU time move least on a
shared machine). The growth (held minus none held, CPU medians) is what the leases add. It also
reports the longest automatic full collection while the leases were taken, and then the same
figures for as many of redis-py's ``Lock`` held on one node (the reference: what a process
holding that many locks pays with the lock users would pick instead), with the ratio; and the
pure-Python floor: N of the cheapest lease Python can hold (``gc_model.FloorLease``: one
``__slots__`` object, its strings and floats in a tuple the collector untracks, no registry),
then 2N of them (two tracked objects per lease, as ours had before the re-entry registry's
weak references were untracked), timed the same way, with ours over each.

On a shared machine the collector's speed drifts by several times over seconds (other tenants'
memory traffic), so a "before" timed seconds before the "after" can put any growth on either
side of zero. Each growth is therefore also measured *paired*: a twin of this process is
forked just before the leases (or locks, or floor objects) are taken, holding everything but
them, and the twin and this process then run full collections in strict alternation (41
pairs, each the twin's then ours, a few ms apart); the paired growth is the median of the
per-pair differences (ours minus the twin's, CPU ms). The ratios are of paired growths.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import struct
import sys
import time
import warnings
from typing import Any

import redis

from benchmarks.gc_model import floor_leases
from django_redlock import Lease, LockManager
from django_redlock.aredlock import AsyncLease, AsyncLockManager
from django_redlock.localnodes import LocalCluster

TTL = 300.0  # the leases must outlive the run
# Auto-extended leases are first renewed after a third of their ttl: long enough that the
# extender renews none while the run takes and times them on a loaded machine.
AUTO_TTL = 3600.0


def _census() -> tuple[int, int]:
    """Objects the collector tracks, and the references it visits in them."""
    tracked = gc.get_objects()
    return len(tracked), sum(len(gc.get_referents(obj)) for obj in tracked)


class _Collections:
    """``repeat`` full collections in a row, timed in ms: on the wall clock and in this
    thread's CPU time, the median and the fastest of each."""

    def __init__(self, repeat: int = 21) -> None:
        wall, cpu = [], []
        for _ in range(repeat):
            start, start_cpu = time.perf_counter(), time.thread_time()
            gc.collect()
            wall.append((time.perf_counter() - start) * 1000)
            cpu.append((time.thread_time() - start_cpu) * 1000)
        self.wall, self.cpu = statistics.median(wall), statistics.median(cpu)
        self.fastest_wall, self.fastest_cpu = min(wall), min(cpu)

    def __str__(self) -> str:
        return (
            f"median {self.wall:.2f} ms wall, {self.cpu:.2f} ms CPU "
            f"(fastest {self.fastest_wall:.2f}, {self.fastest_cpu:.2f})"
        )


class _Twin:
    """A forked copy of this process as it is at construction, which runs one full
    collection each time it is asked and answers with its CPU time in ms; what this process
    takes afterwards (the leases) it does not hold. Its collections and ours alternate
    strictly (see :func:`_paired`), so both see the machine as it is at that moment."""

    def __init__(self) -> None:
        gc.collect()
        self._ask_read, self._ask = os.pipe()
        self._answer, self._answer_write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # the twin: collects when asked, never returns
            code = 1
            try:
                os.close(self._ask)
                os.close(self._answer)
                while os.read(self._ask_read, 1) == b"c":
                    start = time.thread_time()
                    gc.collect()
                    spent = (time.thread_time() - start) * 1000
                    os.write(self._answer_write, struct.pack("d", spent))
                code = 0
            finally:
                os._exit(code)  # nothing of the parent's (its nodes, its atexit) is ours
        self.pid = pid
        os.close(self._ask_read)
        os.close(self._answer_write)

    def collect(self) -> float:
        """The twin's CPU ms for one full collection, run now."""
        os.write(self._ask, b"c")
        return float(struct.unpack("d", os.read(self._answer, 8))[0])

    def close(self) -> None:
        os.write(self._ask, b"q")
        os.close(self._ask)
        os.close(self._answer)
        os.waitpid(self.pid, 0)


class _Paired:
    """``repeat`` pairs of full collections, the twin's then ours, CPU ms: the medians of
    each side and of the per-pair differences (ours minus the twin's: the paired growth)."""

    def __init__(self, twin: _Twin, repeat: int = 41) -> None:
        for _ in range(3):  # the twin's first collections copy its pages (copy-on-write)
            twin.collect()
            gc.collect()
        ours, theirs = [], []
        for _ in range(repeat):
            theirs.append(twin.collect())
            start = time.thread_time()
            gc.collect()
            ours.append((time.thread_time() - start) * 1000)
        self.repeat = repeat
        self.ours, self.twin = statistics.median(ours), statistics.median(theirs)
        self.growth = statistics.median(a - b for a, b in zip(ours, theirs, strict=True))

    def __str__(self) -> str:
        return (
            f"paired growth {self.growth:.2f} ms CPU (median of {self.repeat} pairs; "
            f"medians: held {self.ours:.2f}, twin {self.twin:.2f})"
        )


def _reference(url: str, count: int) -> tuple[float, float, float]:
    """redis-py's ``Lock``, ``count`` of them held on the node at ``url``: objects tracked
    and references visited per lock, and the CPU ms a full collection gains while they are
    held (paired with a twin holding none: see :class:`_Paired`)."""
    client = redis.Redis.from_url(url)
    gc.collect()
    objects, references = _census()
    twin = _Twin()
    locks = []
    for i in range(count):
        lock = client.lock(f"w8-ref-{i}", timeout=TTL)
        lock.acquire(blocking=False)
        locks.append(lock)
    gc.collect()
    held_objects, held_references = _census()
    paired = _Paired(twin)
    twin.close()
    for lock in locks:
        lock.release()
    client.close()
    return (
        (held_objects - objects) / count,
        (held_references - references) / count,
        paired.growth,
    )


def _floor(count: int) -> tuple[float, float, float]:
    """``count`` ``FloorLease`` objects held (in one list, as the leases are): objects
    tracked and references visited per object, and the CPU ms a full collection gains while
    they are held (paired with a twin holding none: see :class:`_Paired`)."""
    gc.collect()
    objects, references = _census()
    twin = _Twin()
    held = floor_leases(count)
    gc.collect()
    gc.collect()  # the tuples are untracked by the collection after the one that sees them
    held_objects, held_references = _census()
    paired = _Paired(twin)
    twin.close()
    del held
    return (
        (held_objects - objects) / count,
        (held_references - references) / count,
        paired.growth,
    )


class _Pauses:
    """The automatic full collections (generation 2) and how long each took, in ms."""

    def __init__(self) -> None:
        self.full: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif info["generation"] == 2:
            self.full.append((time.perf_counter() - self._start) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gc_pause")
    parser.add_argument("count", nargs="?", type=int, default=50_000)
    parser.add_argument("--async", dest="asyncio", action="store_true")
    parser.add_argument(
        "--auto-extend", action="store_true", help="hold auto-extended leases (guard, renewal)"
    )
    args = parser.parse_args()
    count: int = args.count
    with LocalCluster(3) as cluster:
        ttl = AUTO_TTL if args.auto_extend else TTL
        manager = LockManager(cluster.urls, ttl=ttl, max_ttl=ttl, node_timeout=0.2)
        auto: bool = args.auto_extend
        manager.acquire("warm-up").release()
        gc.collect()
        objects, references = _census()
        idle = _Collections()
        twin = _Twin()  # holds none of the leases (see _Paired)
        pauses = _Pauses()
        gc.callbacks.append(pauses)
        runner = asyncio.Runner()
        shared = AsyncLockManager.sharing(manager)
        sync_leases: list[Lease] = []
        async_leases: list[AsyncLease] = []

        async def take() -> None:
            for i in range(count):
                async_leases.append(
                    await shared.acquire(f"w8-{i}", blocking=False, auto_extend=auto)
                )

        try:
            if args.asyncio:
                runner.run(take())
            else:
                sync_leases = [
                    manager.acquire(f"w8-{i}", blocking=False, auto_extend=auto)
                    for i in range(count)
                ]
        finally:
            gc.callbacks.remove(pauses)
        gc.collect()
        held_objects, held_references = _census()
        holding = _Collections()
        paired = _Paired(twin)
        twin.close()
        kind = ("asyncio" if args.asyncio else "sync") + (" auto-extended" if auto else "")
        print(f"Python {sys.version.split()[0]}, {count} held {kind} leases on 3 nodes")
        print(
            f"per lease: {(held_objects - objects) / count:.2f} objects tracked, "
            f"{(held_references - references) / count:.2f} references visited"
        )
        print(f"full collection, no lease held: {idle}")
        print(f"full collection, leases held:   {holding}")
        print(
            f"growth: {holding.cpu - idle.cpu:.2f} ms CPU, {holding.wall - idle.wall:.2f} ms "
            "wall (medians)"
        )
        print(f"against a twin holding none, collections alternating: {paired}")
        print(
            f"automatic full collections while taking them: {len(pauses.full)}, longest "
            f"{max(pauses.full, default=0.0):.2f} ms wall"
        )

        async def release_all() -> None:
            for lease in async_leases:
                await lease.release()

        runner.run(release_all())
        runner.close()
        for held in sync_leases:
            held.release()
        sync_leases.clear()
        async_leases.clear()
        print(f"unreachable objects found after the release: {gc.collect()}")
        # Paired growths from here on (see _Paired): each side's twin forked just before.
        ours = paired.growth
        objects_each, references_each, theirs = _reference(cluster.urls[0], count)
        print(
            f"redis-py Lock, {count} held on 1 node: {objects_each:.2f} objects tracked, "
            f"{references_each:.2f} references visited per lock; a full collection gains "
            f"{theirs:.2f} ms CPU, paired (ours: {ours:.2f} ms, {_times(ours, theirs)})"
        )
        for per_lease, what in ((1, "one per lease"), (2, "two per lease")):
            objects_each, references_each, floor = _floor(per_lease * count)
            print(
                f"floor, {per_lease * count} FloorLease held ({what}): {objects_each:.2f} "
                f"objects tracked, {references_each:.2f} references visited per object; a full "
                f"collection gains {floor:.2f} ms CPU, paired (ours: {ours:.2f} ms, "
                f"{_times(ours, floor)})"
            )


def _times(ours: float, other: float) -> str:
    return f"{ours / other:.2f}x" if other > 0 else "no growth measured"


if __name__ == "__main__":
    main()
