"""The minimal Redlock of the benchmarks (``benchmarks/minimal_redlock.py``) is a floor only if
it is a correct Redlock: it holds at a quorum, refuses a held key, and frees only its own
token. Its speed is measured by ``python -m benchmarks``, never here."""

from __future__ import annotations

from contextlib import closing

from benchmarks.minimal_redlock import Held, MinimalRedlock
from tests.helpers import node_client

TTL_MS = 10_000


def _tokens(cluster, key: bytes) -> list[bytes | None]:
    values = []
    for node in cluster:
        with node_client(node) as client:
            values.append(client.get(key))
    return values


def test_it_holds_at_a_quorum_and_not_below(cluster5):
    with closing(MinimalRedlock(cluster5.urls)) as minimal:  # it connects to every node now
        cluster5[3].pause()
        cluster5[4].pause()
        held = minimal.acquire("two-paused", TTL_MS)
        assert held is not None
        assert 0 < held.validity < TTL_MS / 1000
        assert _tokens(cluster5.nodes[:3], held.key) == [held.token] * 3
        assert minimal.release(held)
        cluster5[2].pause()  # 3 of 5 paused: no quorum, whatever the others say
        assert minimal.acquire("three-paused", TTL_MS) is None
        cluster5[2].resume()
        cluster5[3].resume()
        cluster5[4].resume()
        # The late answers of the paused nodes are read and dropped: the next round is judged
        # on its own replies.
        again = minimal.acquire("after", TTL_MS)
        assert again is not None
        assert minimal.release(again)


def test_it_refuses_a_held_key_and_leaves_nothing_behind(cluster5):
    for node in cluster5.nodes[:3]:
        with node_client(node) as client:
            client.set("held", "someone-else", px=TTL_MS)
    with closing(MinimalRedlock(cluster5.urls)) as minimal:
        assert minimal.acquire("held", TTL_MS) is None
    # The two nodes that granted were released again: no token of the failed try remains.
    assert _tokens(cluster5, b"held") == [b"someone-else"] * 3 + [None, None]


def test_it_releases_only_its_own_token(cluster5):
    with (
        closing(MinimalRedlock(cluster5.urls)) as owner,
        closing(MinimalRedlock(cluster5.urls)) as other,
    ):
        held = owner.acquire("mine", TTL_MS)
        assert held is not None
        assert other.acquire("mine", TTL_MS) is None
        assert not other.release(Held(held.key, b"not-the-token", 1.0))
        assert _tokens(cluster5, held.key) == [held.token] * 5
        for node in cluster5:  # the script is gone: the release falls back to EVAL
            with node_client(node) as client:
                client.script_flush()
        assert owner.release(held)
        assert _tokens(cluster5, held.key) == [None] * 5
