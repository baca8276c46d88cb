"""A seeded fault storm on five real nodes: no two holders overlap within validity (issue 22).

Nine client processes (``tests/storm_worker.py``) take a mutex, a semaphore of 2 and the two
sides of a read-write lock over and over, auto-extended, each hold often longer than the
ttl, while this test pauses (SIGSTOP), resumes, kills and restarts a minority of the nodes
(at most two of five faulty at once; a restarted node has lost its keys and is judged by the
restart rule) and stops clients for longer than their lease (a GC pause). Each client logs
the interval in which it held each lease within its validity, on the machine's one
monotonic clock; afterwards the intervals must never break the lease's rule: one holder of
the mutex, at most two of the semaphore, no writer beside anyone. With the behaviour before
issue 22 put back, every strict run (below) broke it: a renewal that missed its quorum freed
the keys of a still-valid lease.

Each interval ends when the holder released it, when its validity ran out, or when a round
told it that a quorum no longer holds its keys (``lease.lost``, and ``lease.validity`` 0
from then on). ``REDLOCK_STORM_STRICT=1`` ignores the last: a lease judged "gone" counts
until its validity ends, so an overlap then shows that the library itself let a rival in.
Strict runs found one such defect (a lease judged gone freed the keys that still kept
rivals out; fixed in flow.lost_clean_up); 36 strict runs after the fix found none.

Three of the five nodes also fail over (issue 39; ``tests/failover_node.py``): a master and
its replica behind one address. The replica is made to lag (paused, its link closed) for a
random while, the master is killed, and after a random outage the replica is promoted without
what the master wrote meanwhile, the address switched to it; the old master comes back as its
replica, so the node can fail over again. Once per storm the three fail over together, as in
a zone's outage: their replicas lag the same while, then each master is killed and its replica
promoted before the next, all within a moment, so a majority of the nodes forgot the same
leases. Only the rule for promoted replicas (``scripts/node_rule.lua``) then keeps a rival
out. A failover counts as a fault from the kill to the promotion; the lag does not (the master
serves), nor does the promoted process's quarantine, since that is what is under test.

The single failovers cannot show that rule broken: every renewal puts a lease's key back where
it is missing (``scripts/extend.lua``), so a forgetful node is repaired within a third of the
ttl, and a rival needs three forgetful nodes at once, which the two-fault budget allows only by
chance (with ``promoted`` always false in node_rule.lua and single failovers only, 1 overlap in
36 runs). With the zone's failover and ``promoted`` always false, 4 of 8 runs reported an
overlap (a rival granted by the three promoted nodes while a holder's lease still ran; 13 of
26 over this schedule's drafts); with the rule in place, none of 31 runs (Valkey, Redis 7,
strict).

The seed is printed on failure (``REDLOCK_STORM_SEED=<seed>`` replays that schedule of
faults; the servers' and the clients' own timing still varies).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock.localnodes import LocalNode
from tests.failover_node import FailoverNode
from tests.storm_worker import MAX_TTL

pytestmark = pytest.mark.slow

SECONDS = 14.0
# The clients' validity already sets aside the drift term (ttl * 0.01 + 2 ms); this allows
# for the instants a process reads its clock around a round, nothing more.
TOLERANCE = 0.005
CLIENTS = ("lock", "lock", "lock", "semaphore", "semaphore", "semaphore", "read", "write", "write")
LIMITS = {"lock": 1, "semaphore": 2}
# Seconds a node still counts as faulty after it resumed or restarted: the clients renew every
# ttl / 3 (1 s ttl) and put back keys a node lost at their next renewal.
GRACE = 0.6
Interval = dict[str, Any]  # one line of a client's log (tests/storm_worker.py)
# The nodes (of five) that fail over, and how: the replica lags for LAG seconds (or longer, while
# two nodes are already faulty: then the kill waits), the node is down for OUTAGE seconds
# between the kill and the promotion (what Sentinel or a managed service takes to notice; none
# in the zone's failover), and a replica is failed over to only once it has been up longer than
# the quarantine (plus a second: uptime_in_seconds counts whole seconds), as replicas in
# service have: a younger one would be quarantined for its uptime anyway, and the rule for
# promotions would go untested. The zone's failover starts ZONE_AT seconds into the storm, or
# as soon as after that every replica is fit; the single failovers come after it.
FAILING_OVER = (2, 3, 4)
LAG = (0.3, 2.0)
OUTAGE = (0.0, 0.3)
REPLICA_AGE = MAX_TTL + 1.0
ZONE_AT = (REPLICA_AGE + 0.5, 5.0)


def overlaps(intervals: list[Interval], limit: int) -> list[tuple[Interval, ...]]:
    """Sets of more than ``limit`` intervals of different processes that share an instant
    (by more than the tolerance)."""
    events = sorted(
        [(i["start"] + TOLERANCE, 1, n) for n, i in enumerate(intervals)]
        + [(i["end"], -1, n) for n, i in enumerate(intervals)],
        key=lambda event: (event[0], event[1]),
    )
    live: set[int] = set()
    found = []
    for _, step, index in events:
        if step < 0:
            live.discard(index)
            continue
        if intervals[index]["end"] <= intervals[index]["start"] + TOLERANCE:
            continue
        live.add(index)
        if len(live) > limit:
            found.append(tuple(intervals[n] for n in sorted(live)))
    return found


def writer_overlaps(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    writes = [i for i in intervals if i["kind"] == "write"]
    return [
        (w, o)
        for w in writes
        for o in intervals
        if o is not w and o["start"] + TOLERANCE < w["end"] and w["start"] + TOLERANCE < o["end"]
    ]


@pytest.fixture
def failover_nodes() -> Iterator[list[FailoverNode]]:
    """The nodes that fail over, started (in a short directory: unix socket paths are limited),
    and stopped after the test."""
    directory = Path(tempfile.mkdtemp(prefix="rl-fs-", dir="/tmp"))
    made: list[FailoverNode] = []
    try:
        for index in FAILING_OVER:
            made.append(FailoverNode(directory, f"f{index}"))
        yield made
    finally:
        for node in made:
            node.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_no_two_holders_overlap_within_validity_under_a_fault_storm(
    cluster5, failover_nodes, tmp_path
):
    seed = int(os.environ.get("REDLOCK_STORM_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    log = tmp_path / "leases.jsonl"
    root = Path(__file__).resolve().parents[2]
    nodes: list[LocalNode | FailoverNode] = list(cluster5)
    for index, node in zip(FAILING_OVER, failover_nodes, strict=True):
        nodes[index] = node
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.storm_worker",
                kind,
                str(seed + n),
                str(SECONDS),
                str(log),
                *(node.url for node in nodes),
            ],
            cwd=root,
            stdin=subprocess.DEVNULL,
        )
        for n, kind in enumerate(CLIENTS)
    ]
    # A node counts as faulty from the fault until a renewal had the time to put back what
    # it lost (keys expire on a node paused longer than the ttl, and a restart loses them):
    # node index -> None while paused, else the instant it stops counting. Redlock tolerates
    # a minority of faulty nodes, so at most two at once.
    faulty: dict[int, float | None] = {}
    stopped: dict[int, float] = {}  # client index -> when to resume it
    # Failovers under way: node index -> when to kill its master (its replica lags until
    # then), then -> when to promote its replica (its master is dead until then).
    lagging: dict[int, tuple[float, float]] = {}  # node index -> (kill at, outage)
    down: dict[int, float] = {}
    failovers = 0
    zone_failover = False
    zone_kill_at: float | None = None
    zone_at = time.monotonic() + rng.uniform(*ZONE_AT)
    faults = []

    def resume(index: int, now: float) -> None:
        nodes[index].resume()
        faulty[index] = now + GRACE

    def may_fail_over(index: int, now: float) -> bool:
        node = nodes[index]
        return (
            isinstance(node, FailoverNode)
            and index not in faulty
            and index not in lagging
            and zone_kill_at is None
            and node.replica_age() >= REPLICA_AGE
            and node.replica_synced()
        )

    def pair(index: int) -> FailoverNode:
        node = nodes[index]
        assert isinstance(node, FailoverNode)
        return node

    try:
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.05, 0.3))
            now = time.monotonic()
            for index, until in list(stopped.items()):
                if now >= until:
                    clients[index].send_signal(signal.SIGCONT)
                    del stopped[index]
            for index, healed in list(faulty.items()):
                if healed is not None and now >= healed:
                    del faulty[index]
            for index, (kill_at, outage) in list(lagging.items()):
                # The kill is a fault; while two nodes are faulty it waits, and the replica
                # falls further behind.
                if now >= kill_at and (len(faulty) < 2 or index in faulty):
                    pair(index).kill_master()
                    del lagging[index]
                    down[index] = now + outage
                    faulty[index] = math.inf
            for index, promote_at in list(down.items()):
                if now >= promote_at:
                    pair(index).promote()
                    del down[index]
                    failovers += 1
                    # Counted until the promotion, not through the promoted process's
                    # quarantine: whether it keeps out of the votes is under test.
                    del faulty[index]
            if (
                zone_kill_at is not None
                and now >= zone_kill_at
                and len(faulty) < 2
                and not any(index in faulty for index in FAILING_OVER)
            ):
                # Each master killed and its replica promoted before the next is killed: one
                # fault at a time beside at most one other, all within a moment.
                for index in FAILING_OVER:
                    pair(index).kill_master()
                    pair(index).promote()
                    failovers += 1
                zone_kill_at = None
            action = rng.choice(("pause", "resume", "restart", "client", "client", "failover"))
            node = rng.randrange(5)
            # A failover that is due (the zone's, or a kill) takes the next free slot: a new
            # pause or restart would keep it waiting, and so would a pause that only a resume
            # drawn for that very node ends (seconds); a storm might then end with no
            # failover (seeds 201 and 1004). So then a paused node is resumed instead.
            zone_due = not zone_failover and now >= zone_at
            overdue = (
                zone_due
                or (zone_kill_at is not None and now >= zone_kill_at)
                or any(now >= kill_at for kill_at, _ in lagging.values())
            )
            paused = sorted(index for index, healed in faulty.items() if healed is None)
            if overdue and action in ("pause", "resume", "restart"):
                action = "resume" if paused else "wait"
                node = rng.choice(paused) if paused else node
            if zone_due and all(may_fail_over(index, now) for index in FAILING_OVER):
                # Once per storm, a zone's failover: every replica lags the same while, then
                # the masters fail over one after the other at once, each counted as a fault
                # only from its kill to its promotion, so never more than one of them. A
                # majority of the nodes then forgot the same leases, within one renewal.
                zone_failover = True
                zone_kill_at = now + rng.uniform(*LAG)
                for index in FAILING_OVER:
                    pair(index).cut_the_link()
            if action == "failover":  # one node (after the zone's failover)
                node = rng.choice(FAILING_OVER)
                if zone_failover and may_fail_over(node, now):
                    pair(node).cut_the_link()
                    lagging[node] = (now + rng.uniform(*LAG), rng.uniform(*OUTAGE))
            elif action == "pause" and len(faulty) < 2 and node not in faulty:
                nodes[node].pause()
                faulty[node] = None
            elif action == "resume" and node in faulty and faulty[node] is None:
                resume(node, now)
            elif (
                action == "restart"
                and (len(faulty) < 2 or node in faulty)
                and node not in down  # its master is dead, its replica about to take over
            ):
                nodes[node].restart()  # lost its keys: quarantined for max_ttl (2 s)
                # Faulty until its quarantine is over, not only GRACE: a quarantined node does
                # not vote, so counting it healed sooner let three or more nodes be out at
                # once, and a storm (seed 784564196) then granted too few leases to check.
                faulty[node] = time.monotonic() + MAX_TTL + GRACE
            elif action == "client":
                index = rng.randrange(len(clients))
                if index not in stopped and clients[index].poll() is None:
                    clients[index].send_signal(signal.SIGSTOP)  # longer than its 1 s ttl
                    stopped[index] = now + rng.uniform(0.3, 2.0)
            faults.append(action)
    finally:
        for index in list(stopped):
            clients[index].send_signal(signal.SIGCONT)
        for index, healed in faulty.items():
            if healed is None:
                nodes[index].resume()
        for index in lagging:
            pair(index).catch_up()
        if zone_kill_at is not None:
            for index in FAILING_OVER:
                pair(index).catch_up()
        for index in down:
            pair(index).promote()
        for client in clients:
            try:
                client.wait(SECONDS + 30)
            except subprocess.TimeoutExpired:
                client.kill()
    assert all(client.returncode == 0 for client in clients), f"seed {seed}"
    leases = [json.loads(line) for line in log.read_text().splitlines()]
    if not os.environ.get("REDLOCK_STORM_STRICT"):
        for lease in leases:
            lease["end"] = lease["told"]
    by_kind = {kind: [i for i in leases if i["kind"] == kind] for kind in ("lock", "semaphore")}
    rw = [i for i in leases if i["kind"] in ("read", "write")]
    # Not vacuous: every kind was held many times, through faults.
    assert all(len(by_kind[kind]) >= 5 for kind in by_kind), (seed, len(leases))
    assert sum(i["kind"] == "write" for i in rw) >= 1, (seed, len(rw))
    assert {"pause", "restart", "client"} <= set(faults), (seed, faults)
    # The zone's failover took place (its three promotions come first).
    assert failovers >= len(FAILING_OVER), (seed, failovers, faults)
    for kind, limit in LIMITS.items():
        found = overlaps(by_kind[kind], limit)
        assert found == [], f"seed {seed}: {kind} overlap: {found[:3]}"
    beside = writer_overlaps(rw)
    assert beside == [], f"seed {seed}: a writer beside another holder: {beside[:3]}"
