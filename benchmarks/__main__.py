"""Side-by-side benchmarks: ``./run bench`` (or ``python -m benchmarks``).

Starts its own nodes, then runs every contender in one process, interleaved in rounds so that
machine noise hits them alike, and prints a table plus ratios against the anchors measured in
the same run:

- W1: one client, acquire + release of fresh keys; p50/p99 µs per pair.
  Contenders: django_redlock N=3 and N=5, redis-py ``Lock`` (1 node), pottery ``Redlock``
  N=3 and N=5, and two references that send the same commands to 5 nodes
  (``benchmarks/references.py``): raw sockets with one ``poll()`` loop, and redis-py
  ``Connection`` objects written to all, then read.
- W1i: the client's instructions per W1 pair, counted by valgrind (``benchmarks/instructions.py``):
  the measure that does not move with the machine's load, for changes to the hot path.
- W4: 5 nodes with 2 paused by SIGSTOP; success rate, p50/p99 acquire latency, and the
  process's threads and open sockets before and after. Contenders: django_redlock and pottery
  (redis-py's ``Lock`` has one node, so "2 of 5 paused" does not apply to it).

- W6: read-mostly (9 reads in 10, 5 ms of I/O wait each), 8 processes on one name: the
  read-write lock against a lock doing the same work; W7: a semaphore of 3 slots against a
  lock, 8 processes, 5 ms inside (``benchmarks/kinds.py``).

- W5: 300 waiters (10 processes x 30 threads) on one lock with a 10 ms ``retry_delay``:
  hand-off latency p50/p99/max, and hand-offs slower than half the ttl (a lease that ran out
  because its release did not get through). django_redlock only (``benchmarks/overload.py``).

Every contender gets clients with the same 50 ms socket timeout and no client retries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.contention import _client
from benchmarks.references import raw_sockets, redis_py_connections
from django_redlock import LockManager, LockNotAcquired
from django_redlock.localnodes import LocalCluster, server_version

NODE_TIMEOUT = 0.05
TTL = 10.0


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


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


def pottery_redlock(urls: list[str]) -> PairRunner:
    from pottery import Redlock

    masters = frozenset(_client(url) for url in urls)

    def run(name: str) -> bool:
        lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return run


@dataclass
class Result:
    label: str
    pair_us: list[float] = field(default_factory=list)
    acquire_us: list[float] = field(default_factory=list)
    successes: int = 0
    attempts: int = 0


def _measure(result: Result, run: PairRunner, count: int, tag: str) -> None:
    # Each contender gets its own key names: pottery, for one, prefixes "redlock:" too, and
    # its leftover string keys would collide with ours.
    label = "".join(char for char in result.label if char.isalnum())
    for index in range(count):
        start = time.perf_counter()
        ok = run(f"bench:{label}:{tag}:{index}")
        result.pair_us.append((time.perf_counter() - start) * 1e6)
        result.attempts += 1
        result.successes += ok


def w1(cluster3: LocalCluster, cluster5: LocalCluster, pairs: int, rounds: int) -> None:
    contenders: list[tuple[str, PairRunner]] = [
        ("django_redlock N=5", ours(cluster5.urls)),
        ("django_redlock N=3", ours(cluster3.urls)),
        ("redis-py Lock (1 node)", redis_py(cluster5.urls)),
        ("raw sockets + poll N=5", raw_sockets(cluster5.urls)),
        ("redis-py Connection N=5", redis_py_connections(cluster5.urls)),
        ("pottery Redlock N=5", pottery_redlock(cluster5.urls)),
        ("pottery Redlock N=3", pottery_redlock(cluster3.urls)),
    ]
    results = {label: Result(label) for label, _ in contenders}
    for label, run in contenders:  # warm up connections and script caches
        _measure(Result(label), run, 50, "warm")
    per_round = max(1, pairs // rounds)
    for round_index in range(rounds):
        # Rotate the order every round so no contender always runs first or last.
        order = (
            contenders[round_index % len(contenders) :]
            + contenders[: round_index % len(contenders)]
        )
        for label, run in order:
            slow = label.startswith("pottery")
            _measure(results[label], run, per_round // 4 if slow else per_round, f"{round_index}")

    async_pair_us = _w1_async(cluster5.urls, max(1000, pairs // 2))

    print(
        f"\nW1: one client, acquire + release of fresh keys ({pairs} pairs each, {rounds} rounds)"
    )
    print(f"{'contender':28} {'p50 µs':>9} {'p99 µs':>9} {'pairs/s':>9} {'ok':>6}")
    for label, _ in contenders:
        result = results[label]
        p50 = statistics.median(result.pair_us)
        print(
            f"{label:28} {p50:9.0f} {_percentile(result.pair_us, 0.99):9.0f} "
            f"{1e6 / statistics.mean(result.pair_us):9.0f} "
            f"{result.successes / result.attempts:6.1%}"
        )
    print(
        f"{'django_redlock async N=5':28} {statistics.median(async_pair_us):9.0f} "
        f"{_percentile(async_pair_us, 0.99):9.0f} {1e6 / statistics.mean(async_pair_us):9.0f} "
        f"{1.0:6.1%}"
    )
    ours5 = statistics.median(results["django_redlock N=5"].pair_us)
    ours3 = statistics.median(results["django_redlock N=3"].pair_us)
    anchor = statistics.median(results["redis-py Lock (1 node)"].pair_us)
    pottery5 = statistics.median(results["pottery Redlock N=5"].pair_us)
    pottery3 = statistics.median(results["pottery Redlock N=3"].pair_us)
    print("ratios (p50, same run):")
    print(f"  django_redlock N=5 / redis-py Lock 1 node = {ours5 / anchor:.2f}x  (target <= 0.90x)")
    print(f"  django_redlock N=3 / redis-py Lock 1 node = {ours3 / anchor:.2f}x")
    raw = statistics.median(results["raw sockets + poll N=5"].pair_us)
    connections = statistics.median(results["redis-py Connection N=5"].pair_us)
    print(f"  django_redlock N=5 / raw sockets N=5      = {ours5 / raw:.2f}x  (target <= 1.10x)")
    print(f"  django_redlock N=5 / redis-py Connection  = {ours5 / connections:.2f}x")
    print(f"  pottery N=5 / django_redlock N=5          = {pottery5 / ours5:.1f}x  (target >= 12x)")
    print(f"  pottery N=3 / django_redlock N=3          = {pottery3 / ours3:.1f}x")


def _w1_async(urls: list[str], count: int) -> list[float]:
    """W1 for the asyncio core: one task, acquire + release of fresh keys."""
    import asyncio

    from django_redlock.aredlock import AsyncLockManager

    async def main() -> list[float]:
        manager = AsyncLockManager(urls, ttl=TTL, node_timeout=NODE_TIMEOUT)
        samples = []
        for index in range(count + 50):
            start = time.perf_counter()
            lease = await manager.acquire(f"bench:async:{index}", blocking=False)
            await lease.release()
            if index >= 50:  # the first pairs warm up connections and script caches
                samples.append((time.perf_counter() - start) * 1e6)
        await manager.aclose()
        return samples

    return asyncio.run(main())


def w4(cluster5: LocalCluster, count: int) -> None:
    print(f"\nW4: 5 nodes, 2 paused by SIGSTOP; {count} acquire + release pairs each")
    print(
        f"{'contender':28} {'success':>8} {'acq p50 µs':>11} {'acq p99 µs':>11} "
        f"{'threads':>9} {'sockets':>9}"
    )
    for label, factory in (
        ("django_redlock N=5", _w4_ours),
        ("pottery Redlock N=5", _w4_pottery),
    ):
        acquire, release = factory(cluster5.urls)
        acquire("warm")  # connect to every node while all are up
        release()
        threads_before, sockets_before = threading.active_count(), _open_sockets()
        cluster5[0].pause()
        cluster5[1].pause()
        result = Result(label)
        try:
            for index in range(count):
                start = time.perf_counter()
                ok = acquire(f"bench:w4:{label}:{index}")
                result.acquire_us.append((time.perf_counter() - start) * 1e6)
                result.attempts += 1
                if ok:
                    result.successes += 1
                    release()
        finally:
            cluster5[0].resume()
            cluster5[1].resume()
        threads_after, sockets_after = threading.active_count(), _open_sockets()
        print(
            f"{label:28} {result.successes / result.attempts:8.1%} "
            f"{statistics.median(result.acquire_us):11.0f} "
            f"{_percentile(result.acquire_us, 0.99):11.0f} "
            f"{threads_before:>4}->{threads_after:<4} {sockets_before:>4}->{sockets_after:<4}"
        )
    print(
        "  targets for django_redlock: 100% success, p99 <= 1000 µs, no growth of threads/sockets"
    )


def _w4_ours(urls: list[str]) -> tuple[Callable[[str], bool], Callable[[], None]]:
    manager = LockManager(urls, ttl=TTL, node_timeout=NODE_TIMEOUT)
    held: list[object] = []

    def acquire(name: str) -> bool:
        try:
            held.append(manager.acquire(name, blocking=False))
        except LockNotAcquired:
            return False
        return True

    def release() -> None:
        held.pop().release()  # type: ignore[attr-defined]

    return acquire, release


def _w4_pottery(urls: list[str]) -> tuple[Callable[[str], bool], Callable[[], None]]:
    from pottery import Redlock

    masters = frozenset(_client(url) for url in urls)
    held: list[Redlock] = []

    def acquire(name: str) -> bool:
        lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
        if lock.acquire(blocking=False):
            held.append(lock)
            return True
        return False

    def release() -> None:
        held.pop().release()

    return acquire, release


CONTENDERS = (
    ("django_redlock", "django_redlock N=5", 5),
    ("redis-py", "redis-py Lock (1 node)", 1),
    ("python-redis-lock", "python-redis-lock (1 node)", 1),
    ("pottery", "pottery Redlock N=5", 5),
)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def w2(cluster5: LocalCluster, seconds: float) -> None:
    from benchmarks.contention import run_w2

    print(f"\nW2: 4 processes, distinct keys, {seconds:g} s each")
    print(f"{'contender':28} {'pairs/s':>9} {'server CPU µs/pair':>19}")
    rates: dict[str, float] = {}
    # Our N=1 row separates the cost of our client and flow from the cost of the node count
    # (every pair runs on five servers, which share the two cores with the clients).
    for kind, label, nodes in (*CONTENDERS, ("django_redlock", "django_redlock N=1", 1)):
        # Where the time goes on a small machine: the servers' CPU per pair (workers' start-up
        # included, which only makes this an upper bound).
        pids = [node.pid for node in cluster5.nodes[:nodes] if node.pid is not None]
        before = _cpu_seconds(pids)
        rates[label] = run_w2(kind, cluster5.urls[:nodes], seconds)
        server_us = (_cpu_seconds(pids) - before) / max(rates[label] * seconds, 1) * 1e6
        print(f"{label:28} {rates[label]:9.0f} {server_us:19.0f}")
    ours, anchor = rates["django_redlock N=5"], rates["redis-py Lock (1 node)"]
    print("ratios (same run):")
    print(f"  django_redlock N=5 / redis-py 1 node = {ours / anchor:.2f}x (target >= 0.8x)")
    print(f"  django_redlock N=1 / redis-py 1 node = {rates['django_redlock N=1'] / anchor:.2f}x")
    print(
        f"  django_redlock N=5 / pottery N=5     = "
        f"{ours / rates['pottery Redlock N=5']:.1f}x (target >= 9x)"
    )


def w3(cluster5: LocalCluster, seconds: float) -> None:
    from benchmarks.contention import W3Result, run_w3

    print(f"\nW3: 8 processes, one key, 1 ms critical section, {seconds:g} s each")
    print(
        f"{'contender':28} {'CS/s':>7} {'handoffs/s':>10} {'share':>6} {'wait p50':>9} "
        f"{'wait p99':>9} {'Jain':>5} {'lost':>5}"
    )
    results: dict[str, W3Result] = {}
    # Our N=1 row separates the cost of the fair hand-off (one process wakes the next, every
    # time) from the cost of the node count.
    for kind, label, nodes in (*CONTENDERS, ("django_redlock", "django_redlock N=1", 1)):
        result = run_w3(kind, cluster5.urls[:nodes], seconds)
        results.setdefault(kind, result)
        print(
            f"{label:28} {result.per_second:7.0f} {result.handoffs_per_second:10.0f} "
            f"{result.handoff_share:6.2f} {result.wait_p50_ms:7.1f}ms {result.wait_p99_ms:7.1f}ms "
            f"{result.fairness:5.2f} {result.lost_updates:5d}"
        )
    ours, anchor = results["django_redlock"], results["python-redis-lock"]
    print("ratios (same run):")
    print(
        f"  django_redlock CS/s / python-redis-lock CS/s = "
        f"{ours.per_second / max(anchor.per_second, 1e-9):.2f}x  (target >= 1.0x)"
    )
    print(
        f"  django_redlock hand-offs / critical sections = {ours.handoff_share:.2f}"
        f"  (target >= 0.9); fairness {ours.fairness:.2f} (target >= 0.95); "
        f"lost updates {ours.lost_updates} (target 0)"
    )
    print(
        f"  django_redlock hand-offs/s / python-redis-lock hand-offs/s = "
        f"{ours.handoffs_per_second / max(anchor.handoffs_per_second, 1e-9):.2f}x"
    )


def w5(cluster3: LocalCluster, seconds: float) -> None:
    from benchmarks.overload import TTL as W5_TTL
    from benchmarks.overload import run_w5

    print(f"\nW5: 300 waiters (10 processes x 30 threads), retry_delay 10 ms, N=3, {seconds:g} s")
    result = run_w5(cluster3.urls, seconds)
    print(
        f"{'contender':28} {'CS':>6} {'hand-off p50':>13} {'p99':>9} {'max':>9} "
        f"{'> ttl/2':>8} {'release errors':>15}"
    )
    print(
        f"{'django_redlock N=3':28} {result.critical_sections:6d} "
        f"{result.handoff_p50_ms:11.1f}ms {result.handoff_p99_ms:7.1f}ms "
        f"{result.handoff_max_ms:7.1f}ms {result.slow_handoffs:8d} {result.release_errors:15d}"
    )
    print(f"  target: no hand-off slower than ttl/2 = {W5_TTL / 2:g} s (0 in the > ttl/2 column)")


def w6_w7(cluster5: LocalCluster, seconds: float) -> None:
    from benchmarks.kinds import LIMIT, run

    print(f"\nW6: read-mostly, 8 processes, one name, 9 reads in 10, 5 ms each, {seconds:g} s")
    print(f"W7: semaphore of {LIMIT}, 8 processes, 5 ms inside, {seconds:g} s")
    print(f"{'contender':36} {'ops/s':>7} {'most inside':>11} {'overlaps':>9}")
    rows = {}
    for kind, label in (
        ("rwlock", "W6 django_redlock rwlock N=5"),
        ("lock", "W6 django_redlock lock N=5"),
        ("semaphore", f"W7 django_redlock semaphore({LIMIT}) N=5"),
        ("lock-sem", "W7 django_redlock lock N=5"),
    ):
        result = rows[kind] = run(kind, cluster5.urls, seconds)
        print(f"{label:36} {result.per_second:7.0f} {result.most_inside:11d} {result.overlaps:9d}")
    print("ratios (same run):")
    print(
        f"  W6 rwlock ops/s / lock ops/s = "
        f"{rows['rwlock'].per_second / max(rows['lock'].per_second, 1e-9):.2f}x"
        f"  (writes overlapping anything: {rows['rwlock'].overlaps}, must be 0)"
    )
    print(
        f"  W7 semaphore({LIMIT}) ops/s / lock ops/s = "
        f"{rows['semaphore'].per_second / max(rows['lock-sem'].per_second, 1e-9):.2f}x"
        f"  (most inside: {rows['semaphore'].most_inside}, must be <= {LIMIT})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4000, help="W1 pairs per contender")
    parser.add_argument("--rounds", type=int, default=8, help="W1 interleaved rounds")
    parser.add_argument("--w4", type=int, default=400, help="W4 pairs per contender")
    parser.add_argument("--seconds", type=float, default=3.0, help="W2/W3 seconds each")
    parser.add_argument("--w5-seconds", type=float, default=10.0, help="W5 duration")
    parser.add_argument(
        "--only", choices=["w1", "w1i", "w2", "w3", "w4", "w5", "w6"], help="run one workload"
    )
    args = parser.parse_args(argv)

    print(f"server: {server_version()}")
    print(f"python: {sys.version.split()[0]}, cores: {os.cpu_count()}")
    with LocalCluster(3) as cluster3, LocalCluster(5) as cluster5:
        if args.only in (None, "w1"):
            w1(cluster3, cluster5, args.pairs, args.rounds)
        if args.only in (None, "w1i"):
            from benchmarks.instructions import w1i

            w1i(cluster3, cluster5)
        if args.only in (None, "w4"):
            w4(cluster5, args.w4)
        if args.only in (None, "w2"):
            w2(cluster5, args.seconds)
        if args.only in (None, "w3"):
            w3(cluster5, args.seconds)
        if args.only in (None, "w5"):
            w5(cluster3, args.w5_seconds)
        if args.only in (None, "w6"):
            w6_w7(cluster5, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
