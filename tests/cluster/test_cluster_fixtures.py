"""The cluster fixtures form real clusters: every slot served, by the master the fixture
assigned it to, every member agreeing, replicas synced."""

from __future__ import annotations

import socket

import pytest

from django_redlock.localshards import BUS_OFFSET, LocalShardedNode, free_port_pair, slot_ranges
from django_redlock.wire.cluster import SLOTS, parse_shards


def test_slot_ranges_cover_every_slot_once() -> None:
    for shards in (1, 2, 3, 5, 16):
        ranges = slot_ranges(shards)
        assert ranges[0][0] == 0
        assert ranges[-1][1] == SLOTS - 1
        assert all(low <= high for low, high in ranges)
        assert all(ranges[i][1] + 1 == ranges[i + 1][0] for i in range(shards - 1))


def test_free_port_pair_skips_a_pair_whose_bus_port_is_taken() -> None:
    taken: set[int] = set()
    port = free_port_pair(taken)
    assert {port, port + BUS_OFFSET} <= taken
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port + BUS_OFFSET))  # still free: it was only probed
    assert free_port_pair(taken) not in (port, port + BUS_OFFSET)


def test_bad_arguments_are_refused_where_written() -> None:
    with pytest.raises(ValueError, match="shards"):
        LocalShardedNode(0)
    with pytest.raises(TypeError, match="shards"):
        LocalShardedNode(True)
    with pytest.raises(ValueError, match="replicas"):
        LocalShardedNode(3, replicas=2)


def test_each_cluster_serves_every_slot_from_the_assigned_master(
    sharded3: list[LocalShardedNode],
) -> None:
    for node in sharded3:
        for member in node.masters:
            with node.client(member) as client:
                slot_map = parse_shards(client.execute_command("CLUSTER", "SHARDS"), "127.0.0.1")
            assert len(slot_map.shards) == 3
            for master, (low, high) in zip(node.masters, node.ranges, strict=True):
                for slot in (low, (low + high) // 2, high):
                    assert slot_map.master_of(slot) == ("127.0.0.1", master.port)
                    assert node.owner_of(slot) is master


def test_replicas_follow_their_masters(replicated: LocalShardedNode) -> None:
    for master, replica in zip(replicated.masters, replicated.replicas, strict=True):
        with replicated.client(replica) as client:
            info = client.info("replication")
        assert info["role"] == "slave"
        assert int(info["master_port"]) == master.port
        assert info["master_link_status"] == "up"
