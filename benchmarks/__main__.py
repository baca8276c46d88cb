"""Side-by-side benchmarks: ``./run bench`` (or ``python -m benchmarks``).

Starts its own nodes, then runs every contender in one process (W1, W4) or in the same
worker-process harness (W2, W3, W5-W7), interleaved so that machine noise hits them alike, and
prints a table plus ratios against the anchors measured in the same run. W1, W2 and W3 are run
``--runs`` times (3) in a rotating order; each figure is the median of the runs' own figures,
and each ratio is printed with every run's own ratio beside it, to show the noise.

The floor every workload is compared to first is the minimal Redlock
(``benchmarks/minimal_redlock.py``): plain ``SET NX PX`` to every node, one ``poll()`` loop
that returns at a quorum, release by the compare-and-delete script, nothing else. Ours and it
run at each node count of ``--nodes`` (1, 3, 5), on the first N of the same five nodes, and so
does the floor at equal work (``benchmarks/floor.py``): the minimal client sending our very
acquire and release. W1, W2 and W1i split ours / minimal into its two factors: ours / that
floor (the client's share) and that floor / minimal (the scripts' share). W3 does the same with
its own floor (``benchmarks/floor_line.py``): the minimal client sending our blocking acquire,
which waits in the nodes' line and takes hand-off grants, and the holder's granting release.

- W1: one client, acquire + release of fresh keys; p50/p99 µs per pair (lower is better).
  Contenders: django_redlock, the minimal Redlock and the same-commands floor at each N,
  redis-py ``Lock`` (1 node), pottery ``Redlock`` at N=3 and N=5, and two references that send
  our own commands to 5 nodes (``benchmarks/references.py``): raw sockets with one ``poll()``
  loop, and redis-py ``Connection`` objects written to all, then read; the asyncio core at N=5.
- W1i: the client's instructions per W1 pair, counted by valgrind (``benchmarks/instructions.py``):
  the measure that does not move with the machine's load, for changes to the hot path.
- W2: 4 processes, each on its own keys: pairs/s (higher is better), and the servers' CPU per
  pair. W3: 8 processes on one key, 1 ms critical section: critical sections/s (higher is
  better), hand-offs/s and their share (consecutive holders in different processes), waits,
  Jain's fairness index over the processes, lost updates (``benchmarks/contention.py``).
  Contenders: django_redlock and the minimal Redlock at each N (the minimal one, having no wait
  line, retries after a short random sleep), the same-commands floor at each N (W2's, and W3's
  that waits in line), redis-py ``Lock`` and python-redis-lock (1 node), pottery ``Redlock``
  N=5. ``python -m benchmarks.w3_budget`` splits W3's CPU per critical section.
- W4: 5 nodes with 2 paused by SIGSTOP; success rate, p50/p99 acquire latency, and the
  process's threads and open sockets before and after. Contenders: django_redlock and pottery
  (redis-py's ``Lock`` has one node, so "2 of 5 paused" does not apply to it).

- W6: read-mostly (9 reads in 10, 5 ms of I/O wait each), 8 processes on one name: the
  read-write lock against a lock doing the same work; W7: a semaphore of 3 slots against a
  lock, 8 processes, 5 ms inside (``benchmarks/kinds.py``).

- W5: 300 waiters (10 processes x 30 threads) on one lock with a 10 ms ``retry_delay``:
  hand-off latency p50/p99/max, and hand-offs slower than half the ttl (a lease that ran out
  because its release did not get through). django_redlock only (``benchmarks/overload.py``).

- W10, ``scale`` (``benchmarks/scale.py``): pair p50 at N = 1 to 9, bytes per held lock,
  connections per node for 32 threads, listing and status at 1k/10k/50k held locks, server
  CPU per critical section at 8/32/64 waiters; beside redis-py and python-redis-lock where a
  figure applies to them. About 3 minutes, so only when asked: ``--only scale``.

- ``cluster`` (``benchmarks/cluster.py``): W1, W2 and W1i with each node a cluster of 3
  shards against the same with each node one plain process (all on TCP), ours beside the
  same-commands floor that routes by slot as ours does (``benchmarks/floor_cluster.py``), and
  the paper estimate of 3 nodes of 16 shards. Its own nodes; some minutes, so only when
  asked: ``--only cluster --nodes 1,3``.

- ``profile`` (``benchmarks/steps.py``): W1's pair (what each W2 worker repeats) in client
  instructions, split by step (argument checks, building the requests, the rounds, parsing,
  judging, the lease's bookkeeping, reporting, the release), ours beside the same-commands
  floor, at each ``--nodes``. Needs valgrind and gcc; a quarter of an hour, so only when
  asked: ``--only profile --nodes 1,5``.

Choose with ``--only w1,w2,w3`` (any of w1, w1i, w2, w3, w4, w5, w6, scale, profile,
cluster; all but scale, profile and cluster by default) and ``--nodes 1,5``.

Every contender gets clients with the same 50 ms socket timeout and no client retries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.contention import _client
from benchmarks.pairs import (
    NODE_TIMEOUT,
    TTL,
    PairRunner,
    minimal,
    ours,
    redis_py,
    same_commands,
)
from benchmarks.references import raw_sockets, redis_py_connections
from django_redlock import LockManager, LockNotAcquired
from django_redlock.localnodes import LocalCluster, server_version


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


def pottery_redlock(urls: list[str]) -> PairRunner:
    from pottery import Redlock
    from pottery.exceptions import ReleaseUnlockedLock

    masters = frozenset(_client(url) for url in urls)

    def run(name: str) -> bool:
        lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
        if not lock.acquire(blocking=False):
            return False
        try:
            lock.release()
        except ReleaseUnlockedLock:
            # Its release timed out on too many nodes (50 ms, on a loaded machine): a failed
            # pair in the "ok" column, not the end of the run.
            return False
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


def _ratio_line(label: str, ours: list[float], floor: list[float], note: str = "") -> str:
    """``label = the ratio of the medians``, then each run's own ratio (to show the noise)."""
    ratio = statistics.median(ours) / statistics.median(floor)
    each = ", ".join(f"{a / b:.2f}" for a, b in zip(ours, floor, strict=True))
    return f"  {label} = {ratio:.2f}x  (each run: {each}){note}"


