"""Real Redis/Valkey Clusters for the cluster tests: the bundled server (or
``$REDLOCK_SERVER_BIN``) with ``--cluster-enabled yes``, slots assigned by the fixture.

``sharded3``: three lock nodes, each a cluster of three masters, started once per session (each
cluster forms in a few seconds). ``sharded1``: one cluster of three masters, each with a
replica, for tests that fail over or migrate slots; made per module, as such a test leaves its
cluster changed.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator

import pytest

from django_redlock.localshards import LocalShardedNode
from django_redlock.wire import cluster_route
from django_redlock.wire.cluster import key_slot
from django_redlock.wire.nodes import parse_node


def brand_new(node: LocalShardedNode) -> LocalShardedNode:
    """``node``, started, with what this process learned of its members' addresses
    forgotten: a member's TCP port may be one an earlier test's plain node had. The
    transports do not need it (every connection asks its own server's mode), but the hint
    kept per address (``cluster_route.known``) does, for the tests that use it before any
    connection is made: a multi-lock's early refusal on a cluster this process never
    contacted reads it, and an earlier test's plain node at that port would say plain."""
    node.start()
    forget_learned(node)
    return node


def forget_learned(node: LocalShardedNode) -> None:
    """Forget what this process learned of ``node``'s members' addresses (see brand_new)."""
    for member in node.members:
        identity = parse_node(member.url).identity
        cluster_route._PLAIN.discard(identity)
        cluster_route._MAPS.pop(identity, None)


@pytest.fixture(scope="session")
def sharded3() -> Iterator[list[LocalShardedNode]]:
    """Three lock nodes, each a cluster of three shards (masters only)."""
    nodes: list[LocalShardedNode] = []
    try:
        for index in range(3):
            nodes.append(brand_new(LocalShardedNode(3, name=f"k{index}")))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalShardedNode]:
    """One cluster of three masters, each with a synced replica."""
    with LocalShardedNode(3, replicas=1, name="r", fresh=False) as node:
        forget_learned(node)
        yield node


@pytest.fixture
def migrating3() -> Iterator[list[LocalShardedNode]]:
    """Three lock nodes, each a cluster of three shards, for one test that moves slots."""
    nodes: list[LocalShardedNode] = []
    try:
        for index in range(3):
            nodes.append(brand_new(LocalShardedNode(3, name=f"g{index}")))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


_names = itertools.count()


@pytest.fixture
def unique() -> str:
    """A prefix for the lock names of one test: the session's clusters are shared, and their
    restart markers (declared fresh once) must survive between tests, so nothing is flushed."""
    return f"t{next(_names)}-{uuid.uuid4().hex[:8]}:"


def on_every_node(nodes: list[LocalShardedNode], key: str, timeout: float = 10.0) -> None:
    """Wait until ``key`` exists on its slot's master in every cluster of ``nodes``.

    An acquire returns at a quorum; the request to the last node may still be on its way
    (the first contact with a cluster node waits for the node's answer to whether it is one).
    A test that then moves the key's slot, or looks at every node, waits for it first: a poll
    with a deadline, failing loudly.
    """
    deadline = time.monotonic() + timeout
    for node in nodes:
        while True:
            with node.client(node.serving(key_slot(key))) as client:
                if client.exists(key):
                    break
            assert time.monotonic() < deadline, f"{key!r} not on {node} within {timeout} s"
            time.sleep(0.01)


def subscribed(nodes: list[LocalShardedNode], name: str, timeout: float = 5.0) -> None:
    """Wait until a waiter listens for releases of lock ``name`` on every cluster, on the
    channel in cluster form (the lock's tagged key, NUL, ``w``, its listener id), which is
    what the shards publish to: on the member each node's URL names, where the waiter's
    pub/sub connection is (classic pub/sub reaches every member)."""
    pattern = "{redlock:" + name + "}\x00w*"
    deadline = time.monotonic() + timeout
    for node in nodes:
        while True:
            with node.client(node.masters[0]) as client:
                if client.pubsub_channels(pattern):
                    break
            assert time.monotonic() < deadline, f"nobody listens for {name!r} on {node}"
            time.sleep(0.005)


def renewed_everywhere(
    nodes: list[LocalShardedNode], key: str, above_ms: int, timeout: float = 10.0
) -> None:
    """Wait until ``key`` has more than ``above_ms`` ms left on its slot's master in every
    cluster: a renewal returns at a quorum, the last node's may still be on its way."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        while True:
            with node.client(node.serving(key_slot(key))) as client:
                if client.pttl(key) > above_ms:
                    break
            assert time.monotonic() < deadline, f"{key!r} not renewed on {node} in {timeout} s"
            time.sleep(0.01)


def renewed_on(nodes: list[LocalShardedNode], key: str, above_ms: int) -> int:
    """On how many clusters ``key`` has more than ``above_ms`` ms left now."""
    count = 0
    for node in nodes:
        with node.client(node.serving(key_slot(key))) as client:
            count += int(client.pttl(key) > above_ms)
    return count


def gone_everywhere(nodes: list[LocalShardedNode], key: str, timeout: float = 10.0) -> None:
    """Wait until ``key`` is gone from its slot's master in every cluster: a release returns
    at a quorum, the last node's may still be on its way (following a MOVED or ASK)."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        while True:
            with node.client(node.serving(key_slot(key))) as client:
                if not client.exists(key):
                    break
            assert time.monotonic() < deadline, f"{key!r} still on {node} after {timeout} s"
            time.sleep(0.01)
