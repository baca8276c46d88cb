"""W9: operator listings at size: ``python -m benchmarks.listing [--cluster] [N ...]``
(default 1000 10000 50000).

Starts 3 local nodes and holds N locks on every node, taken by the library itself
(``lock_many`` of 1,000 names at a time, then an extend, which waits for every node), so the
listing reads the very keys ``acquire.lua`` writes. With ``--cluster`` each node is a
Redis/Valkey Cluster of 3 shards (``LocalShardedNode``), and each batch of names shares a hash
tag of its own (``lock_many`` needs one slot), so the locks spread over every shard. For each
N it prints:

- ``manager.locks(limit=None)`` (every lock): the best and the median wall time of 5 runs,
  and the client's CPU time (all threads) of the best run; on a shared machine the CPU time
  moves less with the load than the wall time;
- ``manager.locks()`` (the default cap, 1,000): its time, how many locks it shows, how many
  of them it flags ``partial`` (held locks: must be 0), and ``approx_total``/``not_shown``;
- ``core.health.status(manager)`` (what ``redlock_status`` reports): best and median of 5.

Tests never assert speed; this is where the listing's timing claims are measured.
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass

from django_redlock import Lease, LockManager
from django_redlock.core.health import status
from django_redlock.core.listing import LockListing
from django_redlock.localnodes import LocalCluster, server_version
from django_redlock.localshards import LocalShardedNode

RUNS = 5
BATCH = 1000  # names per lock_many (at most 1024)


def _timed(manager: LockManager, limit: int | None) -> tuple[float, float, LockListing]:
    cpu, wall = time.process_time(), time.perf_counter()
    listing = manager.locks(limit=limit)
    return time.perf_counter() - wall, time.process_time() - cpu, listing


@dataclass(frozen=True)
class ListingTimes:
    """One size's figures: the full listing's best and median wall time and the best run's
    client CPU time, then the capped listing's time and what it showed (seconds)."""

    size: int
    best: float
    median: float
    best_cpu: float
    capped: float
    capped_listing: LockListing

    @property
    def flagged(self) -> int:
        """Locks of the capped listing flagged ``partial`` (held locks: must be 0)."""
        return sum(1 for lock in self.capped_listing.locks if lock.partial)


def hold(manager: LockManager, leases: list[Lease], size: int, tagged: bool = False) -> None:
    """Take locks until ``leases`` holds ``size`` of them on every node (``lock_many`` of
    :data:`BATCH` names at a time, then an extend, which waits for every node: the acquire
    stopped at a quorum). ``tagged``: each batch's names share a hash tag of their own (one
    slot per batch, as ``lock_many`` on cluster nodes needs)."""
    first = sum(len(lease.names) for lease in leases)
    while first < size:
        count = min(BATCH, size - first)
        tag = f"{{b{first // BATCH}}}" if tagged else ""
        lease = manager.lock_many([f"bench:{tag}{first + i:06d}" for i in range(count)])
        lease.extend()
        leases.append(lease)
        first += count


def measure(manager: LockManager, size: int, runs: int = RUNS) -> ListingTimes:
    """Time ``manager.locks(limit=None)`` ``runs`` times and the capped default once, with
    ``size`` locks held (checked: the full listing must show them all)."""
    timed = [_timed(manager, None) for _ in range(runs)]
    best = min(timed, key=lambda run: run[0])
    if len(best[2].locks) != size:
        raise SystemExit(f"listed {len(best[2].locks)} of {size} held locks")
    capped, _, listing = _timed(manager, 1000)
    return ListingTimes(
        size=size,
        best=best[0],
        median=statistics.median(wall for wall, _, _ in timed),
        best_cpu=best[1],
        capped=capped,
        capped_listing=listing,
    )


def _nodes(stack: ExitStack, cluster: bool) -> list[str]:
    """The URLs of 3 lock nodes started on ``stack``: plain servers, or clusters of 3 shards."""
    if not cluster:
        return stack.enter_context(LocalCluster(3)).urls
    urls = []
    for index in range(3):
        node = LocalShardedNode(3, name=f"w9-{index}")
        stack.callback(node.stop)
        urls.append(node.start().url)
    return urls


def main(sizes: list[int], cluster: bool = False) -> None:
    shape = "clusters of 3 shards" if cluster else "plain servers"
    print(f"lock nodes: 3 {shape}, {server_version()}")
    with ExitStack() as stack:
        # A generous node timeout: setting up 50,000 locks must not fail on a busy machine.
        manager = LockManager(_nodes(stack, cluster), ttl=600.0, node_timeout=2.0)
        leases: list[Lease] = []
        for size in sorted(sizes):
            hold(manager, leases, size, tagged=cluster)
            times = measure(manager, size)
            capped = times.capped_listing
            walls = []
            for _ in range(RUNS):
                began = time.perf_counter()
                report = status(manager)
                walls.append(time.perf_counter() - began)
            if report.voting != 3:
                raise SystemExit(f"status: {report.voting} of 3 nodes voting")
            print(
                f"{size:>6} held: full listing best {times.best * 1000:.0f} ms "
                f"(median {times.median * 1000:.0f} ms, "
                f"client CPU {times.best_cpu * 1000:.0f} ms); "
                f"capped at 1000: {times.capped * 1000:.0f} ms, {len(capped.locks)} shown, "
                f"{times.flagged} flagged partial, about {capped.approx_total}, "
                f"{capped.not_shown} not shown; status() best {min(walls) * 1000:.1f} ms "
                f"(median {statistics.median(walls) * 1000:.1f} ms)",
                flush=True,
            )
        for lease in leases:
            lease.release()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    on_clusters = "--cluster" in arguments
    sizes = [int(arg) for arg in arguments if arg != "--cluster"]
    main(sizes or [1000, 10000, 50000], cluster=on_clusters)