def w1(cluster5: LocalCluster, nodes: list[int], pairs: int, rounds: int, runs: int) -> None:
    urls = cluster5.urls
    contenders: list[tuple[str, PairRunner]] = []
    for n in nodes:
        contenders += [
            (f"django_redlock N={n}", ours(urls[:n])),
            (f"minimal Redlock N={n}", minimal(urls[:n])),
            (f"same-commands floor N={n}", same_commands(urls[:n])),
        ]
    contenders.append(("redis-py Lock (1 node)", redis_py(urls)))
    if 5 in nodes:
        contenders += [
            ("raw sockets + poll N=5", raw_sockets(urls)),
            ("redis-py Connection N=5", redis_py_connections(urls)),
        ]
    contenders += [(f"pottery Redlock N={n}", pottery_redlock(urls[:n])) for n in nodes if n > 1]
    for label, run in contenders:  # warm up connections and script caches
        _measure(Result(label), run, 50, "warm")
    # Per run, per contender: a Result; a figure is the median of the runs' own figures.
    per_run: list[dict[str, Result]] = []
    per_round = max(1, pairs // (rounds * runs))
    for run_index in range(runs):
        results = {label: Result(label) for label, _ in contenders}
        for round_index in range(rounds):
            # Rotate the order every round so no contender always runs first or last.
            shift = (run_index * rounds + round_index) % len(contenders)
            for label, run in contenders[shift:] + contenders[:shift]:
                slow = label.startswith("pottery")
                count = max(1, per_round // 4) if slow else per_round
                _measure(results[label], run, count, f"{run_index}.{round_index}")
        per_run.append(results)

    def figure(label: str, of: Callable[[Result], float]) -> list[float]:
        return [of(results[label]) for results in per_run]

    def p50(label: str) -> list[float]:
        return figure(label, lambda result: statistics.median(result.pair_us))

    async_pair_us = _w1_async(urls, max(1000, pairs // 2)) if 5 in nodes else []

    print(
        f"\nW1: one client, acquire + release of fresh keys ({pairs} pairs each, {runs} runs of "
        f"{rounds} interleaved rounds; medians of the runs)"
    )
    print(f"{'contender':28} {'p50 µs':>9} {'p99 µs':>9} {'pairs/s':>9} {'ok':>6}")
    for label, _ in contenders:
        p99 = figure(label, lambda result: _percentile(result.pair_us, 0.99))
        rate = figure(label, lambda result: 1e6 / statistics.mean(result.pair_us))
        ok = sum(results[label].successes for results in per_run) / sum(
            results[label].attempts for results in per_run
        )
        print(
            f"{label:28} {statistics.median(p50(label)):9.0f} {statistics.median(p99):9.0f} "
            f"{statistics.median(rate):9.0f} {ok:6.1%}"
        )
    if async_pair_us:
        print(
            f"{'django_redlock async N=5':28} {statistics.median(async_pair_us):9.0f} "
            f"{_percentile(async_pair_us, 0.99):9.0f} "
            f"{1e6 / statistics.mean(async_pair_us):9.0f} {1.0:6.1%}"
        )
    print("vs the minimal Redlock (ours / minimal, p50 pair time: lower is better):")
    for n in nodes:
        target = "  (target <= 1.10x)" if n in (1, 5) else ""
        print(_ratio_line(f"N={n}: ours / minimal", p50(f"django_redlock N={n}"),
                          p50(f"minimal Redlock N={n}"), target))  # fmt: skip
    if len(nodes) > 1:
        low, high = min(nodes), max(nodes)
        print(f"  cost of each node beyond N={low}, (p50 N={high} - p50 N={low}) / {high - low}:")
        for who, target in (
            ("django_redlock", "  (target <= 3 µs)"),
            ("same-commands floor", ""),
            ("minimal Redlock", ""),
        ):
            each = [
                (a - b) / (high - low)
                for a, b in zip(p50(f"{who} N={high}"), p50(f"{who} N={low}"), strict=True)
            ]
            runs_text = ", ".join(f"{cost:.1f}" for cost in each)
            print(f"    {who:19} {statistics.median(each):5.1f} µs  (runs: {runs_text}){target}")
    _decomposition(nodes, p50, "p50 pair time, lower is better")
    print("vs the other references (p50 pair time, same runs):")
    anchor = p50("redis-py Lock (1 node)")
    for n in nodes:
        print(_ratio_line(f"django_redlock N={n} / redis-py Lock 1 node",
                          p50(f"django_redlock N={n}"), anchor,
                          "  (target <= 0.90x)" if n == 5 else ""))  # fmt: skip
    if 5 in nodes:
        ours5 = p50("django_redlock N=5")
        print(_ratio_line("django_redlock N=5 / raw sockets N=5", ours5,
                          p50("raw sockets + poll N=5"), "  (target <= 1.10x)"))  # fmt: skip
        print(_ratio_line("django_redlock N=5 / redis-py Connection", ours5,
                          p50("redis-py Connection N=5")))  # fmt: skip
        if async_pair_us:
            ratio = statistics.median(async_pair_us) / statistics.median(ours5)
            print(f"  django_redlock async N=5 / sync N=5 = {ratio:.2f}x  (target <= 1.5x)")
    for n in nodes:
        if n > 1:
            print(_ratio_line(f"pottery N={n} / django_redlock N={n}",
                              p50(f"pottery Redlock N={n}"), p50(f"django_redlock N={n}"),
                              "  (target >= 12x)" if n == 5 else ""))  # fmt: skip


def _decomposition(nodes: list[int], of: Callable[[str], list[float]], measure: str) -> None:
    """ours / minimal split in two factors measured in the same runs, whose product it is:
    ours / the same-commands floor (the client's share: what our client costs beyond the
    minimal client sending our very bytes) and the same-commands floor / minimal (the scripts'
    share: what our commands cost in the minimal client, the servers' work included). Each in
    the workload's own measure, ``measure`` saying which and which way is better."""
    print(f"decomposition ({measure}; ours / minimal = client's share x scripts' share):")
    for n in nodes:
        ours, floor = of(f"django_redlock N={n}"), of(f"same-commands floor N={n}")
        minimal = of(f"minimal Redlock N={n}")
        print(_ratio_line(f"N={n}: client's share, ours / floor", ours, floor))
        print(_ratio_line(f"N={n}: scripts' share, floor / minimal", floor, minimal))


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


def _process_contenders(nodes: list[int], floor: str) -> list[tuple[str, str, int]]:
    """W2's and W3's contenders: the references of ``CONTENDERS``, then ours, the minimal
    Redlock and the same-commands floor of kind ``floor`` (W2's ``floor``, W3's
    ``floor_line``, which waits in our line) at each node count (``(kind, label, N)``)."""
    contenders = list(CONTENDERS)
    kinds = [
        ("django_redlock", "django_redlock"),
        ("minimal", "minimal Redlock"),
        (floor, "same-commands floor"),
    ]
    for n in nodes:
        for kind, name in kinds:
            if not any(label == f"{name} N={n}" for _, label, _ in contenders):
                contenders.append((kind, f"{name} N={n}", n))
    return contenders


def _rotations(contenders: list[Any], runs: int) -> Iterator[list[Any]]:
    """The contenders once per run, each run starting one further on, so no contender
    always runs first or last."""
    for run_index in range(runs):
        shift = run_index % len(contenders)
        yield contenders[shift:] + contenders[:shift]


def w2(cluster5: LocalCluster, nodes: list[int], seconds: float, runs: int) -> None:
    from benchmarks.contention import run_w2

    print(f"\nW2: 4 processes, distinct keys, {seconds:g} s each, medians of {runs} runs")
    print(f"{'contender':28} {'pairs/s':>9} {'server CPU µs/pair':>19}")
    contenders = _process_contenders(nodes, "floor")
    rates: dict[str, list[float]] = {label: [] for _, label, _ in contenders}
    server: dict[str, list[float]] = {label: [] for _, label, _ in contenders}
    for order in _rotations(contenders, runs):
        for kind, label, n in order:
            # Where the time goes on a small machine: the servers' CPU per pair (workers'
            # start-up included, which only makes this an upper bound).
            pids = [node.pid for node in cluster5.nodes[:n] if node.pid is not None]
            before = _cpu_seconds(pids)
            rate = run_w2(kind, cluster5.urls[:n], seconds)
            rates[label].append(rate)
            server[label].append((_cpu_seconds(pids) - before) / max(rate * seconds, 1) * 1e6)
    for _, label, _ in contenders:
        print(
            f"{label:28} {statistics.median(rates[label]):9.0f} "
            f"{statistics.median(server[label]):19.0f}"
        )
    print("vs the minimal Redlock (ours / minimal, pairs/s: higher is better):")
    for n in nodes:
        target = "  (target >= 0.90x)" if n in (1, 5) else ""
        print(_ratio_line(f"N={n}: ours / minimal", rates[f"django_redlock N={n}"],
                          rates[f"minimal Redlock N={n}"], target))  # fmt: skip
    _decomposition(nodes, rates.__getitem__, "pairs/s, higher is better")
    print("vs the other references (pairs/s, same runs):")
    anchor = rates["redis-py Lock (1 node)"]
    ours5 = rates["django_redlock N=5"]
    print(_ratio_line("django_redlock N=5 / redis-py 1 node", ours5, anchor, "  (target >= 0.8x)"))
    if 1 in nodes:
        print(_ratio_line("django_redlock N=1 / redis-py 1 node",
                          rates["django_redlock N=1"], anchor))  # fmt: skip
    print(_ratio_line("django_redlock N=5 / pottery N=5", ours5, rates["pottery Redlock N=5"],
                      "  (target >= 9x)"))  # fmt: skip


def w3(cluster5: LocalCluster, nodes: list[int], seconds: float, runs: int) -> None:
    from benchmarks.contention import W3Result, median_w3, run_w3

    print(
        f"\nW3: 8 processes, one key, 1 ms critical section, {seconds:g} s each, medians of "
        f"{runs} runs (lost: all runs)"
    )
    print(
        f"{'contender':28} {'CS/s':>7} {'handoffs/s':>10} {'share':>6} {'wait p50':>9} "
        f"{'wait p99':>9} {'Jain':>5} {'lost':>5}"
    )
    contenders = _process_contenders(nodes, "floor_line")
    runs_of: dict[str, list[W3Result]] = {label: [] for _, label, _ in contenders}
    for order in _rotations(contenders, runs):
        for kind, label, n in order:
            runs_of[label].append(run_w3(kind, cluster5.urls[:n], seconds))
    results = {label: median_w3(each) for label, each in runs_of.items()}
    for _, label, _ in contenders:
        result = results[label]
        print(
            f"{label:28} {result.per_second:7.0f} {result.handoffs_per_second:10.0f} "
            f"{result.handoff_share:6.2f} {result.wait_p50_ms:7.1f}ms {result.wait_p99_ms:7.1f}ms "
            f"{result.fairness:5.2f} {result.lost_updates:5d}"
        )

    def rate(label: str) -> list[float]:
        return [result.per_second for result in runs_of[label]]

    print("vs the minimal Redlock (ours / minimal, critical sections/s: higher is better):")
    for n in nodes:
        target = "  (target >= 1.00x)" if n == 5 else ""
        print(_ratio_line(f"N={n}: ours / minimal", rate(f"django_redlock N={n}"),
                          rate(f"minimal Redlock N={n}"), target))  # fmt: skip
    _decomposition(nodes, rate, "critical sections/s, higher is better")
    for n in nodes:
        ours, floor = results[f"django_redlock N={n}"], results[f"minimal Redlock N={n}"]
        targets = "  (targets for ours at N=5: >= 0.95, >= 0.99)" if n == 5 else ""
        print(
            f"  N={n}: hand-off share ours {ours.handoff_share:.2f}, minimal "
            f"{floor.handoff_share:.2f}; Jain ours {ours.fairness:.2f}, minimal "
            f"{floor.fairness:.2f}{targets}"
        )
    print("vs the other references (critical sections/s, same runs):")
    anchor = rate("python-redis-lock (1 node)")
    for n in nodes:
        target = "  (target >= 1.00x)" if n == 1 else ""
        print(_ratio_line(f"django_redlock N={n} / python-redis-lock 1 node",
                          rate(f"django_redlock N={n}"), anchor, target))  # fmt: skip
    ours5, prl = results["django_redlock N=5"], results["python-redis-lock (1 node)"]
    handoffs = ours5.handoffs_per_second / max(prl.handoffs_per_second, 1e-9)
    print(f"  django_redlock N=5 hand-offs/s / python-redis-lock hand-offs/s = {handoffs:.2f}x")
    lost = sum(result.lost_updates for result in results.values())
    print(f"  lost updates, all contenders and runs: {lost} (target 0)")


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


WORKLOADS = ("w1", "w1i", "w2", "w3", "w4", "w5", "w6", "scale", "profile", "cluster")
# scale takes minutes, profile (the pair by step, callgrind) a quarter of an hour, cluster
# (its own nodes, clusters of 3 shards) some minutes: asked for only
DEFAULT_WORKLOADS = frozenset(WORKLOADS) - {"scale", "profile", "cluster"}


def _workloads(text: str) -> set[str]:
    chosen = {part.strip().lower() for part in text.split(",") if part.strip()}
    if not chosen or not chosen <= set(WORKLOADS):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(WORKLOADS)}, comma-separated")
    return chosen


def _node_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or not set(counts) <= {1, 3, 5}:
        raise argparse.ArgumentTypeError("node counts from 1, 3 and 5, comma-separated")
    return counts


def main(argv: list[str] | None = None) -> int:
    # As users start it (./run bench), not as Python names the module (__main__.py).
    parser = argparse.ArgumentParser(prog="./run bench", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4000, help="W1 pairs per contender")
    parser.add_argument("--rounds", type=int, default=8, help="W1 interleaved rounds per run")
    parser.add_argument("--runs", type=int, default=3, help="W1/W2/W3 runs (figures: medians)")
    parser.add_argument("--w4", type=int, default=400, help="W4 pairs per contender")
    parser.add_argument("--seconds", type=float, default=3.0, help="W2/W3 seconds each")
    parser.add_argument("--w5-seconds", type=float, default=10.0, help="W5 duration")
    parser.add_argument(
        "--only",
        type=_workloads,
        default=set(DEFAULT_WORKLOADS),
        metavar="W[,W...]",
        help=f"these workloads only ({', '.join(WORKLOADS)}; default: not scale, profile, cluster)",
    )
    parser.add_argument(
        "--nodes",
        type=_node_counts,
        default=[1, 3, 5],
        metavar="N[,N...]",
        help="node counts for ours and the minimal Redlock in W1/W2/W3 (from 1,3,5)",
    )
    args = parser.parse_args(argv)
    only: set[str] = args.only
    nodes: list[int] = args.nodes

    shown = sys.argv[1:] if argv is None else argv
    print(f"command: python -m benchmarks {' '.join(shown)}".rstrip())
    print(f"server: {server_version()}")
    print(f"python: {sys.version.split()[0]}, cores: {os.cpu_count()}")
    with LocalCluster(3) as cluster3, LocalCluster(5) as cluster5:
        if "w1" in only:
            w1(cluster5, nodes, args.pairs, args.rounds, args.runs)
        if "w1i" in only:
            from benchmarks.instructions import w1i

            w1i(cluster3, cluster5)
        if "w4" in only:
            w4(cluster5, args.w4)
        if "w2" in only:
            w2(cluster5, nodes, args.seconds, args.runs)
        if "w3" in only:
            w3(cluster5, nodes, args.seconds, args.runs)
        if "w5" in only:
            w5(cluster3, args.w5_seconds)
        if "w6" in only:
            w6_w7(cluster5, args.seconds)
        if "profile" in only:
            from benchmarks.steps import profile

            clusters = {1: [cluster5.urls[0]], 3: cluster3.urls, 5: cluster5.urls}
            profile({n: clusters[n] for n in nodes})
        if "scale" in only:
            from benchmarks.scale import run as scale

            scale(cluster3)
        if "cluster" in only:
            from benchmarks.cluster import run as on_clusters

            on_clusters(nodes, pairs=args.pairs, rounds=args.rounds, runs=args.runs,
                        seconds=args.seconds)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
