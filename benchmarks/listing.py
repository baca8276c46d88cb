"""W9: operator listings at size: ``python -m benchmarks.listing [N ...]`` (default 1000
10000 50000).

Starts 3 local nodes and holds N locks on every node, taken by the library itself
(``lock_many`` of 1,000 names at a time, then an extend, which waits for every node), so the
listing reads the very keys ``acquire.lua`` writes. For each N it prints:

- ``manager.locks(limit=None)`` (every lock): the best and the median wall time of 5 runs,
  and the client's CPU time (all threads) of the best run; on a shared machine the CPU time
  moves less with the load than the wall time;
- ``manager.locks()`` (the default cap, 1,000): its time, how many locks it shows, how many
  of them it flags ``partial`` (held locks: must be 0), and ``approx_total``/``not_shown``.

Tests never assert speed; this is where the listing's timing claims are measured.
"""

from __future__ import annotations

import statistics
import sys
import time

from django_redlock import Lease, LockManager
from django_redlock.core.listing import LockListing
from django_redlock.localnodes import LocalCluster, server_version

RUNS = 5
BATCH = 1000  # names per lock_many (at most 1024)


def _timed(manager: LockManager, limit: int | None) -> tuple[float, float, LockListing]:
    cpu, wall = time.process_time(), time.perf_counter()
    listing = manager.locks(limit=limit)
    return time.perf_counter() - wall, time.process_time() - cpu, listing


def main(sizes: list[int]) -> None:
    print(f"lock nodes: 3 x {server_version()}")
    with LocalCluster(3) as cluster:
        # A generous node timeout: setting up 50,000 locks must not fail on a busy machine.
        manager = LockManager(cluster.urls, ttl=600.0, node_timeout=2.0)
        leases: list[Lease] = []
        for size in sorted(sizes):
            while len(leases) * BATCH < size:
                first = len(leases) * BATCH
                count = min(BATCH, size - first)
                lease = manager.lock_many([f"bench:{first + i:06d}" for i in range(count)])
                lease.extend()  # every node holds every lock (the acquire stopped at a quorum)
                leases.append(lease)
            runs = [_timed(manager, None) for _ in range(RUNS)]
            walls = [wall for wall, _, _ in runs]
            best = min(runs, key=lambda run: run[0])
            if len(best[2].locks) != size:
                raise SystemExit(f"listed {len(best[2].locks)} of {size} held locks")
            wall, _, capped = _timed(manager, 1000)
            flagged = sum(1 for lock in capped.locks if lock.partial)
            print(
                f"{size:>6} held: full listing best {best[0] * 1000:.0f} ms "
                f"(median {statistics.median(walls) * 1000:.0f} ms, "
                f"client CPU {best[1] * 1000:.0f} ms); "
                f"capped at 1000: {wall * 1000:.0f} ms, {len(capped.locks)} shown, "
                f"{flagged} flagged partial, about {capped.approx_total}, "
                f"{capped.not_shown} not shown",
                flush=True,
            )
        for lease in leases:
            lease.release()


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [1000, 10000, 50000])
