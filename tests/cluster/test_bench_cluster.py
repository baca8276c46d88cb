"""The cluster benchmark (``benchmarks/cluster.py``) and its floor that routes by slot
(``benchmarks/floor_cluster.py``): the floor sends, to the master that owns the lock's slot in
each cluster, what a ``LockManager`` sends there, and is a correct Redlock; the benchmark's
code runs end to end on a tiny setting. Its speed is measured by ``./run bench --only
cluster``, never here."""

from __future__ import annotations

import re
from contextlib import ExitStack, closing

import pytest

from benchmarks import cluster
from benchmarks.floor_cluster import RoutedSameCommands
from django_redlock import LockManager, LockNotAcquired
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, key_slot
from tests.helpers import votes_recorded
from tests.test_floor import _times

# The token: the 40 hex digits after the keys (a cluster node's acquire declares four).
_TOKEN = re.compile(r"^(EVAL(?:SHA)? [0-9a-f]{40} (\d) (?:\S+ ){1,4})[0-9a-f]{40} ")


def _normalized(command: str) -> str:
    return _times(_TOKEN.sub(r"\1<token> ", command))


TTL_MS = 10_000


def test_it_sends_what_a_lock_manager_sends_to_the_slots_owner(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    urls = [node.url for node in sharded3]
    name = f"same-{unique}"
    slot = key_slot(cluster_key(f"redlock:{name}"))
    manager = LockManager(urls, ttl=TTL_MS / 1000, node_timeout=1.0)
    with ExitStack() as stack:
        stack.callback(manager.close)
        floor = stack.enter_context(closing(RoutedSameCommands(urls, 1.0)))
        # Names over every shard: both connected to each (no hello in what follows).
        for index in range(24):
            manager.acquire(f"warm-{unique}-{index}", blocking=False).release()
            warm = floor.acquire(f"redlock:warm-{unique}-{index}", TTL_MS)
            assert warm is not None
            assert floor.release(warm)
        votes_recorded(manager)  # nor the vote recorder's writes (core/witness.py)
        monitors = []
        for node in sharded3:
            client = stack.enter_context(closing(node.client(node.serving(slot))))
            monitors.append(stack.enter_context(client.monitor()))
        manager.acquire(name, blocking=False).release()
        held = floor.acquire(f"redlock:{name}", TTL_MS)
        assert held is not None
        assert floor.release(held)
        for monitor in monitors:
            scripts: list[str] = []
            while len(scripts) < 4:
                command = monitor.next_command()["command"]
                if command.startswith(("EVALSHA", "EVAL ")):
                    scripts.append(_normalized(command))
            ours_acquire, ours_release, its_acquire, its_release = scripts
            for part in ("<token>", "<ms>", "<us>", "{redlock:" + name + "}"):
                assert part in ours_acquire
            assert its_acquire == ours_acquire
            assert its_release == ours_release


def test_it_is_a_redlock_that_ours_sees(sharded3: list[LocalShardedNode], unique: str) -> None:
    urls = [node.url for node in sharded3]
    manager = LockManager(urls, ttl=TTL_MS / 1000)
    with closing(RoutedSameCommands(urls)) as floor:
        try:
            # Names over several slots, so that more than one lane (shard) is used.
            for index in range(12):
                name = f"held-{unique}-{index}"
                held = floor.acquire(f"redlock:{name}", TTL_MS)
                assert held is not None
                assert 0 < held.validity < TTL_MS / 1000
                with pytest.raises(LockNotAcquired):
                    manager.acquire(name, blocking=False)
                assert floor.acquire(f"redlock:{name}", TTL_MS) is None
                assert floor.release(held)
                manager.acquire(name, blocking=False).release()
            assert len(floor._lanes) > 1
        finally:
            manager.close()


def test_the_callgrind_child_runs_each_contender(sharded3: list[LocalShardedNode]) -> None:
    # What W1i runs under valgrind, here without it: each kind's pairs all succeed.
    urls = [node.url for node in sharded3]
    for kind in ("ours cluster", "floor cluster"):
        cluster.child(kind, 5, urls)


# It starts its own nodes inside benchmarks/cluster.py's Setup, which the fast set's scan does
# not follow: said here.
@pytest.mark.processes
def test_the_benchmark_runs_end_to_end_on_a_tiny_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster.run([1], pairs=16, rounds=2, runs=1, seconds=0.3, instruction_pairs=0)
    out = capsys.readouterr().out
    w1, _, rest = out.partition("\nW2 ")
    for kind in cluster.KINDS:
        (row,) = [line for line in w1.splitlines() if line.startswith(f"{kind} N=1 ")]
        assert row.endswith("100.0%"), row
        (row,) = [line for line in rest.splitlines() if line.startswith(f"{kind} N=1 ")]
        rate, server = row.split()[-2:]
        assert float(rate) > 0, row
        assert float(server) > 0, row
    assert "N=1: ours cluster / ours plain = " in w1
    assert "N=1: client's share on clusters, ours / floor = " in rest
    assert "servers' bound: 16 shards" in rest
