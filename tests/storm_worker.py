"""One client of the fault storm (tests/core/test_fault_storm.py).

``python -m tests.storm_worker KIND SEED SECONDS LOG URL...`` takes leases of ``KIND``
(``lock``: a mutex; ``semaphore``: a semaphore of 2; ``read``/``write``: the two sides of one
read-write lock) over and over for ``SECONDS``, auto-extended, holding each for a random time
(often longer than the ttl, so renewals must get through), and appends one JSON line per
lease to ``LOG``: the kind, the slot, and the interval in which it held the lease *within its
validity*: from the grant to the release, cut at the instant its validity ran out ("end"),
and also at the instant it was told that a quorum no longer holds it ("told"; from then on
``lease.validity`` is 0). Times are
``time.monotonic()``, one clock for every process of the machine (CLOCK_MONOTONIC), so the
test can compare intervals across processes.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time

from django_redlock import Lease, LeaseReleased, LockLost, LockManager, RedlockError

TTL = 1.0
MAX_TTL = 2.0


def take(manager: LockManager, kind: str) -> Lease:
    if kind == "lock":
        return manager.acquire("storm:lock", ttl=TTL, timeout=2.0, auto_extend=True)
    if kind == "semaphore":
        slots = manager.semaphore("storm:semaphore", 2)
        return slots.acquire(ttl=TTL, timeout=2.0, auto_extend=True)
    rwlock = manager.rwlock("storm:rw")
    side = rwlock.read if kind == "read" else rwlock.write
    return side(ttl=TTL, timeout=2.0, auto_extend=True)


def main() -> int:
    kind, seed, seconds, log, *urls = sys.argv[1:]
    rng = random.Random(int(seed))
    manager = LockManager(urls, ttl=TTL, node_timeout=0.05, max_ttl=MAX_TTL, retry_delay=0.05)
    deadline = time.monotonic() + float(seconds)
    with open(log, "a", encoding="utf-8") as out:
        while time.monotonic() < deadline:
            try:
                lease = take(manager, kind)
            except RedlockError:
                continue
            time.sleep(rng.choice((0.0, 0.05, 0.2, 0.6, 1.5, 4.0)))
            # Held within validity until the release was asked for, or until the validity
            # its last renewal gave ran out ("end"), or until it was told that a quorum no
            # longer holds it, from when its ``lease.validity`` is 0 ("told").
            end = min(time.monotonic(), lease._expires_at)
            with contextlib.suppress(LockLost, LeaseReleased):
                lease.release()
            told = end if lease.lost_at is None else min(end, lease.lost_at)
            record = {
                "kind": lease.kind,
                "slot": lease.slot,
                "pid": manager_pid(),
                "start": lease.acquired_at,
                "end": end,
                "told": told,
                "lost": lease.lost_cause,
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
    manager.close()
    return 0


def manager_pid() -> int:
    import os

    return os.getpid()


if __name__ == "__main__":
    sys.exit(main())
