"""W10, scale (issue 28, item 5): ``python -m benchmarks --only scale``.

Five sections, each beside redis-py's ``Lock`` and python-redis-lock where the figure applies
to a one-node lock (and saying N/A where it does not):

1. pair p50: one client, acquire + release of fresh keys, at N = 1, 3, 5, 7, 9 (nodes of one
   9-node cluster), interleaved rounds; the cost of each node beyond the first.
2. bytes per held lock: 10,000 locks held on one fresh node, ``used_memory`` delta / 10,000,
   and ``MEMORY USAGE`` of one lock's key (its expiry included by the server).
3. connections per node for 32 threads of one process (a spawned process per contender and
   shape): distinct keys (each thread an acquire/release loop) and one line (one holder with
   5 ms inside, 31 waiting); counted from the servers' ``CLIENT LIST`` (peak over the run,
   less the baseline before the process started; the pub/sub ones apart).
4. listing (``manager.locks(limit=None)`` and the capped default) and
   ``django_redlock.core.health.status(manager)`` at 1k / 10k / 50k locks held on 3 nodes
   (``benchmarks/listing.py``'s ``hold`` and ``measure``). Ours only.
5. server CPU per critical section at 8 / 32 / 64 waiters on one key, a 1 ms busy-waited
   critical section (as W3): 4 processes, each with waiters / 4 threads; the servers'
   ``used_cpu_sys + used_cpu_user`` (``INFO CPU``) delta over the run / critical sections;
   ours at N=1 (beside the one-node anchors) and N=3; 3 runs of 2 s, medians.

Tests never assert speed (``tests/test_scale.py`` runs each section at toy sizes).
"""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from benchmarks.contention import _client, make_locker
from benchmarks.pairs import PairRunner
from benchmarks.pairs import ours as ours_pair
from benchmarks.pairs import redis_py as redis_py_pair
from django_redlock import Lease, LockManager
from django_redlock.localnodes import LocalCluster

TTL = 600.0  # every held lock must outlive its section
NODE_TIMEOUT = 0.05
LOCK_TTL = 10.0  # of the blocking locks in sections 3 and 5 (as W3's)
LONG_WAIT = LOCK_TTL + 5.0  # python-redis-lock's socket timeout there (see _locker)
ANCHORS = ("redis-py", "python-redis-lock")
LABELS = {
    "django_redlock": "django_redlock",
    "redis-py": "redis-py Lock (1 node)",
    "python-redis-lock": "python-redis-lock (1 node)",
}


def _info(url: str, section: str) -> dict[str, Any]:
    with redis.Redis.from_url(url, socket_timeout=5.0) as client:
        info: dict[str, Any] = client.info(section)
        return info


# -- 1. pair p50 -----------------------------------------------------------------------------


def _python_redis_lock_pair(url: str) -> PairRunner:
    import redis_lock

    client = _client(url)

    def run(name: str) -> bool:
        lock = redis_lock.Lock(client, name, expire=10)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return run


