"""Cluster nodes beside plain nodes: ``./run bench --only cluster --nodes 1,3``.

Each lock node is a Redis/Valkey Cluster of :data:`SHARDS` masters
(:class:`~django_redlock.localshards.LocalShardedNode`), against the same with each node a
single plain server process; every server listens on TCP (127.0.0.1), so the two differ in
clustering only (the other workloads use unix sockets: their figures are not comparable with
these). At each node count of ``--nodes``:

- W1: one client, acquire + release of fresh keys: p50/p99 µs per pair, and the client's CPU
  per pair (``time.process_time``: user + system, this process only);
- W2: 4 processes on distinct keys: pairs/s, and the servers' CPU per pair and node (every
  member of a cluster counted: a pair costs one shard of each node);
- each beside the same-commands floor (``benchmarks/floor.py`` on plain nodes,
  ``benchmarks/floor_cluster.py`` on cluster nodes: the minimal client sending our very
  commands, routed by slot as ours routes them), so the routing's cost is seen at equal work;
- W1i: client instructions per W1 pair by callgrind (``benchmarks/instructions.py``'s method:
  a run with pairs minus a run without, divided by the pairs; noise-immune), for ours and
  the floor on plain and on cluster nodes; skipped with a note when valgrind is missing.

Ratios are of the medians of ``--runs`` runs, with each run's own ratio beside them, as the
other workloads print them. Then the paper estimate of what 3 nodes of 16 shards would carry,
from the measured server CPU per pair on one shard and the client's CPU per pair.

Units: times in µs, rates per second, CPU in µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack

from benchmarks.floor import SameCommandsRedlock
from benchmarks.floor_cluster import RoutedSameCommands
from benchmarks.pairs import NODE_TIMEOUT, TTL, PairRunner, _redlock_pairs
from django_redlock import LockManager, LockNotAcquired
from django_redlock.localnodes import LocalCluster, LocalNode
from django_redlock.localshards import LocalShardedNode

SHARDS = 3
"""Masters per cluster node (5 cluster nodes of 3 make 15 server processes)."""

KINDS = ("ours plain", "ours cluster", "floor plain", "floor cluster")


class Setup:
    """``size`` plain TCP nodes and ``size`` cluster nodes of ``shards`` masters, started
    together, stopped on exit (only what it started)."""

    def __init__(self, size: int, shards: int = SHARDS) -> None:
        self.size, self.shards = size, shards
        self.stack = ExitStack()
        self.plain: LocalCluster | None = None
        self.clusters: list[LocalShardedNode] = []

    def __enter__(self) -> Setup:
        try:
            self.plain = self.stack.enter_context(LocalCluster(self.size, tcp=True))
            for index in range(self.size):
                node = LocalShardedNode(self.shards, name=f"b{index}")
                self.stack.callback(node.stop)
                self.clusters.append(node.start())
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def urls(self, kind: str, n: int) -> list[str]:
        assert self.plain is not None
        if kind.endswith("plain"):
            return self.plain.urls[:n]
        return [node.url for node in self.clusters[:n]]

    def servers(self, kind: str, n: int) -> list[LocalNode]:
        assert self.plain is not None
        if kind.endswith("plain"):
            return self.plain.nodes[:n]
        return [member for node in self.clusters[:n] for member in node.members]


def _runner(
    kind: str, urls: list[str], stack: ExitStack, node_timeout: float = NODE_TIMEOUT
) -> PairRunner:
    """A W1 pair runner of ``kind`` (one of :data:`KINDS`) on ``urls``, closed with
    ``stack``: ours (a ``LockManager``, as ``benchmarks/pairs.py``'s), the same-commands floor
    (``benchmarks/floor.py``) or the one that routes by slot (``benchmarks/floor_cluster.py``)."""
    if kind.startswith("ours"):
        manager = LockManager(urls, ttl=TTL, node_timeout=node_timeout)
        stack.callback(manager.close)

        def run(name: str) -> bool:
            try:
                lease = manager.acquire(name, blocking=False)
            except LockNotAcquired:
                return False
            lease.release()
            return True

        return run
    floor: SameCommandsRedlock | RoutedSameCommands
    if kind == "floor plain":
        floor = SameCommandsRedlock(urls, node_timeout)
    else:
        floor = RoutedSameCommands(urls, node_timeout)
    stack.callback(floor.close)
    return _redlock_pairs(floor)


def _labels(nodes: list[int]) -> list[tuple[str, str, int]]:
    return [(f"{kind} N={n}", kind, n) for n in nodes for kind in KINDS]


def _ratios(
    nodes: list[int], of: Callable[[str], list[float]], measure: str, line: Callable[..., str]
) -> None:
    print(f"cluster / plain ({measure}; the routing's cost), and the client's share:")
    for n in nodes:
        print(line(f"N={n}: ours cluster / ours plain", of(f"ours cluster N={n}"),
                   of(f"ours plain N={n}")))  # fmt: skip
        print(line(f"N={n}: floor cluster / floor plain", of(f"floor cluster N={n}"),
                   of(f"floor plain N={n}")))  # fmt: skip
        print(line(f"N={n}: client's share on clusters, ours / floor", of(f"ours cluster N={n}"),
                   of(f"floor cluster N={n}")))  # fmt: skip
        print(line(f"N={n}: client's share on plain nodes, ours / floor", of(f"ours plain N={n}"),
                   of(f"floor plain N={n}")))  # fmt: skip


def w1(setup: Setup, nodes: list[int], pairs: int, rounds: int, runs: int) -> dict[str, float]:
    """W1 on both kinds of node; returns each contender's client CPU µs per pair (median)."""
    from benchmarks.__main__ import Result, _measure, _percentile, _ratio_line

    contenders = [
        (label, _runner(kind, setup.urls(kind, n), setup.stack))
        for label, kind, n in _labels(nodes)
    ]
    for label, run in contenders:  # connections, slot maps, script caches
        _measure(Result(label), run, 50, "warm")
    per_run: list[dict[str, Result]] = []
    cpu: dict[str, list[float]] = {label: [] for label, _ in contenders}
    per_round = max(1, pairs // (rounds * runs))
    for run_index in range(runs):
        results = {label: Result(label) for label, _ in contenders}
        spent = dict.fromkeys(results, 0.0)
        for round_index in range(rounds):
            shift = (run_index * rounds + round_index) % len(contenders)
            for label, run in contenders[shift:] + contenders[:shift]:
                before = time.process_time()
                _measure(results[label], run, per_round, f"c{run_index}.{round_index}")
                spent[label] += time.process_time() - before
        for label, result in results.items():
            cpu[label].append(spent[label] / len(result.pair_us) * 1e6)
        per_run.append(results)

    def p50(label: str) -> list[float]:
        return [statistics.median(results[label].pair_us) for results in per_run]

    print(
        f"\nW1 on cluster nodes of {setup.shards} shards and on plain nodes (TCP): one client, "
        f"{pairs} pairs each, {runs} runs of {rounds} interleaved rounds; medians of the runs"
    )
    print(f"{'contender':26} {'p50 µs':>8} {'p99 µs':>8} {'client CPU µs':>14} {'ok':>6}")
    for label, _ in contenders:
        p99 = [_percentile(results[label].pair_us, 0.99) for results in per_run]
        ok = sum(results[label].successes for results in per_run) / sum(
            results[label].attempts for results in per_run
        )
        print(
            f"{label:26} {statistics.median(p50(label)):8.0f} {statistics.median(p99):8.0f} "
            f"{statistics.median(cpu[label]):14.0f} {ok:6.1%}"
        )
    _ratios(nodes, p50, "p50 pair time, lower is better", _ratio_line)
    return {label: statistics.median(each) for label, each in cpu.items()}


def w2(setup: Setup, nodes: list[int], seconds: float, runs: int) -> dict[str, float]:
    """W2 on both kinds of node; returns each contender's server CPU µs per pair and node."""
    from benchmarks.__main__ import _cpu_seconds, _ratio_line, _rotations
    from benchmarks.contention import run_w2

    print(f"\nW2 on both kinds of node: 4 processes, distinct keys, {seconds:g} s each, "
          f"medians of {runs} runs")  # fmt: skip
    print(f"{'contender':26} {'pairs/s':>9} {'server CPU µs/pair/node':>24}")
    labels = _labels(nodes)
    rates: dict[str, list[float]] = {label: [] for label, _, _ in labels}
    server: dict[str, list[float]] = {label: [] for label, _, _ in labels}
    for order in _rotations(labels, runs):
        for label, kind, n in order:
            pids = [node.pid for node in setup.servers(kind, n) if node.pid is not None]
            before = _cpu_seconds(pids)
            worker_kind = "floor_cluster" if kind == "floor cluster" else kind.split()[0]
            worker_kind = "django_redlock" if worker_kind == "ours" else worker_kind
            rate = run_w2(worker_kind, setup.urls(kind, n), seconds)
            rates[label].append(rate)
            spent = _cpu_seconds(pids) - before
            server[label].append(spent / max(rate * seconds, 1) / n * 1e6)
    for label, _, _ in labels:
        print(
            f"{label:26} {statistics.median(rates[label]):9.0f} "
            f"{statistics.median(server[label]):24.1f}"
        )
    _ratios(nodes, rates.__getitem__, "pairs/s, higher is better", _ratio_line)
    return {label: statistics.median(each) for label, each in server.items()}


def w1i(setup: Setup, nodes: list[int], pairs: int) -> None:
    import shutil

    from benchmarks.instructions import per_pair

    print(f"\nW1i on both kinds of node: client instructions per W1 pair ({pairs} pairs)")
    if shutil.which("valgrind") is None:
        print("  skipped: valgrind is not installed (apt install valgrind)")
        return
    counts: dict[str, float] = {}
    print(f"{'contender':26} {'instructions':>13}")
    for label, kind, n in _labels(nodes):
        counts[label] = per_pair(kind, pairs, setup.urls(kind, n), module="benchmarks.cluster")
        print(f"{label:26} {counts[label]:13,.0f}")
    print("ratios (same run; fewer is better):")
    for n in nodes:
        for a, b in (("ours cluster", "ours plain"), ("floor cluster", "floor plain"),
                     ("ours cluster", "floor cluster"), ("ours plain", "floor plain")):  # fmt: skip
            ratio = counts[f"{a} N={n}"] / counts[f"{b} N={n}"]
            extra = counts[f"{a} N={n}"] - counts[f"{b} N={n}"]
            print(f"  N={n}: {a} / {b} = {ratio:.2f}x  ({extra:+,.0f} per pair)")


def estimate(nodes: list[int], client_cpu: dict[str, float], server_cpu: dict[str, float]) -> None:
    """What 3 nodes of 16 shards each would carry, on paper (assumptions printed)."""
    n = 3 if 3 in nodes else max(nodes)
    shard_us = server_cpu.get(f"ours cluster N={n}")
    client_us = client_cpu.get(f"ours cluster N={n}")
    if shard_us is None or client_us is None:
        return
    per_node = 16 * 1e6 / shard_us
    print(f"\nOn paper, 3 nodes of 16 shards (from N={n} above): a pair costs each node "
          f"{shard_us:.1f} µs of one shard's CPU, the client {client_us:.0f} µs")  # fmt: skip
    print(f"  servers' bound: 16 shards x 1e6 / {shard_us:.1f} = {per_node:,.0f} pairs/s "
          f"(each shard a core of its own, slots spread evenly, no replicas)")  # fmt: skip
    print(f"  client cores to reach it: {per_node:,.0f} x {client_us:.0f} µs = "
          f"{per_node * client_us / 1e6:,.0f} cores")  # fmt: skip


def run(
    nodes: list[int],
    *,
    pairs: int = 4000,
    rounds: int = 8,
    runs: int = 3,
    seconds: float = 3.0,
    instruction_pairs: int = 300,
) -> None:
    """The whole cluster workload (module docstring) on its own nodes; ``instruction_pairs``
    0 leaves W1i out."""
    with Setup(max(nodes)) as setup:
        size = max(nodes)
        print(f"\ncluster nodes: {SHARDS} shards each (N={','.join(map(str, nodes))}: "
              f"{size * SHARDS} cluster members beside {size} plain nodes)")  # fmt: skip
        client_cpu = w1(setup, nodes, pairs, rounds, runs)
        server_cpu = w2(setup, nodes, seconds, runs)
        if instruction_pairs:
            w1i(setup, nodes, instruction_pairs)
        estimate(nodes, client_cpu, server_cpu)


WARM_UP = 200


def child(kind: str, pairs: int, urls: list[str]) -> None:
    """The process callgrind measures: warm up, then ``pairs`` pairs on fresh keys."""
    with ExitStack() as stack:
        # A 2 s socket timeout: the client is slow under valgrind, the servers are not.
        run = _runner(kind, urls, stack, node_timeout=2.0)
        for index in range(WARM_UP):
            if not run(f"c1i:warm:{index}"):
                raise SystemExit(f"{kind}: a warm-up pair failed")
        for index in range(pairs):
            if not run(f"c1i:{index}"):
                raise SystemExit(f"{kind}: a pair failed")


def main(argv: list[str]) -> int:
    if argv and argv[0] in KINDS:  # the callgrind child: kind, pairs, urls
        child(argv[0], int(argv[1]), argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster")
    parser.add_argument("--nodes", default="1,3", help="node counts, comma-separated")
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--instruction-pairs", type=int, default=300)
    args = parser.parse_args(argv)
    nodes = sorted({int(part) for part in args.nodes.split(",")})
    run(nodes, pairs=args.pairs, runs=args.runs, seconds=args.seconds,
        instruction_pairs=args.instruction_pairs)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
