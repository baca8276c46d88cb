"""The checker's guards on a force release's eviction (``tests/sim/invariants.py``), each
pinned on its own.

A lease whose round left before an operator's force release landed is still a lease like any
other when a quorum of its keys were set after the release's DEL. The checker counts a node's
key as set after the DEL only where it can date it: on a node the DEL ran on, whose process
has not restarted since (a restart from an everysec AOF or an RDB snapshot may bring back a key
from before the DEL), that is up, and whose key has not expired. And an evicted lease is
watched again after a renewal only when no force release is still on its way. Each guard keeps
the checker from trusting a key it cannot date: without one, a false report waits to happen in
some history, and the explorations may not meet it, so each case is set up here by hand.
"""

from __future__ import annotations

from tests.sim.world import Config, LeaseRecord, World

NAME = "lock0"
KEY = b"redlock:" + NAME.encode()
TOKEN = "t0k3n"


def world_with_keys(holding: tuple[int, ...], ran: tuple[int, ...]) -> World:
    """Three nodes (quorum 2): those in ``holding`` hold TOKEN's key; the latest force release
    of NAME ran on those in ``ran`` (their processes as they are now)."""
    world = World(0, Config(nodes=3))
    for index in holding:
        world.nodes[index].space.data[KEY] = TOKEN.encode() + b" owner"
    world.checker.force_ran[NAME] = {index: world.nodes[index].incarnation for index in ran}
    return world


def evicted(record: LeaseRecord) -> bool:
    return record.revoked is not None


def holds(world: World) -> bool:
    return world.checker._holds_after_force(NAME, TOKEN)


def test_a_quorum_of_keys_on_the_nodes_the_release_ran_on_makes_the_lease_whole() -> None:
    assert holds(world_with_keys(holding=(0, 1), ran=(0, 1, 2)))
    assert not holds(world_with_keys(holding=(0,), ran=(0, 1, 2)))


def test_a_node_the_release_never_ran_on_does_not_count() -> None:
    # Node 2 was down when the DEL went out: its key may date from before the release.
    assert not holds(world_with_keys(holding=(0, 2), ran=(0, 1)))


def test_a_node_restarted_since_the_release_ran_there_does_not_count() -> None:
    world = world_with_keys(holding=(0, 1), ran=(0, 1, 2))
    world.nodes[1].start_process()  # a new process: it may have loaded a key from before
    assert not holds(world)


def test_a_node_that_is_down_does_not_count() -> None:
    world = world_with_keys(holding=(0, 1), ran=(0, 1, 2))
    world.nodes[1].state = "down"
    assert not holds(world)


def test_an_expired_key_does_not_count() -> None:
    world = world_with_keys(holding=(0, 1), ran=(0, 1, 2))
    node = world.nodes[1]
    node.space.expires[KEY] = node.now_us() // 1000 - 1
    assert not holds(world)
    node.space.expires[KEY] = node.now_us() // 1000 + 1000
    assert holds(world)


def test_an_evicted_lease_is_watched_again_only_when_no_force_release_is_on_its_way() -> None:
    world = world_with_keys(holding=(0, 1, 2), ran=(0, 1, 2))
    checker = world.checker
    record = LeaseRecord(0, NAME, TOKEN, 0.0, 1.0, ((NAME, "x"),), revoked=0.0)
    checker.forcing[NAME] = 1  # a second force release's DELs still on their way
    checker.renewed(record, 2.0)
    assert evicted(record)
    assert record not in checker.leases.get(NAME, [])
    checker.forcing[NAME] = 0
    checker.renewed(record, 3.0)
    assert not evicted(record)
    assert record in checker.leases[NAME]
    assert not checker.violations
