"""Operators' views of lock nodes that are Redis/Valkey Clusters (issue 42): ``locks()`` (and
the admin page and ``redlock_status``, which list through it) walks every shard of every
cluster and merges each lock's keys across the nodes, in the names users gave."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from django_redlock import LockManager, QuorumUnreachable, get_manager
from django_redlock.core.health import declare_fresh, status
from django_redlock.core.listing import _literal_prefix, escape_glob, plain_key
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, key_slot
from tests.cluster.conftest import on_every_node

PREFIX = "redlock:"


def _manager(nodes: list[LocalShardedNode]) -> LockManager:
    return LockManager([node.url for node in nodes], ttl=30.0, node_timeout=0.5)


def test_plain_key_undoes_the_cluster_form() -> None:
    for key in ("redlock:job", "redlock:{t}a", "redlock:a}b", "redlock:s\x00s3", "redlock:r\x00r"):
        assert plain_key(cluster_key(key).encode(), PREFIX) == key.encode()
    assert plain_key(b"{other:job}", PREFIX) is None
    assert plain_key(b"other:{t}job", PREFIX) is None


def test_a_listing_pattern_that_is_a_prefix_is_tested_as_one() -> None:
    """A cluster node's walk finds keys with a looser pattern (either form of a lock key)
    and tests each key's plain form: by its prefix when the pattern is one and ``*``."""
    assert _literal_prefix(escape_glob("redlock:a*b[?") + "*") == b"redlock:a*b[?"
    assert _literal_prefix(escape_glob("redlock:x\\") + "*") == b"redlock:x\\"
    assert _literal_prefix(escape_glob("redlock:x*")) is None  # no final glob star
    assert _literal_prefix("redlock:*[aA]*") is None  # a search text