def pair_p50(
    urls: list[str], counts: Sequence[int], pairs: int, rounds: int = 4
) -> dict[str, float]:
    """p50 µs of an acquire + release pair per contender (ours at each N of ``counts`` on the
    first N of ``urls``, the anchors on the first node), ``pairs`` each in ``rounds``
    interleaved rounds, each round in a rotated order."""
    contenders: list[tuple[str, PairRunner]] = [
        (f"django_redlock N={n}", ours_pair(urls[:n])) for n in counts
    ]
    contenders += [
        (f"{LABELS['redis-py']}", redis_py_pair(urls[:1])),
        (f"{LABELS['python-redis-lock']}", _python_redis_lock_pair(urls[0])),
    ]
    samples: dict[str, list[float]] = {label: [] for label, _ in contenders}
    failed = dict.fromkeys(samples, 0)
    tags = {label: "".join(char for char in label if char.isalnum()) for label in samples}
    for index, (_, run) in enumerate(contenders):  # connections and script caches
        for warm in range(50):
            run(f"scale:p:{index}:warm:{warm}")
    per_round = max(1, pairs // rounds)
    for round_index in range(rounds):
        shift = round_index % len(contenders)
        for label, run in contenders[shift:] + contenders[:shift]:
            for pair in range(per_round):
                start = time.perf_counter()
                ok = run(f"scale:p:{tags[label]}:{round_index}:{pair}")
                samples[label].append((time.perf_counter() - start) * 1e6)
                failed[label] += not ok
    p50 = {label: statistics.median(each) for label, each in samples.items()}
    print(
        f"\n1. pair p50: one client, acquire + release of fresh keys, {per_round * rounds} "
        f"pairs each in {rounds} interleaved rounds"
    )
    print(f"{'contender':30} {'p50 µs':>8} {'p99 µs':>8} {'failed':>7}")
    for label, each in samples.items():
        p99 = sorted(each)[min(len(each) - 1, int(0.99 * len(each)))]
        print(f"{label:30} {p50[label]:8.0f} {p99:8.0f} {failed[label]:7d}")
    if len(counts) > 1:
        low, high = min(counts), max(counts)
        cost = (p50[f"django_redlock N={high}"] - p50[f"django_redlock N={low}"]) / (high - low)
        ours = {n: p50[f"django_redlock N={n}"] for n in counts}
        steps = ", ".join(
            f"N={a}->{b}: {(ours[b] - ours[a]) / (b - a):.1f}"
            for a, b in itertools.pairwise(counts)
        )
        print(f"  cost of each node beyond N={low}: {cost:.1f} µs (per step, µs/node: {steps})")
    print("  redis-py Lock and python-redis-lock have one node: N > 1 is N/A for them")
    return p50


# -- 2. bytes per held lock ------------------------------------------------------------------


@dataclass
class HeldBytes:
    label: str
    per_lock: float
    key: str
    memory_usage: int


def _hold_ours(url: str, count: int) -> tuple[Callable[[], None], str]:
    manager = LockManager([url], ttl=TTL, node_timeout=2.0)
    manager.acquire("scale:b:warm", blocking=False).release()
    leases: list[Lease] = [
        manager.acquire(f"scale:b:{i:06d}", blocking=False) for i in range(count)
    ]

    def release() -> None:
        for lease in leases:
            lease.release()

    return release, manager.key("scale:b:000000")


def _hold_redis_py(url: str, count: int) -> tuple[Callable[[], None], str]:
    client = _client(url)
    locks = [client.lock(f"scale:b:{i:06d}", timeout=TTL) for i in range(count)]
    if not all(lock.acquire(blocking=False) for lock in locks):
        raise SystemExit("redis-py: a lock was not acquired")

    def release() -> None:
        for lock in locks:
            lock.release()

    return release, "scale:b:000000"


def _hold_python_redis_lock(url: str, count: int) -> tuple[Callable[[], None], str]:
    import redis_lock

    client = _client(url)
    locks = [redis_lock.Lock(client, f"scale:b:{i:06d}", expire=int(TTL)) for i in range(count)]
    if not all(lock.acquire(blocking=False) for lock in locks):
        raise SystemExit("python-redis-lock: a lock was not acquired")

    def release() -> None:
        for lock in locks:
            lock.release()

    return release, "lock:scale:b:000000"


def held_bytes(url: str, count: int) -> list[HeldBytes]:
    """Per contender, on the node ``url``: hold ``count`` locks, ``used_memory`` delta / count
    and ``MEMORY USAGE`` of one key; then release them all before the next contender."""
    rows = []
    for kind, holder in (
        ("django_redlock", _hold_ours),
        ("redis-py", _hold_redis_py),
        ("python-redis-lock", _hold_python_redis_lock),
    ):
        _client(url).ping()  # the measuring connection is counted in both readings
        before = _info(url, "memory")["used_memory"]
        release, key = holder(url, count)
        after = _info(url, "memory")["used_memory"]
        with redis.Redis.from_url(url) as client:
            usage = int(client.memory_usage(key, samples=0) or 0)
        release()
        rows.append(HeldBytes(LABELS[kind], (after - before) / count, key, usage))
    allocator = _info(url, "memory").get("mem_allocator", "?")
    print(f"\n2. bytes per held lock: {count} locks held on one node (mem_allocator={allocator})")
    print(f"{'contender':30} {'used_memory Δ / lock':>21} {'MEMORY USAGE of one key':>24}")
    for row in rows:
        print(f"{row.label:30} {row.per_lock:19.0f} B {row.memory_usage:22d} B  ({row.key})")
    return rows


# -- 3. connections per node -----------------------------------------------------------------


def _locker(kind: str, urls: list[str]) -> Callable[[str], AbstractContextManager[Any]]:
    """W3's blocking locks (``make_locker``), but python-redis-lock's client waits in BLPOP
    for up to its expire, so its socket timeout is longer than that (with W3's 50 ms, a wait
    longer than 50 ms fails with a TimeoutError)."""
    if kind != "python-redis-lock":
        return make_locker(kind, urls)
    import redis_lock

    client = redis.Redis.from_url(urls[0], socket_timeout=LONG_WAIT, retry=Retry(NoBackoff(), 0))
    return lambda name: redis_lock.Lock(client, name, expire=int(LOCK_TTL))


def _connections_worker(
    kind: str, urls: list[str], threads: int, shape: str, seconds: float, go: Any, out: Any
) -> None:
    locker = _locker(kind, urls)
    go.wait()
    deadline = time.monotonic() + seconds
    done = [0] * threads

    def loop(index: int) -> None:
        while time.monotonic() < deadline:
            if shape == "distinct":
                with locker(f"scale:c:{kind}:{index}:{done[index]}"):
                    pass
            else:
                with locker(f"scale:c:{kind}:line"):
                    time.sleep(0.005)  # one holds while the others wait in line
            done[index] += 1

    workers = [threading.Thread(target=loop, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put(sum(done))


@dataclass
class Connections:
    label: str
    shape: str
    peak: list[int]  # per node: the most connections seen at once, less the baseline
    pubsub: list[int]  # of those, in pub/sub mode at that moment
    sections: int


def _count(client: redis.Redis) -> tuple[int, int]:
    """Connections to the node (less the asking one) and how many of them are pub/sub."""
    clients = client.client_list()
    own = client.client_id()
    others = [entry for entry in clients if int(entry["id"]) != own]
    return len(others), sum(1 for entry in others if "P" in entry.get("flags", ""))


def connections(urls: list[str], threads: int = 32, seconds: float = 2.0) -> list[Connections]:
    """Ours on every node of ``urls``, the anchors on the first; ``threads`` threads of one
    spawned process per contender and shape."""
    context = multiprocessing.get_context("spawn")
    probes = [redis.Redis.from_url(url, socket_timeout=5.0) for url in urls]
    rows = []
    try:
        for shape in ("distinct", "line"):
            for kind in ("django_redlock", *ANCHORS):
                nodes = len(urls) if kind == "django_redlock" else 1
                baseline = [_count(probe)[0] for probe in probes[:nodes]]
                go, out = context.Event(), context.Queue()
                process = context.Process(
                    target=_connections_worker,
                    args=(kind, urls[:nodes], threads, shape, seconds, go, out),
                )
                process.start()
                go.set()
                peak, pubsub = [0] * nodes, [0] * nodes
                deadline = time.monotonic() + 60
                while process.is_alive() and time.monotonic() < deadline:
                    for index, probe in enumerate(probes[:nodes]):
                        total, subscribed = _count(probe)
                        if total - baseline[index] > peak[index]:
                            peak[index], pubsub[index] = total - baseline[index], subscribed
                    if not out.empty():
                        break
                    time.sleep(0.02)
                sections = out.get(timeout=60)
                process.join(30)
                rows.append(Connections(LABELS[kind], shape, peak, pubsub, sections))
                for probe, base in zip(probes, baseline, strict=False):  # gone before the next
                    while _count(probe)[0] > base and time.monotonic() < deadline:
                        time.sleep(0.02)
    finally:
        for probe in probes:
            probe.close()
    print(
        f"\n3. connections per node, {threads} threads of one process ({seconds:g} s each; "
        f"CLIENT LIST peak less the baseline; ours on {len(urls)} nodes, the anchors on 1)"
    )
    print(f"{'contender':30} {'shape':>9} {'per node (each node)':>22} {'pub/sub':>8} {'CS':>7}")
    for row in rows:
        each = "/".join(str(count) for count in row.peak)
        shape = "distinct" if row.shape == "distinct" else "one line"
        print(
            f"{row.label:30} {shape:>9} {max(row.peak):>8} ({each:>11}) "
            f"{max(row.pubsub):8d} {row.sections:7d}"
        )
    return rows


# -- 4. listing and status -------------------------------------------------------------------


@dataclass
class ListingRow:
    size: int
    full_best: float
    full_median: float
    capped: float
    status_best: float
    status_median: float


def listing_and_status(urls: list[str], sizes: Sequence[int], runs: int = 3) -> list[ListingRow]:
    from benchmarks.listing import hold, measure
    from django_redlock.core.health import status

    manager = LockManager(urls, ttl=TTL, node_timeout=2.0)
    leases: list[Lease] = []
    rows = []
    try:
        for size in sorted(sizes):
            hold(manager, leases, size)
            times = measure(manager, size, runs)
            walls = []
            for _ in range(runs):
                start = time.perf_counter()
                report = status(manager)
                walls.append(time.perf_counter() - start)
            if report.voting != len(urls):
                raise SystemExit(f"status: {report.voting} of {len(urls)} nodes voting")
            rows.append(
                ListingRow(
                    size,
                    times.best,
                    times.median,
                    times.capped,
                    min(walls),
                    statistics.median(walls),
                )
            )
    finally:
        for lease in leases:
            lease.release()
        manager.close()
    print(
        f"\n4. listing and status with locks held on {len(urls)} nodes (best and median of "
        f"{runs}; ms)"
    )
    print(
        f"{'held':>6} {'locks(limit=None)':>18} {'median':>7} {'locks() capped':>15} "
        f"{'status()':>9} {'median':>7}"
    )
    for row in rows:
        print(
            f"{row.size:6d} {row.full_best * 1000:18.0f} {row.full_median * 1000:7.0f} "
            f"{row.capped * 1000:15.0f} {row.status_best * 1000:9.1f} "
            f"{row.status_median * 1000:7.1f}"
        )
    print("  redis-py Lock and python-redis-lock: N/A (neither lists held locks)")
    return rows


# -- 5. server CPU per critical section ------------------------------------------------------


def _cpu_worker(
    kind: str, urls: list[str], threads: int, seconds: float, ready: Any, go: Any, out: Any
) -> None:
    locker = _locker(kind, urls)
    for index in range(threads):  # connect and load scripts before the clock starts
        with locker(f"scale:u:{kind}:warm:{index}"):
            pass
    ready.put(1)
    go.wait()
    deadline = time.monotonic() + seconds
    done = [0] * threads

    def loop(index: int) -> None:
        while time.monotonic() < deadline:
            with locker(f"scale:u:{kind}:one"):
                busy_until = time.perf_counter() + 0.001  # the 1 ms critical section
                while time.perf_counter() < busy_until:
                    pass
            done[index] += 1

    workers = [threading.Thread(target=loop, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put(sum(done))


def _server_cpu(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        cpu = _info(url, "cpu")
        total += float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
    return total


@dataclass
class CpuRow:
    label: str
    waiters: int
    sections: list[int]  # per run
    per_second: list[float]
    cpu_us_per_section: list[float]


def _cpu_run(
    kind: str, urls: list[str], threads: int, seconds: float, processes: int
) -> tuple[int, float, float]:
    """One run: critical sections, their rate, and the servers' CPU µs per section."""
    context = multiprocessing.get_context("spawn")
    ready, go, out = context.Queue(), context.Event(), context.Queue()
    workers = [
        context.Process(target=_cpu_worker, args=(kind, urls, threads, seconds, ready, go, out))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    before, start = _server_cpu(urls), time.perf_counter()
    go.set()
    sections = sum(out.get(timeout=180) for _ in workers)
    elapsed = time.perf_counter() - start  # the tail included: waiters still in line finish
    used = _server_cpu(urls) - before
    for worker in workers:
        worker.join(60)
    return sections, sections / elapsed, used / max(sections, 1) * 1e6


def server_cpu(
    urls: list[str],
    waiters: Sequence[int],
    seconds: float = 2.0,
    processes: int = 4,
    runs: int = 3,
) -> list[CpuRow]:
    """Ours at N=1 and N=len(urls) and the anchors on the first node: ``processes``
    processes with waiters / processes threads each on one key; ``runs`` runs, each in a
    rotated order of the contenders."""
    contenders = [("django_redlock", "django_redlock N=1", 1)]
    if len(urls) > 1:
        contenders.append(("django_redlock", f"django_redlock N={len(urls)}", len(urls)))
    contenders += [(kind, LABELS[kind], 1) for kind in ANCHORS]
    threads_of = {count: max(1, count // processes) for count in waiters}
    rows = {
        (label, count): CpuRow(label, threads_of[count] * processes, [], [], [])
        for count in waiters
        for _, label, _ in contenders
    }
    for run_index in range(runs):
        shift = run_index % len(contenders)
        for count in waiters:
            for kind, label, n in contenders[shift:] + contenders[:shift]:
                sections, rate, cpu = _cpu_run(
                    kind, urls[:n], threads_of[count], seconds, processes
                )
                row = rows[label, count]
                row.sections.append(sections)
                row.per_second.append(rate)
                row.cpu_us_per_section.append(cpu)
    print(
        f"\n5. server CPU per critical section, one key, 1 ms busy-waited critical section, "
        f"{processes} processes x waiters/{processes} threads, {seconds:g} s each, medians of "
        f"{runs} runs (INFO CPU used_cpu_sys+used_cpu_user, summed over the lock's nodes)"
    )
    print(f"{'contender':30} {'waiters':>8} {'CS/s':>6} {'server CPU µs/CS':>17}  (each run)")
    for count in waiters:
        for _, label, _ in contenders:
            row = rows[label, count]
            each = ", ".join(f"{cpu:.0f}" for cpu in row.cpu_us_per_section)
            print(
                f"{label:30} {row.waiters:8d} {statistics.median(row.per_second):6.0f} "
                f"{statistics.median(row.cpu_us_per_section):17.0f}  ({each})"
            )
    low, high = min(waiters), max(waiters)
    for _, label, _ in contenders:
        first, last = rows[label, low], rows[label, high]
        growth = statistics.median(last.cpu_us_per_section) / max(
            statistics.median(first.cpu_us_per_section), 1e-9
        )
        print(
            f"  {label}: {first.waiters} -> {last.waiters} waiters: {growth - 1:+.0%} server "
            f"CPU per CS"
        )
    return list(rows.values())


# -- all of it -------------------------------------------------------------------------------


def run(cluster3: LocalCluster, *, pairs: int = 4000, held: int = 10_000,
        sizes: Sequence[int] = (1000, 10_000, 50_000), seconds: float = 2.0) -> None:  # fmt: skip
    """Every section, on its own nodes where it needs them: 9 for the pair p50, a fresh one
    for the bytes, ``cluster3`` for the rest."""
    print(
        f"\nW10 scale: ttl {TTL:g} s for held locks, node timeout {NODE_TIMEOUT * 1000:g} ms "
        f"for the pairs"
    )
    with LocalCluster(9) as cluster9:
        pair_p50(cluster9.urls, (1, 3, 5, 7, 9), pairs, rounds=8)
    with LocalCluster(1) as cluster1:
        held_bytes(cluster1.urls[0], held)
    connections(cluster3.urls)
    listing_and_status(cluster3.urls, sizes)
    server_cpu(cluster3.urls, (8, 32, 64), seconds)
