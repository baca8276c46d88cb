"""The cost of each node in W1, by a fit over every node count instead of two.

W1 reports the cost of each node past the first as ``(p50 at N=5 - p50 at N=1) / 4``. On this
2-core machine the pair at N=1 is often slower than at N=3 (the lone node and the client
hand the cores to each other), so that difference moves by more than the figure itself. This
runs W1's pair (acquire + release of a fresh key) for ours, the minimal Redlock and the
same-commands floor at every N from 1 to 5 on the first N of the same five nodes,
interleaved (each round runs every contender at every N, in a rotating order), and fits a
straight line to the p50 at each N: its slope is the cost of each node.

Run: ``python -m benchmarks.per_node [--rounds 16] [--pairs 150]``; µs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.pairs import PairRunner, minimal, ours, same_commands
from django_redlock.localnodes import LocalCluster

SIZES = (1, 2, 3, 4, 5)


def _pairs(urls: list[str]) -> dict[str, PairRunner]:
    return {"minimal Redlock": minimal(urls), "same-commands floor": same_commands(urls),
            "django_redlock": ours(urls)}  # fmt: skip


def slope(values: list[float]) -> float:
    """The least-squares slope of ``values`` over ``SIZES``."""
    mean_n, mean_v = statistics.mean(SIZES), statistics.mean(values)
    covariance = sum((n - mean_n) * (v - mean_v) for n, v in zip(SIZES, values, strict=True))
    return covariance / sum((n - mean_n) ** 2 for n in SIZES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=150, help="pairs per contender per round")
    options = parser.parse_args()
    with LocalCluster(5) as cluster:
        runners = {n: _pairs(cluster.urls[:n]) for n in SIZES}
        cells = [(label, n) for n in SIZES for label in runners[n]]
        samples: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
        for round_index in range(options.rounds + 1):  # round 0 warms up, not counted
            shift = round_index % len(cells)
            for label, n in cells[shift:] + cells[:shift]:
                run = runners[n][label]
                for index in range(options.pairs):
                    started = time.perf_counter()
                    if not run(f"pn:{round_index}:{n}:{index}:{label[:4]}"):
                        raise RuntimeError(f"{label} N={n}: a pair failed")
                    if round_index:
                        samples[label, n].append(time.perf_counter() - started)
    print(f"W1 pair p50 (µs) at N = 1..5, {options.rounds} rounds of {options.pairs} pairs")
    for label in runners[1]:
        p50 = [statistics.median(samples[label, n]) * 1e6 for n in SIZES]
        cells_text = " ".join(f"{value:7.1f}" for value in p50)
        print(f"{label:22} {cells_text}   slope {slope(p50):5.1f} µs/node")


if __name__ == "__main__":
    main()