def test_locks_lists_every_shard_of_every_cluster(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    manager = _manager(sharded3)
    names = [f"{unique}job{index:02}" for index in range(30)]
    held = [manager.acquire(name) for name in names]
    held.append(manager.acquire(f"{unique}{{tenant}}:order"))
    semaphore = manager.semaphore(f"{unique}sem", 3)
    held += [semaphore.acquire(blocking=False), semaphore.acquire(blocking=False)]
    held.append(manager.rwlock(f"{unique}rw").read(blocking=False))
    keys = [cluster_key(PREFIX + name) for name in names]
    assert len({sharded3[0].serving(key_slot(key)).name for key in keys}) == 3
    for key in [*keys, PREFIX + f"{unique}{{tenant}}:order"]:
        on_every_node(sharded3, key)
    on_every_node(sharded3, cluster_key(PREFIX + f"{unique}sem\x00s1"))
    on_every_node(sharded3, cluster_key(PREFIX + f"{unique}rw\x00r"))
    try:
        listing = manager.locks(unique)
        assert listing.unreachable == []
        assert listing.not_shown == 0
        labels = [lock.label for lock in listing.locks]
        assert labels == sorted(
            [
                *names,
                f"{unique}{{tenant}}:order",
                f"{unique}rw [read]",
                f"{unique}sem [semaphore slot 0]",
                f"{unique}sem [semaphore slot 1]",
            ],
            key=lambda label: label.replace(" [", "\x00"),
        )
        for lock in listing.locks:
            assert (lock.nodes, lock.total, lock.partial) == (3, 3, False)
            assert lock.ttl_max is not None
            assert 20 < lock.ttl_max <= 30
            assert lock.owner.get("thread") == "MainThread"
        capped = manager.locks(unique, limit=5)
        assert [lock.label for lock in capped.locks] == labels[:5]
        assert capped.not_shown == len(labels) - 5
        assert [lock.name for lock in manager.locks(f"{unique}job1").locks] == names[10:20]
    finally:
        for lease in held:
            lease.release()


def test_a_cluster_with_a_shard_down_is_unreachable_for_the_listing(
    unique: str,
) -> None:
    nodes = [LocalShardedNode(2, name=f"u{index}").start() for index in range(3)]
    try:
        manager = _manager(nodes)
        lease = manager.acquire(f"{unique}x")
        on_every_node(nodes, cluster_key(PREFIX + f"{unique}x"))
        nodes[0].masters[1].kill()
        listing = manager.locks(unique)
        assert listing.unreachable == [manager.addresses[0].label]
        assert [(lock.name, lock.nodes) for lock in listing.locks] == [(f"{unique}x", 2)]
        report = status(manager, timeout=1.0, record=False)
        assert [node.vote for node in report.nodes] == ["down", "votes", "votes"]
        # Its master is unreachable, or already marked failed and left out of the map
        # (its slots then have no master): either way its locks get no vote there.
        assert not report.nodes[0].votes
        assert report.nodes[0].problems
        assert report.voting == 2
        lease.release()
    finally:
        for node in nodes:
            node.stop()


def test_status_judges_every_shard(sharded3: list[LocalShardedNode]) -> None:
    manager = _manager(sharded3)
    report = status(manager, timeout=1.0, record=False)
    assert (report.voting, report.healthy) == (3, True)
    for node, cluster in zip(report.nodes, sharded3, strict=True):
        assert node.votes, node
        assert node.role == "cluster of 3 shards"
        assert [shard.master for shard in node.shards] == [
            f"127.0.0.1:{master.port}" for master in cluster.masters
        ]
        assert [shard.slots for shard in node.shards] == [
            f"{low}-{high}" for low, high in cluster.ranges
        ]
        assert all(shard.votes and shard.role == "master" for shard in node.shards)
        assert len(set(filter(None, (shard.run_id for shard in node.shards)))) == 3
    shards = report.as_dict()["nodes"][0]["shards"]
    assert [shard["votes"] for shard in shards] == [True, True, True]


def _restarted(node: LocalShardedNode, shard: int) -> None:
    """Kill shard ``shard``'s master and start it again, empty: it rejoins the cluster with
    its slots (nodes.conf), its data and its marker gone."""
    node.masters[shard].restart()
    node.wait_formed()


def test_a_restarted_shard_is_quarantined_alone_until_declared(unique: str, settings: Any) -> None:
    nodes = [LocalShardedNode(2, name=f"q{index}").start() for index in range(3)]
    try:
        manager = _manager(nodes)
        cluster = nodes[0]
        names = {
            cluster.owner_of(key_slot(cluster_key(PREFIX + f"{unique}{index}"))).name: (
                f"{unique}{index}"
            )
            for index in range(40)
        }
        on_restarted, on_other = names[cluster.masters[1].name], names[cluster.masters[0].name]
        manager.acquire(on_restarted).release()  # every node classified, every shard voted
        _restarted(cluster, 1)
        report = status(manager, timeout=1.0, record=False)
        first = report.nodes[0]
        assert first.vote == "quarantined"
        assert [shard.vote for shard in first.shards] == ["votes", "quarantined"]
        assert f"127.0.0.1:{cluster.masters[1].port}" in first.vote_detail
        assert [node.vote for node in report.nodes[1:]] == ["votes", "votes"]
        alone = LockManager([cluster.url], ttl=30.0, node_timeout=0.5)
        alone.acquire(on_other, blocking=False).release()  # its other shard votes
        with pytest.raises(QuorumUnreachable, match=r"(?i)quarantin"):
            alone.acquire(on_restarted, blocking=False)
        # The command an operator runs: it cannot tell a new node from a restarted one
        # here (no witness records on these clusters), so it asks; --yes confirms.
        settings.REDLOCK = {"NODES": [node.url for node in nodes]}
        out = io.StringIO()
        call_command("redlock_declare_fresh", manager.addresses[0].label, "--yes", stdout=out)
        assert f"127.0.0.1:{cluster.masters[1].port}" in out.getvalue()
        assert status(manager, timeout=1.0, record=False).nodes[0].votes
        (again,) = declare_fresh([manager.addresses[0]], timeout=1.0)
        assert again.declared, again  # each shard's process named again: still votes
        assert status(manager, timeout=1.0, record=False).nodes[0].votes
        alone.acquire(on_restarted, blocking=False).release()
    finally:
        for node in nodes:
            node.stop()


def test_redlock_status_shows_each_shard(
    sharded3: list[LocalShardedNode], unique: str, settings: Any
) -> None:
    settings.REDLOCK = {"NODES": [node.url for node in sharded3]}
    lease = get_manager().acquire(f"{unique}shown")
    for node in sharded3:
        on_every_node([node], cluster_key(PREFIX + f"{unique}shown"))
    out = io.StringIO()
    call_command("redlock_status", "--prefix", unique, stdout=out)
    text = out.getvalue()
    for node in sharded3:
        for master, (low, high) in zip(node.masters, node.ranges, strict=True):
            assert f"shard 127.0.0.1:{master.port}  slots {low}-{high}  votes  master" in text
    assert f"{unique}shown  3/3 nodes" in text
    out = io.StringIO()
    call_command("redlock_status", "--json", "--prefix", unique, stdout=out)
    payload = json.loads(out.getvalue())
    assert [len(node["shards"]) for node in payload["nodes"]] == [3, 3, 3]
    assert [lock["name"] for lock in payload["locks"]] == [f"{unique}shown"]
    lease.release()
