"""W8 without the machine's noise: what a full collection costs with N held leases, counted
by valgrind's cache simulator instead of timed (issue 28, item 4).

``python -m benchmarks.gc_model N MODE K`` makes N leases as the engine grants them (no node is
contacted: the rounds are not what is measured), owned in MODE ``plain`` (registered for
re-entry, as ``benchmarks.gc_pause`` holds them), ``auto`` (auto-extended too: guard and
extender; ttl 300 s, so none is renewed meanwhile) or ``bare`` (not registered), then runs K
full collections. MODE ``floor`` holds N of :class:`FloorLease` instead (the cheapest lease
Python can hold, no lease of ours), ``floor2`` 2N of them (two tracked objects per lease, as
ours had). Under callgrind, counting only inside the collector::

    valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 --LL=4194304,16,64 \\
        --collect-atstart=no --toggle-collect=gc_collect_main \\
        --callgrind-out-file=out.K python -m benchmarks.gc_model 50000 plain K

the cost of one full collection is (totals at K=8 - totals at K=2) / 6 (the collections made
while importing and building count in both), and N=0 gives the empty process's. The events
are instructions (Ir), first-level data misses (D1mr) and last-level ones (DLmr) of a 4 MB
cache: a stand-in for the share of a shared L3 a busy machine leaves, fixed so that two trees
compare alike.
"""

from __future__ import annotations

import gc
import sys
import time

from django_redlock import LockManager
from django_redlock.core.lease import held_on, settle_grant
from django_redlock.core.manager import Lease
from django_redlock.core.owner import owner_scope
from django_redlock.procedures.shapes import Shape

TTL = 300.0


class FloorLease:
    """The cheapest lease Python can hold: one tracked object (``__slots__``: no ``__dict__``,
    no weakref slot), its name, key, token and times in one tuple of strings and floats, which
    the collector untracks (it holds nothing that can form a cycle)."""

    __slots__ = ("state",)

    def __init__(self, state: tuple[str | float, ...]) -> None:
        self.state = state


def floor_leases(count: int) -> list[FloorLease]:
    """``count`` :class:`FloorLease` objects, each with its own strings; their tuples are
    untracked by the second full collection after this."""
    now = time.time()
    return [
        FloorLease((f"w8-{i}", f"redlock:w8-{i}", f"{i:040x}", TTL, now + TTL, now))
        for i in range(count)
    ]


def main() -> None:
    count, mode, collections = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    # Never contacted: leases are made as a grant makes them, with no round.
    manager = LockManager(
        ["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"], ttl=TTL
    )
    engine = manager.engine
    scope = owner_scope()
    record = engine.owners.record(None)
    held = held_on([True, True, True])
    leases: list[object] = []
    if mode in ("floor", "floor2"):
        leases.extend(floor_leases(count * (2 if mode == "floor2" else 1)))
        count = 0  # no lease of ours
    for i in range(count):
        name = f"w8-{i}"
        now = engine.clock()
        lease = Lease(
            manager,
            name=name,
            key=engine.key_prefix + name,
            token=f"{i:040x}",
            ttl=TTL,
            expires_at=now + TTL,
            acquired_at=now,
            shape=Shape(engine.key_prefix + name),
        )
        settle_grant(lease, record, held)
        if mode != "bare":
            engine.own(lease, scope, mode == "auto", None, 0.0)
        leases.append(lease)
    gc.collect()
    gc.collect()  # a tuple refers to one made since the last: untracked by the second
    gc.disable()
    start = time.thread_time()
    for _ in range(collections):
        gc.collect()
    spent = time.thread_time() - start
    print(f"{len(leases)} {mode} leases: {collections} full collections, {spent:.3f} s CPU")


if __name__ == "__main__":
    main()
