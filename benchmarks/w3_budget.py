"""W3's CPU budget: what one critical section costs the clients and the servers, in CPU.

W3 (``benchmarks/contention.py``) runs 8 processes on one key, each holding it for a 1 ms
busy loop, on a machine of 2 cores shared with every node. The busy holder takes one core for
the whole millisecond, so everything else a critical section needs (the release, the grants or
the retries, the next try, the servers' scripts, waking the next holder) must fit on the other
core, or it pushes the next body back. This runs W3's workload again, the same way for every
contender (every worker connected and warmed up, then one window of ``--seconds`` for all:
``benchmarks.contention.launch``), and measures, per critical section:

- the clients' CPU: every worker's own user and system time (``getrusage``) over the run,
  the 1 ms busy loop included; and of that, the CPU inside the acquire calls (the wait, the
  tries, the wake-up) and inside the release calls (``time.thread_time`` around each);
- the servers' CPU: ``INFO cpu`` of every node, from the start of the window to the end of
  the run (user + system);
- the script calls each node ran (``INFO commandstats``: ``evalsha`` and ``eval``), and its
  ``SET`` calls: the minimal client's acquire, and for ours and the floors the grant's
  ``SET`` inside the release script (commandstats counts the commands a script calls too);
- the two cores' load: CPU spent over twice the wall time from the start of the window to
  the end of the last critical section (1.0: both cores busy throughout);
- for every contender, the gap from one body's end to the next body's start (p50), and how
  long the holder's release took (p50), from stamps each worker takes around its body.

``--hold sleep`` holds with ``time.sleep`` instead of the busy loop: the CPU the body used is
then free for the rest, which shows how far a contender's throughput is bound by CPU.

Run: ``python -m benchmarks.w3_budget [--nodes 5] [--seconds 3] [--hold busy|sleep]
[--only django_redlock,minimal]``. Each contender is run once per invocation, in the order
given; run it twice, or in both orders, to see the noise.
Units: µs per critical section unless named.
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks.contention import launch, make_locker, ready, window_end
from django_redlock.localnodes import LocalCluster

HOLD = 0.001  # seconds: W3's critical section
PROCESSES = 8


def _worker(
    index: int, go: Any, start: Any, out: Any, kind: str, urls: list[str], seconds: float,
    hold: str,
) -> None:  # fmt: skip
    locker = make_locker(kind, urls)
    ready(kind, locker, index, out)
    deadline = window_end(go, start, seconds)
    before = resource.getrusage(resource.RUSAGE_SELF)
    # (body start, body end, release end) on the machine-wide monotonic clock
    sections: list[tuple[float, float, float]] = []
    # CPU seconds (user + system) of this thread inside the acquire and the release calls
    acquiring = releasing = 0.0
    cpu = time.thread_time
    while time.monotonic() < deadline:
        lock = locker(f"w3b:{kind}:shared")
        asked = cpu()
        lock.__enter__()
        try:
            acquiring += cpu() - asked
            start = time.monotonic()
            if hold == "busy":
                until = time.perf_counter() + HOLD
                while time.perf_counter() < until:
                    pass
            else:
                time.sleep(HOLD)
            end = time.monotonic()
            leaving = cpu()
        finally:
            lock.__exit__(None, None, None)
        releasing += cpu() - leaving
        sections.append((start, end, time.monotonic()))
    after = resource.getrusage(resource.RUSAGE_SELF)
    usage = (
        after.ru_utime - before.ru_utime,
        after.ru_stime - before.ru_stime,
        acquiring,
        releasing,
    )
    out.put((usage, sections))


def _server_state(clients: list[redis.Redis]) -> tuple[float, int, int]:
    """Every node's CPU seconds (user + system), script calls and SET calls, summed."""
    cpu, scripts, sets = 0.0, 0, 0
    for client in clients:
        info = client.info("cpu")
        cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        stats = client.info("commandstats")
        scripts += sum(
            stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval")
        )
        sets += stats.get("cmdstat_set", {}).get("calls", 0)
    return cpu, scripts, sets


@dataclass(frozen=True)
class Budget:
    """One contender's run: per critical section unless named."""

    kind: str
    per_second: float
    client_user_us: float
    client_system_us: float
    acquire_cpu_us: float  # the clients' CPU inside acquire calls (the wait included)
    release_cpu_us: float  # the clients' CPU inside release calls
    server_cpu_us: float
    scripts_per_node: float
    sets_per_node: float
    load: float  # CPU spent / (2 cores x wall time)
    gap_p50_us: float
    release_p50_us: float


def run(kind: str, cluster: LocalCluster, seconds: float, hold: str) -> Budget:
    clients = [redis.Redis.from_url(url) for url in cluster.urls]
    # The nodes' counters and the time at the start of the window.
    marks: list[tuple[tuple[float, int, int], float]] = []
    results = launch(
        _worker,
        (kind, cluster.urls, seconds, hold),
        PROCESSES,
        lambda: marks.append((_server_state(clients), time.monotonic())),
    )
    after = _server_state(clients)
    for client in clients:
        client.close()
    ((before, began),) = marks
    sections = sorted(section for _, own in results for section in own)
    wall = max(released for _, _, released in sections) - began
    count = len(sections)
    usages = [usage for usage, _ in results]
    user, system, acquiring, releasing = (sum(column) for column in zip(*usages, strict=True))
    client_cpu = user + system
    server_cpu = after[0] - before[0]
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(sections)]
    releases = [end - body_end for _, body_end, end in sections]
    nodes = len(cluster.urls)
    return Budget(
        kind=kind,
        per_second=count / seconds,
        client_user_us=user / count * 1e6,
        client_system_us=system / count * 1e6,
        acquire_cpu_us=acquiring / count * 1e6,
        release_cpu_us=releasing / count * 1e6,
        server_cpu_us=server_cpu / count * 1e6,
        scripts_per_node=(after[1] - before[1]) / count / nodes,
        sets_per_node=(after[2] - before[2]) / count / nodes,
        load=(client_cpu + server_cpu) / (2 * wall),
        gap_p50_us=statistics.median(gaps) * 1e6 if gaps else 0.0,
        release_p50_us=statistics.median(releases) * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", choices=("busy", "sleep"), default="busy")
    parser.add_argument("--only", default="django_redlock,minimal")
    options = parser.parse_args()
    print(
        f"W3 budget: {PROCESSES} processes, one key, 1 ms hold ({options.hold}), "
        f"N={options.nodes}, {options.seconds:g} s, {os.cpu_count()} cores"
    )
    header = (
        f"{'contender':16} {'CS/s':>6} {'client user':>11} {'system':>7} {'acquire':>8} "
        f"{'release':>8} {'server CPU':>10} {'scripts/node':>12} {'SETs/node':>9} "
        f"{'load':>5} {'gap p50':>8} {'release p50':>11}"
    )
    print(header)
    print("  (per critical section: µs of CPU, calls, µs of wall)")
    with LocalCluster(options.nodes) as cluster:
        for kind in options.only.split(","):
            got = run(kind, cluster, options.seconds, options.hold)
            print(
                f"{got.kind:16} {got.per_second:6.0f} {got.client_user_us:11.0f} "
                f"{got.client_system_us:7.0f} {got.acquire_cpu_us:8.0f} {got.release_cpu_us:8.0f} "
                f"{got.server_cpu_us:10.0f} {got.scripts_per_node:12.2f} "
                f"{got.sets_per_node:9.2f} {got.load:5.2f} {got.gap_p50_us:8.0f} "
                f"{got.release_p50_us:11.0f}"
            )


if __name__ == "__main__":
    main()
