"""Real Redis/Valkey Clusters for the cluster tests: the bundled server (or
``$REDLOCK_SERVER_BIN``) with ``--cluster-enabled yes``, slots assigned by the fixture.

``sharded3``: three lock nodes, each a cluster of three masters, started once per session (each
cluster forms in a few seconds). ``sharded1``: one cluster of three masters, each with a
replica, for tests that fail over or migrate slots; made per module, as such a test leaves its
cluster changed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_redlock.localshards import LocalShardedNode


@pytest.fixture(scope="session")
def sharded3() -> Iterator[list[LocalShardedNode]]:
    """Three lock nodes, each a cluster of three shards (masters only)."""
    nodes: list[LocalShardedNode] = []
    try:
        for index in range(3):
            nodes.append(LocalShardedNode(3, name=f"k{index}", fresh=False).start())
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalShardedNode]:
    """One cluster of three masters, each with a synced replica."""
    with LocalShardedNode(3, replicas=1, name="r", fresh=False) as node:
        yield node
