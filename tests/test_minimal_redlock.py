"""The minimal Redlock of the benchmarks (``benchmarks/minimal_redlock.py``) is a floor only if
it is a correct Redlock: it holds at a quorum, refuses a held key, and frees only its own
token. Its speed is measured by ``python -m benchmarks``, never here."""

from __future__ import annotations

import time
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


def _freed_everywhere(cluster, key: bytes) -> bool:
    """A release returns at a quorum; the other nodes delete when their turn comes (no speed
    is asserted: the deadline only keeps a broken release from hanging the test)."""
    deadline = time.monotonic() + 10.0
    while any(_tokens(cluster, key)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
        # The acquire returned at a quorum: a node's SET may still be on its way (or lost to
        # the other's try there, which it then freed), so the claim is on the nodes that
        # held the token before the wrong release: each still does.
        before = _tokens(cluster5, held.key)
        assert before.count(held.token) >= 3
        assert not other.release(Held(held.key, b"not-the-token", 1.0))
        after = _tokens(cluster5, held.key)
        kept = zip(before, after, strict=True)
        assert all(now == held.token for was, now in kept if was == held.token)
        assert owner.release(held)
        assert _freed_everywhere(cluster5, held.key)


def test_its_release_falls_back_to_eval_when_a_node_lost_the_script(cluster5):
    with closing(MinimalRedlock(cluster5.urls)) as minimal:
        held = minimal.acquire("flushed", TTL_MS)
        assert held is not None
        for node in cluster5:
            with node_client(node) as client:
                client.script_flush()
        # A quorum answers NOSCRIPT, gets the script's body and deletes; a node whose NOSCRIPT
        # comes after the round returned is not sent it (no bookkeeping) and keeps the key
        # for its ttl, as the module's docstring says.
        assert minimal.release(held)
        assert _tokens(cluster5, held.key).count(None) >= minimal.quorum
